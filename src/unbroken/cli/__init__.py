"""The ``unbroken`` command: one subcommand per module of this package.

Exit codes: 0 success, 1 the input or the job failed (with the reason on stderr),
2 usage errors (argparse's convention).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Sequence

# Subcommand name -> module in this package. Each module defines
# ``add_parser(subparsers) -> None`` and ``run(args) -> int``.
_COMMANDS: dict[str, str] = {
    "validate": "validate",
    "plan": "plan",
    "launch": "launch",
    "run": "runcmd",
    "serve": "serve",
    "status": "status",
    "events": "events",
    "report": "report",
    "inject": "inject",
    "release": "release",
    "stress-test": "stress",
    "link": "link",
    "credentials": "credentials",
}


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="unbroken",
        description="Keep distributed PyTorch training running through faults.",
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more log output")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in _COMMANDS.values():
        mod = importlib.import_module(f"unbroken.cli.{module}")
        mod.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    # ``launch`` passes the training script's own arguments through untouched,
    # so it is dispatched before argparse sees them.
    if args_list and args_list[0] == "launch" and "launch" in _COMMANDS:
        mod = importlib.import_module(f"unbroken.cli.{_COMMANDS['launch']}")
        code: int = mod.main(args_list[1:])
        return code
    parser = _build_parser()
    args = parser.parse_args(args_list)
    level = logging.WARNING - 10 * min(args.verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    mod = importlib.import_module(f"unbroken.cli.{_COMMANDS[args.command]}")
    try:
        code = mod.run(args)
    except BrokenPipeError:  # the reader went away (``unbroken plan ... | head``)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    return code
