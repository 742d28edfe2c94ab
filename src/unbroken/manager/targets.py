"""The job as fault injection sees it (:class:`~unbroken.chaos.injector.InjectionTarget`):
its shape, its processes, the ports of its stores, and a node taken down or returned. Under
``unbroken serve`` a node is a joined host, whose pids are that host's: its faults and its
ranks' signals go through the host's agent (:class:`~unbroken.manager.remotepods.JoinedHost`),
never to a process of this host."""

from __future__ import annotations

import os
import signal
from collections.abc import Mapping, Sequence
from pathlib import Path

from unbroken.chaos.injector import RankTarget
from unbroken.manager.context import Context
from unbroken.manager.engine import Engine
from unbroken.manager.generations import Generations
from unbroken.manager.pool import Pool
from unbroken.manager.remotepods import JoinedHost
from unbroken.protocol.hosts import SIGNAL


class JobTarget:
    """:class:`~unbroken.chaos.injector.InjectionTarget` over the engine's pods and the
    current generation's ranks."""

    def __init__(self, ctx: Context, engine: Engine, pool: Pool, generations: Generations) -> None:
        self.ctx = ctx
        self.engine = engine
        self.pool = pool
        self.gens = generations

    @property
    def world_size(self) -> int:
        return self.ctx.job.world_size

    @property
    def nodes(self) -> Sequence[str]:
        return self.ctx.cluster.nodes

    @property
    def devices_per_node(self) -> int:
        return self.ctx.cluster.devices_per_node

    @property
    def sim_dir(self) -> Path:
        return self.ctx.sim_dir

    @property
    def device_provider(self) -> str:
        return self.ctx.cluster.device_provider

    def rank_targets(self) -> Mapping[int, RankTarget]:
        pod_of = self.ctx.job.pod_of_rank
        return {
            r: RankTarget(rank=r, pid=v.pid, pod=pod_of(r), alive=v.alive)
            for r, v in self.gens.ranks.items()
        }

    def pod_names(self) -> Sequence[str]:
        return list(self.engine.pods)

    def store_ports(self) -> tuple[int, ...]:
        return (self.engine.master_port, self.ctx.job.master_port or 0)

    def host(self, node: str) -> JoinedHost | None:
        """The joined host that is ``node`` (None: the node is on this machine)."""
        registry = self.engine.remote_nodes
        return None if registry is None else JoinedHost(registry, node)

    def node_of(self, pod: str) -> str | None:
        proc = self.engine.pods.get(pod)
        return None if proc is None else proc.node

    def take_node_down(self, node: str) -> int:
        host = self.host(node)
        if host is not None:
            return host.down()
        return self.engine.take_node_down(node)

    def node_pids(self, node: str) -> list[int]:
        return [
            pid
            for p in self.engine.pods.values()
            if p.node == node and p.alive
            for pid in (p.proc.pid, *p.rank_pids.values())
        ]

    def signal_rank(self, rank: int, pid: int, sig: signal.Signals) -> None:
        """A rank of a pod on a joined host is signalled by that host's agent (its pid is that
        host's); any other here."""
        pod = self.engine.pods.get(self.ctx.job.pod_of_rank(rank) or "")
        registry = self.engine.remote_nodes
        if registry is not None:
            if pod is None:
                raise ValueError(f"rank {rank} has no pod on a joined host now")
            registry.order(pod.node, {"kind": SIGNAL, "pid": pid, "sig": int(sig)})
            return
        try:
            os.kill(pid, sig)
        except ProcessLookupError:  # it ended since the manager last heard of it
            raise ValueError(f"rank {rank} (pid {pid}) is not running now") from None

    def return_node(self, node: str) -> str:
        """A node taken out of the pool is back (``unbroken inject node --clear``): pods may
        be placed on it again (an elastic job scales out onto it)."""
        isolated = node in self.pool.cluster.isolated_nodes
        if isolated and any(p.node == node and not p.lost for p in self.engine.running()):
            raise ValueError(f"node {node} still runs a pod of the job")
        return self.pool.return_node(node)
