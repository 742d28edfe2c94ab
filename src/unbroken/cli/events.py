"""``unbroken events [RUN]``: what happened, from the run's ledger, and the incident timelines."""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from pathlib import Path

from unbroken.cli.rundir import RunDirError, find_run, is_live
from unbroken.ledger import (
    EVENT_TYPES,
    RAW_KINDS,
    Ledger,
    LedgerError,
    Record,
    format_goodput,
    format_incidents,
    goodput,
    incidents,
)
from unbroken.ledger.codec import to_json_value


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("events", help="the events of a run (default: the newest under ./runs)")
    p.add_argument("run", type=Path, nargs="?", default=None, help="a run directory")
    p.add_argument("--kind", action="append", default=None, help="only events of this kind")
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    p.add_argument("--incidents", action="store_true", help="per-incident phase timelines")
    p.add_argument("--follow", "-f", action="store_true", help="keep printing new events")


#: A list longer than this is shown by its first items and its length (``--json`` has all).
LIST_SHOWN = 16


def _shown(value: object) -> object:
    """``value`` for a human's line: the pods of a 10k-node job's JobSubmitted are a line of
    100 KB otherwise."""
    if isinstance(value, list | tuple) and len(value) > LIST_SHOWN:
        head = ", ".join(repr(v) for v in value[: LIST_SHOWN // 2])
        return f"[{head}, ... {len(value)} in all]"
    return value


def _line(rec: Record, as_json: bool) -> str:
    if as_json:
        return json.dumps({**rec.data, "id": rec.id, "at": rec.at, "kind": rec.kind})
    when = datetime.datetime.fromtimestamp(rec.at).strftime("%H:%M:%S.%f")[:-3]
    fields = " ".join(
        f"{k}={_shown(v)}" for k, v in rec.data.items() if v not in (None, "", (), [], {})
    )
    return f"{rec.id:5d} {when} {rec.kind:<20} {fields}"


def run(args: argparse.Namespace) -> int:
    try:
        run_dir = find_run(args.run)
        ledger = Ledger(run_dir / "ledger.db", create=False)
    except (RunDirError, LedgerError) as exc:
        print(f"unbroken events: {exc}", file=sys.stderr)
        return 1
    if args.kind:
        known = set(EVENT_TYPES) | RAW_KINDS | ledger.kinds()
        unknown = [k for k in args.kind if k not in known]
        if unknown:
            ledger.close()
            print(
                f"unbroken events: --kind: unknown event kind {unknown[0]!r}; known: "
                f"{', '.join(sorted(known))}",
                file=sys.stderr,
            )
            return 2
    try:
        records = ledger.events(kinds=args.kind)
        if args.incidents:
            every = ledger.events()
            found = incidents(every)
            st = ledger.status()
            live = st is not None and not st.phase.finished and is_live(run_dir)
            gp = goodput(every, now=time.time() if live else None)
            if args.json:
                print(
                    json.dumps(
                        {"incidents": [to_json_value(i) for i in found], "goodput": gp.to_json()}
                    )
                )
            else:
                print(format_incidents(found) if found else "no incidents")
                print()
                print(format_goodput(gp))
            return 0
        for rec in records:
            print(_line(rec, args.json))
        last = ledger.last_id()
        while args.follow:
            st = ledger.status()
            for rec in ledger.events(since_id=last, kinds=args.kind):
                print(_line(rec, args.json), flush=True)
                last = rec.id
            if st is not None and st.phase.finished:
                break
            time.sleep(0.3)
    except KeyboardInterrupt:
        pass
    finally:
        ledger.close()
    return 0
