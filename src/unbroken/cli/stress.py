"""``unbroken stress-test``: an online stress test of a running job, through its control plane.

Every rank stops at its next step boundary, checks its device (a fixed-seed matrix product's
checksum against the one it computed at its start) and its links (GB/s between paired ranks),
and training resumes; a fault found goes to the recovery ladder first. The command waits for
the verdict and for training to resume, and prints both from the run's ledger (the seed's
result codes: 0 no fault, 1 failed but training can resume, 2 fault found: isolate, 3 timed
out). Exit code 0 when every code is 0, 1 otherwise or when the test could not run.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from unbroken.cli.control import call_run
from unbroken.cli.ledgerwait import wait_for_record
from unbroken.cli.rundir import RunDirError, find_run
from unbroken.ledger import Ledger, LedgerError, Record


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "stress-test", help="pause a running job, check its devices and links, resume"
    )
    p.add_argument("--run", type=Path, default=None, help="run directory (default: newest)")
    p.add_argument(
        "--timeout", type=float, default=120.0, help="seconds to wait for training to resume"
    )


def run(args: argparse.Namespace) -> int:
    try:
        run_dir = find_run(args.run)
    except RunDirError as exc:
        print(f"unbroken stress-test: {exc}", file=sys.stderr)
        return 1
    reply = call_run("stress-test", run_dir, "StressTest", {})
    if reply is None:
        return 1
    print(reply.get("detail", "stress test requested"), flush=True)
    return _follow(run_dir, int(reply["round"]), args.timeout)


def _follow(run_dir: Path, round_: int, timeout_s: float) -> int:
    """Print the test's verdict and the pause once the ledger has them."""
    try:
        ledger = Ledger(run_dir / "ledger.db", create=False)
    except LedgerError as exc:
        print(f"unbroken stress-test: {exc}", file=sys.stderr)
        return 1
    verdict_seen = False

    def on_record(rec: Record) -> int | None:
        nonlocal verdict_seen
        if rec.data.get("round") != round_:
            return None
        if rec.kind == "StressTested":
            verdict_seen = True
            _print_verdict(rec.data)
            return None
        _print_finished(rec.data)
        return 0 if rec.data["code"] == 0 else 1

    try:
        code = wait_for_record(
            ledger, "stress-test", ["StressTested", "StressTestFinished"], on_record, timeout_s
        )
    finally:
        ledger.close()
    if code is not None:
        return code
    what = "training to resume" if verdict_seen else "the verdict"
    print(f"unbroken stress-test: no {what} within {timeout_s:.0f} s", file=sys.stderr)
    return 1


def _print_verdict(t: dict[str, Any]) -> None:
    print(
        f"stress test {t['round']} at step {t['step']}: code {t['code']}; ranks stopped in "
        f"{t['stop_s']:.2f} s, tested in {t['test_s']:.2f} s"
    )
    print(f"  {'rank':>4}  {'node':<8} {'device':>6}  aic  p2p  checksum          why")
    for r in t["ranks"]:
        device = "-" if r["device"] is None else str(r["device"])
        print(
            f"  {r['rank']:>4}  {r['node']:<8} {device:>6}  {r['device_code']:>3}  "
            f"{r['link_code']:>3}  {r['checksum'] or '-':<16}  {r['reason']}".rstrip()
        )
    for link in t["links"]:
        print(
            f"  link {link['a']}-{link['b']}: {link['gbps']:6.2f} GB/s  code {link['code']}"
            + (f"  {link['reason']}" if link["reason"] else "")
        )
    print(f"  median link: {t['median_gbps']:.2f} GB/s", flush=True)
    if t["faulty"]:
        ranks = ", ".join(map(str, t["faulty"]))
        print(f"  fault found on rank(s) {ranks}: handed to the recovery ladder", flush=True)


def _print_finished(f: dict[str, Any]) -> None:
    how = "recovery" if f["recovered"] else "rejoin"
    print(
        f"training resumed: step {f['step']} committed by generation {f['generation']}; "
        f"paused {f['paused_s']:.2f} s (stop {f['stop_s']:.2f} s, test {f['test_s']:.2f} s, "
        f"{how} {f['resume_s']:.2f} s)"
    )
