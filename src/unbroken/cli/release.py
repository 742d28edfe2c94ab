"""``unbroken release --node N --device D [--run RUN]``: an operator returns a device to the
pool of a running job, through its control plane.

A device isolated at level ``ManuallySeparate`` (a code the table rates so, or a fault that
repeated too often and escalated) never returns on its own, not even when it reports healthy
again; this command returns it once it does. With the device plugin's ``autoStowing`` off, it
returns any isolated device that reports healthy. The job manager records ``DeviceReturned``
(``released by an operator``) in the ledger.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from unbroken.cli.control import call_run
from unbroken.cli.rundir import RunDirError, find_run


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "release", help="return a device held out of the pool (ManuallySeparate) to a running job"
    )
    p.add_argument("--node", required=True)
    p.add_argument("--device", type=int, required=True)
    p.add_argument("--run", type=Path, default=None, help="run directory (default: newest)")


def run(args: argparse.Namespace) -> int:
    try:
        run_dir = find_run(args.run)
    except RunDirError as exc:
        print(f"unbroken release: {exc}", file=sys.stderr)
        return 1
    reply = call_run("release", run_dir, "Release", {"node": args.node, "device": args.device})
    if reply is None:
        return 1
    print(reply.get("detail", "released"))
    return 0
