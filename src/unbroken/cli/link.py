"""``unbroken link switchback`` / ``unbroken link failover --plane NAME``: move a running job's
collectives between network planes, through its control plane (authenticated with the run's
secret).

``switchback`` returns the job to its preferred plane (the first each host declared with
``--plane``) and lets automatic switchbacks happen again; ``failover --plane NAME`` moves it to
another plane that is up on every node, and pins it there (no automatic switchback) until a
``switchback``. Either way every rank stops at its next step boundary and regroups over the
plane in its own process. The command waits until the first step on the new plane is committed
and prints the pause. Exit 0 once it is; 1 when the control plane refuses (the reason: an
unknown plane, one down on a node, already active, a switch under way, link failover not
declared) or the switch does not finish within ``--timeout``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from unbroken.cli.control import call_run
from unbroken.cli.ledgerwait import wait_for_record
from unbroken.cli.rundir import RunDirError, find_run
from unbroken.ledger import (
    Ledger,
    LedgerError,
    PlaneChanged,
    PlaneFailover,
    PlaneSwitchback,
    Record,
)

METHOD = "Link"


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("link", help="switch a running job's collectives between network planes")
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    back = actions.add_parser("switchback", help="back to the preferred plane")
    fail = actions.add_parser("failover", help="to another plane, pinned there")
    fail.add_argument("--plane", required=True, help="the plane to move to")
    for a in (back, fail):
        a.add_argument("--run", type=Path, default=None, help="run directory (default: newest)")
        a.add_argument(
            "--timeout", type=float, default=60.0, help="seconds to wait for the first step"
        )


def run(args: argparse.Namespace) -> int:
    command = f"link {args.action}"
    try:
        run_dir = find_run(args.run)
        ledger = Ledger(run_dir / "ledger.db", create=False)
    except (RunDirError, LedgerError) as exc:
        print(f"unbroken {command}: {exc}", file=sys.stderr)
        return 1
    try:
        since = max((r.id for r in ledger.events(kinds=_KINDS)), default=0)
        to = str(getattr(args, "plane", "") or "")
        reply = call_run(command, run_dir, METHOD, {"to": to})
        if reply is None:
            return 1
        print(str(reply.get("detail", "")), flush=True)
        code = wait_for_record(
            ledger, command, _KINDS, lambda rec: _on_switch(rec, to), args.timeout, since
        )
    finally:
        ledger.close()
    if code is not None:
        return code
    print(
        f"unbroken {command}: no step on the new plane within {args.timeout:.0f} s", file=sys.stderr
    )
    return 1


def _on_switch(rec: Record, to: str) -> int | None:
    """0, with the pause printed, once the requested switch (to ``to``, or back when empty) has
    committed its first step; None for any other switch (one the job made on its own, or one
    another request asked for)."""
    d = rec.data
    if d["planned"] and (not to or d["to"] == to):
        print(
            f"plane {d['to']} active: step {d['step']} committed by generation "
            f"{d['generation']}; training stood still {d['pause_s']:.2f} s"
        )
        return 0
    return None


_KINDS = [PlaneFailover.kind, PlaneSwitchback.kind]


def planes_summary(records: Sequence[Record]) -> dict[str, Any] | None:
    """The run's network planes from its ledger (None when none was reported): the active
    plane, the switches and the pause they cost, and where a plane is down now."""
    health: dict[tuple[str, str], bool] = {}
    switches: list[dict[str, Any]] = []
    first = ""
    for r in records:
        if r.kind == PlaneChanged.kind:
            first = first or str(r.data["plane"])
            health[(str(r.data["node"]), str(r.data["plane"]))] = bool(r.data["up"])
        elif r.kind in _KINDS:
            switches.append({"kind": r.kind, **r.data})
    if not health:
        return None
    return {
        "active": str(switches[-1]["to"]) if switches else first,
        "failovers": sum(s["kind"] == PlaneFailover.kind for s in switches),
        "switchbacks": sum(s["kind"] == PlaneSwitchback.kind for s in switches),
        "paused_s": sum(float(s["pause_s"]) for s in switches),
        "down": sorted(f"{p} on {n}" for (n, p), up in health.items() if not up),
    }


def planes_line(summary: dict[str, Any]) -> str:
    line = (
        f"{summary['active']} active; {summary['failovers']} failover(s), "
        f"{summary['switchbacks']} switchback(s), training paused {summary['paused_s']:.2f} s"
    )
    if summary["down"]:
        line += "; down: " + ", ".join(summary["down"])
    return line
