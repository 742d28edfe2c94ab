"""Link failover across hosts: a host's plane-A link taken down (``ip link set DEV down``) moves
the job's collectives to plane B in the same processes, and back once plane A is up again.

Two hosts (network namespaces, tests/e2e/netns_hosts.py), each with a veth on plane A and one
on plane B; the control plane (``unbroken serve``) listens on the root namespace's plane-B
address, so the hosts' agents and the rendezvous store are reached over plane B, and each
host's agent declares ``--plane a=pa0 --plane b=pb0``: the ranks' gloo collectives start on
plane A. Host 1's plane-A connections reset with every carrier up (a failed collective: the
plane's fault) and its plane-A link taken down each move the job to plane B; an operator's
``unbroken link switchback`` and the automatic switchback bring it back.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from tests.support.cli_runs import (
    FIXTURES,
    RUN_TIMEOUT_S,
    Reference,
    cli_env,
    digest,
    events,
    of_kind,
    start_job,
    status,
    unbroken,
    wait_for,
    write_job,
)
from tests.support.netns_hosts import PLANE_IFNAMES, Hosts, hosts
from tests.support.process_helpers import started_ranks

from unbroken.cli.nethosts import unavailable

pytestmark = pytest.mark.e2e

JOB = FIXTURES / "plane-failover.yaml"


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


def _reset_plane_links(h: Hosts, i: int, plane: int) -> None:
    """The kernel destroys host i's TCP connections on ``plane`` (``ss -K``): the collectives
    fail as on a link broken along the path, while every interface keeps its carrier."""
    src = h.address(i, plane)
    argv = ["ss", "-K", "-H", "-t", "-4", "state", "established", "src", src]
    done = subprocess.run(h.argv(i, argv), capture_output=True, text=True, timeout=10)
    assert done.returncode == 0 and done.stdout.strip(), (done.stdout, done.stderr)


@dataclass
class Served:
    """``unbroken serve`` on the root namespace's plane-B address, and the two hosts' agents
    joined to it, each declaring planes a and b."""

    serve: subprocess.Popen[str]
    lines: list[str]
    agents: list[subprocess.Popen[str]]

    def said(self, text: str, times: int = 1) -> bool:
        return sum(text in line for line in list(self.lines)) >= times

    def finish(self) -> str:
        """Wait for the run's end; its standard output (it must have exited 0)."""
        self.serve.wait(timeout=RUN_TIMEOUT_S)
        err = self.serve.stderr.read() if self.serve.stderr else ""
        out = "".join(self.lines)
        assert self.serve.returncode == 0, (out, err)
        for a in self.agents:
            a.wait(timeout=30)
            assert a.returncode == 0, a.communicate()
        return out


@contextlib.contextmanager
def served(h: Hosts, tmp_path: Path, run_dir: Path, job: Path) -> Iterator[Served]:
    token = tmp_path / "token"
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text("nodes: 2\ndevicesPerNode: 2\n")
    control = f"{h.root_address(1)}:{_free_port()}"
    argv = [sys.executable, "-m", "unbroken", "serve", str(job), "--cluster", str(cluster)]
    argv += ["--listen", control, "--token-file", str(token), "--run-dir", str(run_dir)]
    serve = subprocess.Popen(
        argv, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path
    )
    run = Served(serve, [], [])
    assert serve.stdout is not None
    reader = threading.Thread(target=lambda: run.lines.extend(serve.stdout or ()), daemon=True)
    reader.start()
    try:
        wait_for(lambda: (run_dir / "control.json").exists(), "the control plane", 60.0)
        run.agents.extend(_join(h, i, control, token) for i in range(2))
        ckpt = run_dir / "checkpoints"
        wait_for(lambda: ckpt.is_dir() and any(ckpt.iterdir()), "a checkpoint", 120.0)
        yield run
    finally:
        for proc in (serve, *run.agents):
            if proc.poll() is None:
                proc.kill()
        serve.wait()
        reader.join(timeout=10)
        for a in run.agents:
            a.communicate()
        for i in range(2):
            _kill_host(h, i)


