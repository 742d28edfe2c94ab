"""Link failover across hosts: a host's plane-A link taken down (``ip link set DEV down``) moves
the job's collectives to plane B in the same processes, and back once plane A is up again.

Two hosts (network namespaces, tests/e2e/netns_hosts.py), each with a veth on plane A and one
on plane B; the control plane (``unbroken serve``) listens on the root namespace's plane-B
address, so the hosts' agents and the rendezvous store are reached over plane B, and each
host's agent declares ``--plane a=pa0 --plane b=pb0``: the ranks' gloo collectives start on
plane A. An operator then moves the job to plane B and back (``unbroken link failover``,
``unbroken link switchback``), and a collective that fails with every carrier up (rank 2's
links reset before its step 55) moves it to plane B for good.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from cli_runs import (
    FIXTURES,
    RUN_TIMEOUT_S,
    Reference,
    cli_env,
    digest,
    events,
    of_kind,
    status,
    unbroken,
    wait_for,
)
from netns_hosts import PLANE_IFNAMES, Hosts, hosts
from process_helpers import started_ranks

pytestmark = pytest.mark.e2e

JOB = FIXTURES / "plane-failover.yaml"
LATE_LINK = FIXTURES / "chaos-link-late.yaml"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _kill_host(h: Hosts, i: int) -> None:
    pids = subprocess.run(["ip", "netns", "pids", h.ns(i)], capture_output=True, text=True)
    for pid in pids.stdout.split():
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)


def _join(h: Hosts, i: int, control: str, token: Path) -> subprocess.Popen[str]:
    a, b = PLANE_IFNAMES
    argv = [sys.executable, "-m", "unbroken", "launch", "--join", control]
    argv += ["--token-file", str(token), "--node", f"node-{i}"]
    argv += ["--plane", f"a={a}", "--plane", f"b={b}"]
    return subprocess.Popen(
        h.argv(i, argv), env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def test_a_downed_plane_fails_over_and_switches_back_without_restarting_a_process(
    tmp_path: Path, run_dir: Path, fault_free: Reference
) -> None:
    token = tmp_path / "token"
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text("nodes: 2\ndevicesPerNode: 2\n")
    with hosts(2, planes=2) as h:
        control = f"{h.root_address(1)}:{_free_port()}"
        argv = [sys.executable, "-m", "unbroken", "serve", str(JOB), "--cluster", str(cluster)]
        argv += ["--listen", control, "--token-file", str(token), "--run-dir", str(run_dir)]
        argv += ["--chaos", str(LATE_LINK)]
        serve = subprocess.Popen(
            argv,
            env=cli_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=tmp_path,
        )
        lines: list[str] = []
        assert serve.stdout is not None
        reader = threading.Thread(target=lambda: lines.extend(serve.stdout or ()), daemon=True)
        reader.start()

        def said(text: str) -> bool:
            return any(text in line for line in list(lines))

        agents: list[subprocess.Popen[str]] = []
        try:
            wait_for(lambda: (run_dir / "control.json").exists(), "the control plane", 60.0)
            agents = [_join(h, i, control, token) for i in range(2)]
            ckpt = run_dir / "checkpoints"
            wait_for(lambda: ckpt.is_dir() and any(ckpt.iterdir()), "a checkpoint", 120.0)
            h.set_link(1, up=False, plane=0)  # host 1's plane A: its collectives stop there
            wait_for(lambda: said("failover to plane b done"), "the failover", 60.0)
            time.sleep(3.0)  # training goes on over plane B while A stays down
            h.set_link(1, up=True, plane=0)
            wait_for(lambda: said("switchback to plane a done"), "the switchback", 60.0)
            # An operator moves the job to plane B (pinned there), then back.
            res = unbroken("link", "failover", "--plane", "b", "--run", run_dir)
            assert res.rc == 0 and "plane b active: step" in res.stdout, res.explain()
            res = unbroken("link", "switchback", "--run", run_dir)
            assert res.rc == 0 and "plane a active: step" in res.stdout, res.explain()
            res = unbroken("link", "switchback", "--run", run_dir)
            assert res.rc == 1, res.explain()
            assert res.stderr == "unbroken link switchback: plane a is already active\n"
            serve.wait(timeout=RUN_TIMEOUT_S)
            reader.join(timeout=10)
            err = serve.stderr.read() if serve.stderr else ""
            out = "".join(lines)
            assert serve.returncode == 0, (out, err)
            assert "job e2e-planes: SUCCEEDED" in out, out
            # A plane lost is no fault; the collective that failed is one, recovered by failover.
            assert "1 fault(s), 1 recovery(ies)" in out, out
            for a in agents:
                a.wait(timeout=30)
                assert a.returncode == 0, a.communicate()

            evs = events(run_dir)
            [down] = of_kind(evs, "PlaneChanged", node="node-1", plane="a", up=False)
            [_, up] = of_kind(evs, "PlaneChanged", node="node-1", plane="a", up=True)
            [failover, by_hand, on_fault] = of_kind(evs, "PlaneFailover")
            [back, by_hand_back] = of_kind(evs, "PlaneSwitchback")
            switches = [
                (e["from_plane"], e["to"], e["planned"])
                for e in (failover, back, by_hand, by_hand_back)
            ]
            # The failover, the automatic switchback, the operator's failover and switchback.
            expected = [("a", "b", False), ("b", "a", True), ("a", "b", True), ("b", "a", True)]
            assert switches == expected
            # The failed collective's plane is suspect: the job ends on B.
            assert [on_fault[k] for k in ("from_plane", "to", "planned")] == ["a", "b", False]
            assert on_fault["reason"].startswith("a collective failed on plane a ("), on_fault
            [fault] = of_kind(evs, "FaultDetected")
            assert (fault["source"], fault["step"]) == ("link", 55), fault
            [done] = of_kind(evs, "RecoveryCompleted")
            assert (done["fault_id"], done["strategy"]) == (fault["fault_id"], "link-failover")
            assert 0 < failover["pause_s"] < 30 and 0 < back["pause_s"] < 30, (failover, back)
            assert back["generation"] == failover["generation"] + 1
            # A step committed over plane B while host 1's plane A was down.
            assert down["at"] < failover["at"] < up["at"] < back["at"]
            # Every rank's process was started once: both switches regrouped in process.
            assert started_ranks(evs) == [0, 1, 2, 3]
            st = status(run_dir)
            assert st is not None
            planes = {k: st["planes"][k] for k in ("active", "failovers", "switchbacks", "down")}
            assert planes == {"active": "b", "failovers": 3, "switchbacks": 2, "down": []}
            assert digest(run_dir) == fault_free.digest
        finally:
            for p in (serve, *agents):
                if p.poll() is None:
                    p.kill()
            serve.wait()
            for a in agents:
                a.communicate()
            for i in range(2):
                _kill_host(h, i)
