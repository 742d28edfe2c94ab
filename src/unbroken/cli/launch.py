"""``unbroken launch``: the per-pod agent, a drop-in for ``torchrun``.

Under ``unbroken run`` (the control plane sets ``UNBROKEN_CONTROL``) the agent reports to the job
manager and obeys it; otherwise it behaves like ``torchrun`` with restarts that work. With
``--join HOST:PORT`` it is the agent of one host that joins a control plane on another
(:mod:`unbroken.agent.remote`).
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


def _missing_script(script: str, module: bool, no_python: bool) -> str:
    """Why the training script cannot be started, or "" (a module or an executable on PATH is
    left to its interpreter or the shell to find)."""
    if module:
        return ""
    if no_python:
        if os.sep in script and not os.access(script, os.X_OK):
            return f"training script {script!r} is not an executable file (--no-python)"
        return ""
    if not os.path.isfile(script):
        return f"training script {script!r} not found (looked in {os.getcwd()})"
    return ""


def _join(argv: Sequence[str]) -> int:
    """``unbroken launch --join HOST:PORT --token-file F --node NAME``: this host's agent."""
    from unbroken.agent.remote import JoinError, join, parse_join_args

    try:
        return join(parse_join_args(argv))
    except JoinError as exc:
        print(f"unbroken launch: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 1


def main(argv: Sequence[str]) -> int:
    logging.basicConfig(
        level=os.environ.get("UNBROKEN_LOG_LEVEL", "WARNING"),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if any(a == "--join" or a.startswith("--join=") for a in argv):
        return _join(argv)
    try:
        args = parse_launch_args(argv)
    except LaunchUsageError as exc:
        print(f"unbroken launch: {exc}", file=sys.stderr)
        return 2
    from unbroken.agent.managed import AgentExit, AgentSettings, ManagedAgent

    settings = AgentSettings.from_env(os.environ)
    if settings is None:
        from unbroken.agent.standalone import run_standalone

        missing = _missing_script(args.script, args.module, args.no_python)
        if missing:
            print(f"unbroken launch: {missing}", file=sys.stderr)
            return 1

        return run_standalone(args)
    try:
        return ManagedAgent(args, settings).run()
    except AgentExit as exc:
        print(f"unbroken launch ({settings.pod}): {exc}", file=sys.stderr)
        return exc.code