def test_a_failed_plane_fails_over_and_switches_back_without_restarting_a_process(
    tmp_path: Path, run_dir: Path, fault_free: Reference
) -> None:
    with hosts(2, planes=2) as h, served(h, tmp_path, run_dir, JOB) as run:
        said = run.said
        # 1. Host 1's links on plane A are reset with every carrier up: the failed
        # collective is the plane's, the job fails over to B and holds plane A suspect.
        _reset_plane_links(h, 1, plane=0)
        wait_for(lambda: said("failover to plane b done"), "the first failover", 60.0)
        # 2. An operator sends the job back to plane A.
        res = unbroken("link", "switchback", "--run", run_dir)
        assert res.rc == 0 and "plane a active: step" in res.stdout, res.explain()
        # 3. Host 1's plane-A link down: failover to B. While it is down, a switchback is
        # refused, saying why; training goes on over plane B.
        h.set_link(1, up=False, plane=0)
        wait_for(lambda: said("failover to plane b done", 2), "the second failover", 60.0)
        res = unbroken("link", "switchback", "--run", run_dir)
        assert res.rc == 1, res.explain()
        assert res.stderr == "unbroken link switchback: plane a is down on node-1\n"
        # 4. Plane A up again: the automatic switchback after 5 s up on every node.
        h.set_link(1, up=True, plane=0)
        wait_for(lambda: said("switchback to plane a done", 2), "the switchback", 60.0)
        out = run.finish()
    assert "job e2e-planes: SUCCEEDED" in out, out
    # The failed collective is a fault, recovered by the failover; a plane down is not.
    assert "1 fault(s), 1 recovery(ies)" in out, out
    evs = events(run_dir)
    [on_fault, failover] = of_kind(evs, "PlaneFailover")
    [by_hand, back] = of_kind(evs, "PlaneSwitchback")
    switches = [
        (e["from_plane"], e["to"], e["planned"]) for e in (on_fault, by_hand, failover, back)
    ]
    assert switches == [("a", "b", False), ("b", "a", True)] * 2
    assert on_fault["reason"].startswith("a collective failed on plane a ("), on_fault
    assert by_hand["reason"] == "operator command: switch to plane a", by_hand
    assert failover["reason"] == "plane a down on node-1: failover to plane b", failover
    assert back["reason"].startswith("plane a up on every node for "), back
    [fault] = of_kind(evs, "FaultDetected")
    assert fault["source"] == "link", fault
    [done] = of_kind(evs, "RecoveryCompleted")
    assert (done["fault_id"], done["strategy"]) == (fault["fault_id"], "link-failover")
    pauses = [e["pause_s"] for e in (on_fault, by_hand, failover, back)]
    assert all(0 < p < 30 for p in pauses), pauses
    # A step committed over plane B while host 1's plane A was down.
    [down] = of_kind(evs, "PlaneChanged", node="node-1", plane="a", up=False)
    [_, up] = of_kind(evs, "PlaneChanged", node="node-1", plane="a", up=True)
    assert down["at"] < failover["at"] < up["at"] < back["at"]
    # Every rank's process was started once: every switch regrouped in process.
    assert started_ranks(evs) == [0, 1, 2, 3]
    st = status(run_dir)
    assert st is not None
    planes = {k: st["planes"][k] for k in ("active", "failovers", "switchbacks", "down")}
    assert planes == {"active": "a", "failovers": 2, "switchbacks": 2, "down": []}
    assert digest(run_dir) == fault_free.digest


def test_the_seeds_pytorch_configuration_turns_link_failover_on(
    tmp_path: Path, run_dir: Path, fault_free: Reference
) -> None:
    """The same job configured as the seed's PyTorch scenario ("suspension and switchback for
    link failover communication": ``retry`` and ``HCCL_OP_RETRY_ENABLE="L0:0, L1:1, L2:1"``,
    no ``MS_ENABLE_TFT``): host 1's plane-A link down moves the job to plane B, and it comes
    back by itself once the link is up, every process kept."""
    job = write_job(
        tmp_path / "job.yaml",
        job=JOB,
        replace={
            'recover-strategy: "retry,recover"': 'recover-strategy: "retry"',
            '- name: MS_ENABLE_TFT\n                  value: "{TSP:1}"': (
                '- name: HCCL_OP_RETRY_ENABLE\n                  value: "L0:0, L1:1, L2:1"'
            ),
        },
    )
    with hosts(2, planes=2) as h, served(h, tmp_path, run_dir, job) as run:
        assert run.said("link failover on"), run.lines
        h.set_link(1, up=False, plane=0)
        wait_for(lambda: run.said("failover to plane b done"), "the failover", 60.0)
        h.set_link(1, up=True, plane=0)
        wait_for(lambda: run.said("switchback to plane a done"), "the switchback", 60.0)
        out = run.finish()
    assert "job e2e-planes: SUCCEEDED" in out, out
    evs = events(run_dir)
    [failover] = of_kind(evs, "PlaneFailover")
    assert failover["reason"] == "plane a down on node-1: failover to plane b", failover
    [back] = of_kind(evs, "PlaneSwitchback")
    assert back["reason"].startswith("plane a up on every node for "), back
    assert started_ranks(evs) == [0, 1, 2, 3]
    assert digest(run_dir) == fault_free.digest


