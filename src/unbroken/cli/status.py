"""``unbroken status [RUN]``: what is running (or what ran), from the run's ledger; a run whose
control plane is gone (stopped, killed) is said to be stopped, whatever phase it last recorded."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from unbroken.cli.link import planes_line, planes_summary
from unbroken.cli.rundir import RunDirError, find_run, is_live
from unbroken.ledger import (
    DeviceIsolated,
    DeviceReturned,
    Ledger,
    LedgerError,
    NodeDeprioritised,
    Record,
    StressTested,
    StressTestFinished,
    goodput,
    goodput_line,
)
from unbroken.ledger.store import encode_status


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("status", help="the state of a run (default: the newest under ./runs)")
    p.add_argument("run", type=Path, nargs="?", default=None, help="a run directory")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def run(args: argparse.Namespace) -> int:
    try:
        run_dir = find_run(args.run)
        ledger = Ledger(run_dir / "ledger.db", create=False)
    except (RunDirError, LedgerError) as exc:
        print(f"unbroken status: {exc}", file=sys.stderr)
        return 1
    st = ledger.status()
    records = ledger.events()
    ledger.close()
    if st is None:
        print(f"unbroken status: {run_dir}: the job has not started yet", file=sys.stderr)
        return 1
    # The ledger keeps the last phase the control plane wrote; a control plane that was killed
    # or stopped wrote no end, so an unfinished phase is only true while the run is live.
    live = is_live(run_dir)
    # A live run's wall time runs to now; a stopped one's ends at its last record.
    gp = goodput(records, now=time.time() if live and not st.phase.finished else None)
    if args.json:
        data = encode_status(st)
        data["control_plane"] = "running" if live else "stopped"
        data["goodput"] = gp.to_json()
        data["stress_tests"] = [r.data for r in records if r.kind == StressTestFinished.kind]
        data["pool"] = pool(records)
        data["planes"] = planes_summary(records)
        print(json.dumps(data, indent=2))
        return 0
    total = f"/{st.total_steps}" if st.total_steps else ""
    age = time.time() - st.updated_at
    phase = f"{st.phase}" + (f" ({st.message})" if st.message else "")
    if not live and not st.phase.finished:
        phase = f"stopped (control plane not running; last recorded: {phase})"
    print(f"run:         {run_dir}")
    print(f"job:         {st.job}")
    print(f"phase:       {phase}")
    print(f"step:        {st.step}{total}   generation {st.generation}")
    print(f"faults:      {st.faults}   recoveries {st.recoveries}")
    print(f"goodput:     {goodput_line(gp)}")
    stress = _stress_line(records)
    if stress:
        print(f"stress:      {stress}")
    planes = planes_summary(records)
    if planes is not None:
        print(f"planes:      {planes_line(planes)}")
    for line in pool_lines(pool(records)):
        print(f"pool:        {line}")
    print(f"updated:     {age:.1f} s ago")
    for pod in st.pods:
        ranks = ", ".join(f"{r}:{p}" for r, p in zip(pod.ranks, pod.pids, strict=True))
        print(
            f"  pod {pod.name:<24} node {pod.node or '-':<8} devices {list(pod.devices)}  "
            f"ranks(pid) {ranks or '-'}"
        )
    return 0


def _stress_line(records: list[Record]) -> str:
    """The online stress tests of the run: how many, how long training stood still for them,
    and the last one's code."""
    done = [r.data for r in records if r.kind == StressTestFinished.kind]
    tested = [r.data for r in records if r.kind == StressTested.kind]
    if not tested:
        return ""
    paused = sum(float(d["paused_s"]) for d in done)
    last = tested[-1]
    line = (
        f"{len(tested)} test(s), training paused {paused:.2f} s; last: test {last['round']} "
        f"at step {last['step']}, code {last['code']}"
    )
    if last["faulty"]:
        line += f", fault found on rank(s) {', '.join(map(str, last['faulty']))}"
    if len(done) < len(tested):
        line += " (training not resumed yet)"
    return line


def pool(records: list[Record]) -> dict[str, dict[str, str]]:
    """What the ledger says about the scheduler's pool beyond plain health: the nodes placed
    on last (``placed_last``: node -> reason) and the devices held out of it until an operator
    releases them (``held``: ``"node/device"`` -> reason; ``ManuallySeparate``)."""
    placed_last: dict[str, str] = {}
    held: dict[str, str] = {}
    for r in records:
        if r.kind == NodeDeprioritised.kind:
            placed_last.setdefault(str(r.data["node"]), str(r.data["reason"]))
        elif r.kind in (DeviceIsolated.kind, DeviceReturned.kind):
            key = f"{r.data['node']}/{r.data['device']}"
            reason = str(r.data["reason"])
            if r.kind == DeviceIsolated.kind and reason.startswith("ManuallySeparate"):
                held[key] = reason
            elif r.kind == DeviceReturned.kind:
                held.pop(key, None)
    return {"placed_last": placed_last, "held": held}


def pool_lines(state: dict[str, dict[str, str]]) -> list[str]:
    """One line per node or device ``pool`` names, for the text output."""
    lines = [
        f"node {node} placed on last ({reason})"
        for node, reason in sorted(state["placed_last"].items())
    ]
    for key, reason in sorted(state["held"].items()):
        node, device = key.rsplit("/", 1)
        lines.append(f"device {device} of {node} out of the pool ({reason})")
    return lines
