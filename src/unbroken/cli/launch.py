"""``unbroken launch``: the per-pod agent, a drop-in for ``torchrun``.

Under ``unbroken run`` (the control plane sets ``UNBROKEN_CONTROL``) the agent reports to the job
manager and obeys it; otherwise it behaves like ``torchrun`` with restarts that work.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from unbroken.agent.launcher import LaunchUsageError, build_parser, parse_launch_args


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sub.add_parser(
        "launch",
        help="start the ranks of one pod (a drop-in for torchrun)",
        parents=[build_parser()],
        add_help=False,
    )


def run(args: argparse.Namespace) -> int:  # pragma: no cover - dispatched through main()
    raise AssertionError("launch is dispatched by main()")


def main(argv: Sequence[str]) -> int:
    logging.basicConfig(
        level=os.environ.get("UNBROKEN_LOG_LEVEL", "WARNING"),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        args = parse_launch_args(argv)
    except LaunchUsageError as exc:
        print(f"unbroken launch: {exc}", file=sys.stderr)
        return 2
    from unbroken.agent.managed import AgentExit, AgentSettings, ManagedAgent

    settings = AgentSettings.from_env(os.environ)
    if settings is None:
        from unbroken.agent.standalone import run_standalone

        return run_standalone(args)
    try:
        return ManagedAgent(args, settings).run()
    except AgentExit as exc:
        print(f"unbroken launch ({settings.pod}): {exc}", file=sys.stderr)
        return exc.code