def test_a_slow_plane_is_sub_healthy_and_left_without_a_fault(
    tmp_path: Path, run_dir: Path, fault_free: Reference
) -> None:
    """Host 1's plane-A link slowed to 8 Mbit/s (``tc`` token bucket; its carrier stays up):
    the gradients' communication takes many times its time on plane A, the plane is recorded
    sub-healthy, and the job moves to plane B at a step boundary, every process kept and no
    fault for the ladder; plane A is held slow (no switchback by itself) until an operator
    switches back."""
    with hosts(2, planes=2) as h, served(h, tmp_path, run_dir, JOB) as run:
        h.set_rate(1, "8mbit", plane=0)
        wait_for(lambda: run.said("failover to plane b done"), "the move off plane a", 90.0)
        h.set_rate(1, None, plane=0)
        assert not run.said("switchback to plane a"), run.lines
        res = unbroken("link", "switchback", "--run", run_dir)
        assert res.rc == 0 and "plane a active: step" in res.stdout, res.explain()
        out = run.finish()
    assert "job e2e-planes: SUCCEEDED" in out, out
    assert "0 fault(s), 0 recovery(ies)" in out, out
    evs = events(run_dir)
    [slow] = of_kind(evs, "PlaneSubHealthy")
    assert slow["plane"] == "a" and slow["comm_s"] > 3 * slow["baseline_s"], slow
    [moved] = of_kind(evs, "PlaneFailover")
    assert (moved["from_plane"], moved["to"], moved["planned"]) == ("a", "b", True), moved
    assert "plane a slow" in moved["reason"] and "(sub-health)" in moved["reason"], moved
    [back] = of_kind(evs, "PlaneSwitchback")
    assert back["reason"] == "operator command: switch to plane a", back
    assert started_ranks(evs) == [0, 1, 2, 3]
    assert digest(run_dir) == fault_free.digest


def test_planes_in_the_cluster_yaml_under_unbroken_run(
    tmp_path: Path, run_dir: Path, fault_free: Reference
) -> None:
    """``planes: [a, b]`` in the cluster YAML: ``unbroken run`` makes each node a network
    namespace with a link on each plane (root), names the links, and the job fails over when
    node-1's plane-A link goes down and switches back once it is up; every namespace and link
    it made is gone after the run."""
    if unavailable():
        pytest.skip(unavailable())
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text("nodes: 3\ndevicesPerNode: 2\nplanes: [a, b]\n")
    running = start_job(run_dir, tmp_path / "logs", "--cluster", cluster, job=JOB)
    try:

        def said(text: str) -> bool:
            assert running.proc.poll() is None, "the job ended first: " + str(running.output())
            return text in running.output()[0]

        wait_for(lambda: said("step 20/60"), "step 20", 120.0)
        found = re.search(r"node-1: a (\S+),", running.output()[0])
        assert found is not None, running.output()
        link = found.group(1)
        subprocess.run(["ip", "link", "set", link, "down"], check=True)
        wait_for(lambda: said("failover to plane b done"), "the failover", 60.0)
        subprocess.run(["ip", "link", "set", link, "up"], check=True)
        wait_for(lambda: said("switchback to plane a done"), "the switchback", 60.0)
        done = running.wait()
    finally:
        running.stop()
    assert done.rc == 0, done.explain()
    assert "job e2e-planes: SUCCEEDED" in done.stdout, done.explain()
    evs = events(run_dir)
    [failover] = of_kind(evs, "PlaneFailover")
    assert failover["reason"] == "plane a down on node-1: failover to plane b", failover
    [back] = of_kind(evs, "PlaneSwitchback")
    assert back["reason"].startswith("plane a up on every node for "), back
    assert started_ranks(evs) == [0, 1, 2, 3]
    assert digest(run_dir) == fault_free.digest
    tag = f"ub{running.proc.pid}"
    left = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    spaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert tag not in left and tag not in spaces, (left, spaces)
