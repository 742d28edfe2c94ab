"""``unbroken report [RUN] [--out FILE]``: one self-contained HTML page of a run (goodput,
incidents and their phases, committed step over time, step time per rank)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from unbroken.cli.rundir import RunDirError, find_run, is_live
from unbroken.ledger import Ledger, LedgerError
from unbroken.report import render


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("report", help="an HTML report of a run (default: the newest under ./runs)")
    p.add_argument("run", type=Path, nargs="?", default=None, help="a run directory")
    p.add_argument("--out", type=Path, default=None, help="default: RUN/report.html")


def run(args: argparse.Namespace) -> int:
    try:
        run_dir = find_run(args.run)
        ledger = Ledger(run_dir / "ledger.db", create=False)
    except (RunDirError, LedgerError) as exc:
        print(f"unbroken report: {exc}", file=sys.stderr)
        return 1
    try:
        records = ledger.events()
        status = ledger.status()
    except LedgerError as exc:
        print(f"unbroken report: {exc}", file=sys.stderr)
        return 1
    finally:
        ledger.close()
    live = status is not None and not status.phase.finished and is_live(run_dir)
    page = render(records, status, now=time.time() if live else None)
    out = args.out if args.out is not None else run_dir / "report.html"
    try:
        out.write_text(page, encoding="utf-8")
    except OSError as exc:
        print(f"unbroken report: cannot write {out}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    print(f"report: {out}")
    return 0
