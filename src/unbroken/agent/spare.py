"""A warm spare pod: an agent process on a free node, with a zygote that imports torch for it.

``recover`` places a replacement pod on a healthy node. A cold agent there starts its ranks as
new Python processes that import torch, which takes seconds on a small machine and is most of
the replacement's time. So the job manager keeps one spare agent per free node while the job
trains: it starts one zygote (:mod:`unbroken.agent.standby`) at once, which imports torch once
for all ``--nproc`` rank slots and then forks each rank, then waits for one JSON line on
stdin::

    {"argv": [...], "env": {...}, "cwd": "...", "log": "..."}

the ``unbroken launch`` arguments (after ``launch``), environment, working directory and log
file a fresh agent of the pod would have been started with. It then becomes that pod's agent
(:class:`~unbroken.agent.managed.ManagedAgent`) in the same process, and its zygote forks the
pod's ranks, and any later replacement of them. End of input without an order (the run is over,
or the node is no longer free): the zygote is let go and the spare exits 0.

The zygote warms up at normal priority. A spare's cores are its own on a cluster; in the embedded
cluster they are the job's, and the one import (a few CPU seconds, once per job and node, beside
the pods' own zygotes at the job's start) slows the job's start while it runs. At the lowest
priority it would not finish beside four busy ranks on two cores, and a ``recover`` would wait
for it (MTTR 8.9 s against 1-2 s with the zygote warm: ``bench/recovery.py --configs
unbroken-recover``). It is started with the manager's environment; each rank it
forks takes its rank's whole environment, so nothing pod-specific is fixed before the order.
The spare process is the ranks' parent (a child subreaper) from the start.

Run as ``python -m unbroken.agent.spare --nproc N --log-dir D``. Imports no torch.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from unbroken.agent.env import CONTROL_VARS
from unbroken.agent.launcher import LaunchUsageError, parse_launch_args
from unbroken.agent.ranks import Zygote, start_zygote

log = logging.getLogger(__name__)


class SpareOrderError(ValueError):
    """The order a spare agent got is not one it can carry out."""


def _let_go(zygote: Zygote | None) -> None:
    if zygote is not None:
        zygote.close()


def _read_order(line: str) -> dict[str, object]:
    try:
        order = json.loads(line)
    except json.JSONDecodeError as exc:
        raise SpareOrderError(f"the order is not JSON: {exc}") from None
    if not isinstance(order, dict):
        raise SpareOrderError(f"the order is {type(order).__name__}, not a JSON object")
    for key, kind in (("argv", list), ("env", dict), ("cwd", str), ("log", str)):
        if not isinstance(order.get(key), kind):
            raise SpareOrderError(f"the order's {key!r} is missing or not a {kind.__name__}")
    return order


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m unbroken.agent.spare")
    p.add_argument("--nproc", type=int, required=True, help="rank slots of the pod to be")
    p.add_argument("--log-dir", type=Path, required=True, help="where the zygote logs")
    ns = p.parse_args(argv)
    if ns.nproc < 1:
        p.error(f"--nproc must be >= 1, got {ns.nproc}")
    logging.basicConfig(
        level=os.environ.get("UNBROKEN_LOG_LEVEL", "WARNING"),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    env = {k: v for k, v in os.environ.items() if k not in CONTROL_VARS}
    env.setdefault("OMP_NUM_THREADS", "1")
    # At normal priority: warm before the fault it is kept for (see the module doc).
    zygote = start_zygote(env, ns.log_dir / "standby.log")
    line = sys.stdin.readline()
    sys.stdin.close()
    if not line.strip():
        _let_go(zygote)
        return 0
    try:
        order = _read_order(line)
        launch_argv = [str(a) for a in order["argv"]]  # type: ignore[attr-defined]
        args = parse_launch_args(launch_argv)
    except (SpareOrderError, LaunchUsageError) as exc:
        _let_go(zygote)
        print(f"unbroken spare agent: {exc}", file=sys.stderr)
        return 2
    if args.nproc_per_node != ns.nproc:
        _let_go(zygote)
        print(
            f"unbroken spare agent: the pod has {args.nproc_per_node} ranks, this spare "
            f"{ns.nproc} slots",
            file=sys.stderr,
        )
        return 2
    # Become the pod's agent: its environment, directory and log.
    os.environ.clear()
    os.environ.update({str(k): str(v) for k, v in order["env"].items()})  # type: ignore[attr-defined]
    os.chdir(str(order["cwd"]))
    out = os.open(str(order["log"]), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(out)
    from unbroken.agent.managed import AgentExit, AgentSettings, ManagedAgent

    settings = AgentSettings.from_env(os.environ)
    if settings is None:
        _let_go(zygote)
        print("unbroken spare agent: the order names no control plane", file=sys.stderr)
        return 2
    try:
        agent = ManagedAgent(args, settings)
        agent.adopt_zygote(zygote)
        return agent.run()
    except AgentExit as exc:
        print(f"unbroken launch ({settings.pod}): {exc}", file=sys.stderr)
        return exc.code


if __name__ == "__main__":
    sys.exit(main())
