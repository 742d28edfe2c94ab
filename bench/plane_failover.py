"""Link failover and switchback between network planes: how long training stands still.

Two hosts (network namespaces, each with a veth on plane A and one on plane B; root needed), the
control plane (``unbroken serve``) on the root namespace's plane-B address, each host's agent
declaring ``--plane a=pa0 --plane b=pb0``; the job is ``examples/train_mlp.py``, 2 pods x 2 ranks
(tests/fixtures/e2e/plane-failover.yaml with more steps). Each round resets host 1's plane-A
connections with every carrier up (``ss -K``: a failed collective, failed over to plane B as
the plane's fault), switches back with ``unbroken link switchback``, then takes host 1's
plane-A link down (``ip link set DEV down``) until the failover to plane B committed a step,
brings it up again, and waits for the automatic switchback (5 s of plane A up on every node).
The figures are the ledger's: ``PlaneFailover.pause_s`` and ``PlaneSwitchback.pause_s`` (from
the pause to the first step committed on the new plane), the failed collective's MTTR
(``RecoveryCompleted``), and the detection (the link down to the agent's report). Prints a
table and the load average before and after.

    OMP_NUM_THREADS=1 .venv/bin/python bench/plane_failover.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "src"), str(REPO)]

from tests.support.netns_hosts import PLANE_IFNAMES, Hosts, unavailable  # noqa: E402

from unbroken.ledger import Ledger  # noqa: E402

JOB = REPO / "tests" / "fixtures" / "e2e" / "plane-failover.yaml"


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UNBROKEN_", "MASTER_"))}
    env["PYTHONPATH"] = str(REPO / "src")
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(predicate: Callable[[], object], what: str, deadline_s: float) -> None:
    end = time.monotonic() + deadline_s
    while not predicate():
        if time.monotonic() > end:
            raise SystemExit(f"plane_failover: {what} not seen within {deadline_s:.0f} s")
        time.sleep(0.1)


def _kinds(run_dir: Path, kind: str) -> list[dict[str, Any]]:
    ledger = Ledger(run_dir / "ledger.db", create=False)
    try:
        return [{**r.data, "at": r.at} for r in ledger.events(kinds=[kind])]
    finally:
        ledger.close()


def _more(run_dir: Path, kind: str, n: int) -> Callable[[], bool]:
    """Whether the ledger holds more than ``n`` events of ``kind``."""
    return lambda: len(_kinds(run_dir, kind)) > n


def _pauses(evs: list[dict[str, Any]]) -> list[float]:
    return [float(e["pause_s"]) for e in evs]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--step-sleep", type=float, default=0.1)
    args = ap.parse_args()
    why = unavailable()
    if why:
        print(f"plane_failover: {why}", file=sys.stderr)
        return 1
    load_before = Path("/proc/loadavg").read_text().split()[:3]
    work = Path(tempfile.mkdtemp(prefix="plane-bench-"))
    steps = 60 + args.rounds * 250  # enough steps for every round at any load
    text = JOB.read_text().replace("--steps=60", f"--steps={steps}")
    text = re.sub(r"--step-sleep=[0-9.]+", f"--step-sleep={args.step_sleep}", text)
    text = text.replace("../../../examples/", f"{REPO}/examples/")
    job = work / "job.yaml"
    job.write_text(text)
    (work / "cluster.yaml").write_text("nodes: 2\ndevicesPerNode: 2\n")
    run_dir, token = work / "run", work / "token"
    h = Hosts(2, planes=2, tag=f"ub{os.getpid()}")
    procs: list[subprocess.Popen[bytes]] = []
    try:
        h.create()
        control = f"{h.root_address(1)}:{_free_port()}"
        serve = [sys.executable, "-m", "unbroken", "serve", str(job)]
        serve += ["--cluster", str(work / "cluster.yaml"), "--listen", control]
        serve += ["--token-file", str(token), "--run-dir", str(run_dir), "--quiet"]
        log = open(work / "serve.log", "wb")  # noqa: SIM115 - the run's log, until the exit
        procs.append(subprocess.Popen(serve, env=_env(), stdout=log, stderr=log, cwd=work))
        _wait(lambda: (run_dir / "control.json").exists(), "the control plane", 60)
        a, b = PLANE_IFNAMES
        for i in range(2):
            argv = [sys.executable, "-m", "unbroken", "launch", "--join", control]
            argv += ["--credentials", str(run_dir / "hosts" / f"node-{i}.json")]
            argv += ["--plane", f"a={a}", "--plane", f"b={b}"]
            procs.append(subprocess.Popen(h.argv(i, argv), env=_env(), stdout=log, stderr=log))
        _wait(lambda: _kinds(run_dir, "FirstStepCommitted"), "the first step", 180)
        downs: list[float] = []
        for r in range(args.rounds):
            time.sleep(2.0)  # training on plane A between rounds
            # Host 1's plane-A connections reset, carriers up: a failed collective.
            reset = ["ss", "-K", "-H", "-t", "-4", "state", "established"]
            cut = h.argv(1, [*reset, "src", h.address(1, 0)])
            subprocess.run(cut, check=True, capture_output=True, timeout=10)
            _wait(_more(run_dir, "PlaneFailover", 2 * r), "a failover", 60)
            back_cmd = [sys.executable, "-m", "unbroken", "link", "switchback"]
            back_cmd += ["--run", str(run_dir)]
            done = subprocess.run(back_cmd, env=_env(), capture_output=True, text=True)
            if done.returncode != 0:
                raise SystemExit(f"plane_failover: link switchback: {done.stderr.strip()!r}")
            time.sleep(2.0)
            h.set_link(1, up=False, plane=0)  # host 1's plane-A link down
            downs.append(time.time())
            _wait(_more(run_dir, "PlaneFailover", 2 * r + 1), "a failover", 60)
            h.set_link(1, up=True, plane=0)
            _wait(_more(run_dir, "PlaneSwitchback", 2 * r + 1), "a switchback", 60)
        procs[0].wait(timeout=600)
        fail = _kinds(run_dir, "PlaneFailover")
        back = _kinds(run_dir, "PlaneSwitchback")
        mttr = [float(e["phases_s"]["mttr"]) for e in _kinds(run_dir, "RecoveryCompleted")]
        seen = [e for e in _kinds(run_dir, "PlaneChanged") if not e["up"]]
        detect = [float(e["changed_at"]) - t for e, t in zip(seen, downs, strict=False)]
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
                p.wait()
        for i in range(2):
            pids = subprocess.run(["ip", "netns", "pids", h.ns(i)], capture_output=True, text=True)
            for pid in pids.stdout.split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
        h.close()
        shutil.rmtree(work, ignore_errors=True)
    load_after = Path("/proc/loadavg").read_text().split()[:3]

    def row(name: str, values: list[float]) -> str:
        cells = " ".join(f"{v:.2f}" for v in values)
        return f"| {name} | {cells} | {statistics.median(values):.2f} |"

    print(f"| phase (s) | rounds 1..{args.rounds} | median |")
    print("|---|---|---|")
    print(row("collective failed (links reset, carriers up): MTTR", mttr))
    print(row("... its failover pause (stop, regroup on B, redo, commit)", _pauses(fail[::2])))
    print(row("operator's switchback pause (`unbroken link switchback`)", _pauses(back[::2])))
    print(row("plane A link down -> the agent's report", detect))
    print(row("... failover pause (cut, stop, regroup on B, first step)", _pauses(fail[1::2])))
    print(row("automatic switchback pause (5 s up, at a step boundary)", _pauses(back[1::2])))
    print(f"\nload average before {' '.join(load_before)}, after {' '.join(load_after)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
