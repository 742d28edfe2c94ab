"""``unbroken launch``: the torchrun-compatible command line of the node agent.

Accepts torchrun's usual flags in both spellings (``--nproc_per_node`` and ``--nproc-per-node``)
and the training script with its own arguments after them. Flags that only matter to torchrun's
own rendezvous backends (``--rdzv_backend``, ``--rdzv_endpoint``, ``--rdzv_id``) are accepted and
ignored: the rendezvous store is the job manager's (managed mode) or the node-rank-0 agent's
(standalone mode).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from unbroken.spec.knobs import (
    MAX_NODES,
    MAX_PROCS_PER_NODE,
    MAX_RESTARTS_DEFAULT,
    MAX_RESTARTS_LIMIT,
    MONITOR_INTERVAL_S_DEFAULT,
)


class LaunchUsageError(ValueError):
    """The launcher's command line is wrong; the message says which flag and why."""


@dataclass(frozen=True)
class LaunchArgs:
    nproc_per_node: int
    nnodes: int
    node_rank: int
    master_addr: str
    master_port: int
    max_restarts: int
    monitor_interval_s: float
    run_id: str
    module: bool
    no_python: bool
    log_dir: str | None
    script: str
    script_args: tuple[str, ...]

    @property
    def world_size(self) -> int:
        return self.nproc_per_node * self.nnodes

    def global_rank(self, local_rank: int) -> int:
        return self.node_rank * self.nproc_per_node + local_rank


def _flag(parser: argparse.ArgumentParser, name: str, **kw: Any) -> None:
    dashed = name.replace("_", "-")
    names = [f"--{name}"] if dashed == name else [f"--{name}", f"--{dashed}"]
    parser.add_argument(*names, dest=name, **kw)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="unbroken launch",
        description="Start the ranks of one pod (a drop-in for torchrun).",
    )
    _flag(p, "nproc_per_node", default="1", help="ranks in this pod (int, or 'cpu')")
    _flag(p, "nnodes", default="1", help="number of pods/nodes (int or MIN:MAX)")
    _flag(p, "node_rank", type=int, default=0)
    _flag(p, "master_addr", default="127.0.0.1")
    _flag(p, "master_port", type=int, default=29500)
    _flag(p, "max_restarts", type=int, default=None)
    _flag(p, "monitor_interval", type=float, default=MONITOR_INTERVAL_S_DEFAULT)
    _flag(p, "run_id", default="none")
    _flag(p, "rdzv_backend", default=None, help="accepted for compatibility; ignored")
    _flag(p, "rdzv_endpoint", default=None, help="accepted for compatibility; ignored")
    _flag(p, "rdzv_id", default=None, help="accepted for compatibility; ignored")
    _flag(p, "log_dir", default=None, help="where rank logs go (default: the run directory)")
    p.add_argument("--standalone", action="store_true", help="single node, local store")
    p.add_argument("-m", "--module", action="store_true", help="run the script as a module")
    _flag(p, "no_python", action="store_true", help="run the script as an executable")
    p.add_argument("script", help="the training script")
    p.add_argument("script_args", nargs=argparse.REMAINDER)
    return p


def _parse_count(flag: str, text: str, high: int) -> int:
    value = text.split(":")[-1]
    if value == "cpu":
        return 1
    try:
        n = int(value)
    except ValueError:
        raise LaunchUsageError(f"--{flag}: {text!r} is not an integer") from None
    if not 1 <= n <= high:
        raise LaunchUsageError(f"--{flag}: {n} is out of range (1-{high})")
    return n


def parse_launch_args(argv: Sequence[str]) -> LaunchArgs:
    ns = build_parser().parse_args(list(argv))
    nproc = _parse_count("nproc_per_node", ns.nproc_per_node, MAX_PROCS_PER_NODE)
    nnodes = _parse_count("nnodes", ns.nnodes, MAX_NODES)
    if not 0 <= ns.node_rank < nnodes:
        raise LaunchUsageError(f"--node_rank: {ns.node_rank} must be in [0, {nnodes - 1}]")
    if not 0 <= ns.master_port <= 65535:
        raise LaunchUsageError(f"--master_port: {ns.master_port} is not a TCP port")
    if ns.monitor_interval <= 0:
        raise LaunchUsageError(f"--monitor_interval: {ns.monitor_interval} must be positive")
    max_restarts = MAX_RESTARTS_DEFAULT if ns.max_restarts is None else ns.max_restarts
    if not 0 <= max_restarts <= MAX_RESTARTS_LIMIT:
        raise LaunchUsageError(
            f"--max_restarts: {max_restarts} is out of range (0-{MAX_RESTARTS_LIMIT})"
        )
    args = tuple(ns.script_args)
    if args and args[0] == "--":
        args = args[1:]
    return LaunchArgs(
        nproc_per_node=nproc,
        nnodes=nnodes,
        node_rank=ns.node_rank,
        master_addr=ns.master_addr,
        master_port=ns.master_port,
        max_restarts=max_restarts,
        monitor_interval_s=ns.monitor_interval,
        run_id=ns.run_id,
        module=ns.module,
        no_python=ns.no_python,
        log_dir=ns.log_dir,
        script=ns.script,
        script_args=args,
    )
