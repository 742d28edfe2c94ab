"""Injecting real faults into a running job from outside its processes (``--chaos``,
``unbroken inject``).

Signals go to rank processes by pid (SIGKILL, SIGSTOP, SIGUSR1 for an exception, SIGUSR2 for a
device memory error), the kernel resets a rank's TCP links to its peers (``ss -K``), a node's
processes die at once, and device codes go through the ``sim`` health provider, as does a
silent data corruption (``sdc``: the device computes wrong while its health stays good, so only
an online stress test finds it). The injector
finds the processes through an :class:`InjectionTarget` (the job manager), so it knows nothing
of how they were started; it returns what it did, for the ledger and the console. A node that
is another host (``unbroken serve``) has its faults carried out by that host's agent
(:class:`HostFaults`): its pids are that host's, and nothing is done to a process of this one.
"""

from __future__ import annotations

import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from unbroken.chaos import throttle
from unbroken.chaos.schedule import ChaosFault, InjectKind
from unbroken.devices import clear_device_fault, inject_device_fault, inject_silent_fault
from unbroken.protocol.calls import decode_inject
from unbroken.worker.linkfault import LinkFaultError, reset_links

#: The code a silent data corruption is recorded with when none is given.
SDC_CODE = "SDC"

_SIGNALS = {
    InjectKind.KILL: signal.SIGKILL,
    InjectKind.HANG: signal.SIGSTOP,
    InjectKind.EXCEPTION: signal.SIGUSR1,
    InjectKind.MEMORY: signal.SIGUSR2,
}


@dataclass(frozen=True)
class RankTarget:
    """A rank of the job as the manager knows it now."""

    rank: int
    pid: int
    pod: str | None
    alive: bool


class HostFaults(Protocol):
    """A node that is a joined host: its faults carried out by the host's agent. Each raises
    :class:`ValueError` with the host's reason when it could not."""

    def down(self) -> int:
        """SIGKILL every process of the node's pods (and its spare); how many."""
        ...

    def throttle(self, cpu: float | None) -> int:
        """Hold the node's pods' processes to ``cpu`` of one CPU (None: free them); how many."""
        ...

    def reset_links(
        self, pid: int, exclude_ports: Sequence[int], peer_pids: Sequence[int] | None
    ) -> int:
        """Reset the TCP links of the rank ``pid`` (to ``peer_pids`` on that host, or, None,
        all but those of ``exclude_ports``); how many."""
        ...


class InjectionTarget(Protocol):
    """What the injector needs of the job: its shape, its processes and its store's ports."""

    @property
    def world_size(self) -> int: ...

    @property
    def nodes(self) -> Sequence[str]: ...

    @property
    def devices_per_node(self) -> int: ...

    @property
    def sim_dir(self) -> Path: ...

    @property
    def device_provider(self) -> str:
        """Where the run reads device health: ``sim`` reads what is injected here."""
        ...

    def rank_targets(self) -> Mapping[int, RankTarget]: ...

    def pod_names(self) -> Sequence[str]: ...

    def store_ports(self) -> tuple[int, ...]:
        """Ports whose connections a link fault must leave alone (the rendezvous stores)."""
        ...

    def take_node_down(self, node: str) -> int:
        """SIGKILL every process of ``node``; how many."""
        ...

    def node_pids(self, node: str) -> list[int]:
        """The processes of the job on ``node`` now (agents and ranks)."""
        ...

    def signal_rank(self, rank: int, pid: int, sig: signal.Signals) -> None:
        """Send ``sig`` to rank ``rank``'s process ``pid`` on the host it runs on."""
        ...

    def host(self, node: str) -> HostFaults | None:
        """The joined host that is ``node``; None when the node is on this machine."""
        ...

    def node_of(self, pod: str) -> str | None:
        """The node the pod ``pod`` runs on now."""
        ...

    def return_node(self, node: str) -> str:
        """``node``, taken out of the pool when it was lost, is back (repaired); raises
        :class:`ValueError` when it is not out of the pool."""
        ...


def due(
    chaos: Sequence[ChaosFault], fired: set[int], elapsed_s: float, step: int
) -> list[ChaosFault]:
    """The scheduled faults to fire from outside now (not fired yet, not fired by a rank
    itself), ``elapsed_s`` into the job and at committed ``step``."""
    return [
        c
        for c in chaos
        if c.index not in fired
        and not c.in_rank
        and (
            (c.after_s is not None and elapsed_s >= c.after_s)
            or (c.at_step is not None and step >= c.at_step)
        )
    ]


class Injector:
    def __init__(self, target: InjectionTarget) -> None:
        self.t = target
        #: node -> the cgroup its processes were throttled in (see :meth:`release_throttles`).
        self.throttled: dict[str, throttle.Throttled] = {}

    def request(self, body: Mapping[str, Any]) -> str:
        """Inject what an ``Inject`` request asks for (``unbroken inject``); raises
        :class:`ValueError` naming what is wrong with it."""
        req = decode_inject(body)  # each field of its type and range
        kinds = [k.value for k in InjectKind]
        if req.kind not in kinds:
            raise ValueError(f"unknown fault kind {req.kind!r}; one of {kinds}")
        return self.inject(
            InjectKind(req.kind),
            rank=req.rank,
            pod=req.pod,
            node=req.node,
            device=req.device,
            code=req.code,
            clear=req.clear,
            peer=req.peer,
            cpu=req.cpu,
        )

    def fire(self, c: ChaosFault) -> str:
        """Inject one scheduled fault."""
        return self.inject(
            c.kind,
            rank=c.rank,
            pod=c.pod,
            node=c.node,
            device=c.device,
            code=c.code,
            clear=c.clear,
            cpu=c.cpu,
        )

    def inject(
        self,
        kind: InjectKind,
        *,
        rank: int | None = None,
        pod: str | None = None,
        node: str | None = None,
        device: int | None = None,
        code: str | None = None,
        clear: bool = False,
        peer: int | None = None,
        cpu: float | None = None,
    ) -> str:
        """Inject a real fault from outside the training processes; returns what was done.

        ``clear``: a device reports healthy again, so it returns to the pool when
        ``autoStowing`` is on; a lost node is back in the pool. ``peer`` (link only): reset
        only the link between ``rank`` and ``peer``, not all of the rank's links to its
        peers."""
        if kind in _SIGNALS:
            sig = _SIGNALS[kind]
            targets = self._ranks(rank, pod)
            for r, pid in targets:
                self.t.signal_rank(r, pid, sig)
            return f"{kind}: sent {sig.name} to " + ", ".join(
                f"rank {r} (pid {p})" for r, p in targets
            )
        if kind is InjectKind.LINK:
            return self._link(rank, pod, peer)
        if kind is InjectKind.STRESS_TEST:
            raise ValueError("a stress test is no fault: ask for it with unbroken stress-test")
        if node is None or node not in self.t.nodes:
            raise ValueError(f"node {node!r} does not exist (nodes: {', '.join(self.t.nodes)})")
        if kind is InjectKind.THROTTLE:
            return self._throttle(node, None if clear else cpu)
        if kind is InjectKind.NODE and clear:
            return self.t.return_node(node)
        if kind is InjectKind.NODE:
            killed = self.t.take_node_down(node)
            return f"node {node} down: SIGKILL to {killed} processes"
        per_node = self.t.devices_per_node
        if device is None or not 0 <= device < per_node:
            raise ValueError(f"device {device!r} does not exist on {node} (0-{per_node - 1})")
        if kind is InjectKind.DEVICE and self.t.device_provider != "sim":
            raise ValueError(
                f"this run reads device health from {self.t.device_provider} "
                f"(devicePlugin.provider: {self.t.device_provider}); an injected device code "
                "would never be read: inject device faults into a run whose provider is sim"
            )
        if clear:
            clear_device_fault(self.t.sim_dir, node, device)
            return f"device {device} of {node} healthy again"
        if kind is InjectKind.SDC:
            inject_silent_fault(self.t.sim_dir, node, device, code or SDC_CODE)
            return (
                f"silent data corruption {code or SDC_CODE} on {node} device {device}: it "
                "computes wrong, its health stays good"
            )
        if not code:
            raise ValueError("a device fault needs --code")
        inject_device_fault(self.t.sim_dir, node, device, code)
        return f"device fault {code} on {node} device {device}"

    def _throttle(self, node: str, cpu: float | None) -> str:
        host = self.t.host(node)
        if host is not None:  # its host's agent throttles its processes, or frees them
            count = host.throttle(cpu)
            if cpu is None:
                return f"node {node} no longer throttled"
            return f"node {node} throttled to {cpu:g} of one CPU ({count} processes)"
        if cpu is None:
            held = self.throttled.pop(node, None)
            if held is None:
                raise ValueError(f"node {node} is not throttled")
            throttle.release(held)
            return f"node {node} no longer throttled"
        pids = self.t.node_pids(node)
        if not pids:
            raise ValueError(f"node {node} runs no process of the job now")
        try:
            self.throttled[node] = throttle.throttle(node, pids, cpu)
        except throttle.ThrottleError as exc:
            raise ValueError(f"cannot throttle node {node}: {exc}") from None
        return f"node {node} throttled to {cpu:g} of one CPU ({len(pids)} processes)"

    def release_throttles(self) -> None:
        """Every throttled node runs free again and its cgroup is removed (at the run's end)."""
        for node in list(self.throttled):
            throttle.release(self.throttled.pop(node))

    def _link(self, rank: int | None, pod: str | None, peer: int | None) -> str:
        if rank is None or pod is not None:
            raise ValueError("a link fault needs --rank: the rank whose links are reset")
        ((_r, pid),) = self._ranks(rank, None)
        ranks = self.t.rank_targets()
        peers = [r for r in sorted(ranks) if r != rank and ranks[r].alive]
        if peer is not None:
            if peer == rank:
                raise ValueError(f"--peer {peer} is the rank itself: a link has two ends")
            self._ranks(peer, None)  # a rank that exists and runs
            peers = [peer]
        node = self.t.node_of(ranks[rank].pod or "")
        host = None if node is None else self.t.host(node)
        if host is not None:  # the rank's host resets its links
            return self._remote_link(host, rank, pid, peer, node or "")
        try:
            links = reset_links(
                pid, exclude_ports=self.t.store_ports(), peer_pids=[ranks[r].pid for r in peers]
            )
        except LinkFaultError as exc:
            raise ValueError(f"link fault on rank {rank}: {exc}") from None
        return f"link: reset {len(links)} connection(s) between rank {rank} (pid {pid}) and " + (
            f"rank {peer}" if peer is not None else "its peers"
        )

    def _remote_link(
        self, host: HostFaults, rank: int, pid: int, peer: int | None, node: str
    ) -> str:
        """A link fault on a joined host: a peer's pid means something on its own host only,
        so ``peer`` must run on the rank's node; without one every link of the rank but the
        stores' is reset."""
        peer_pids = None
        if peer is not None:
            view = self.t.rank_targets()[peer]
            peer_node = self.t.node_of(view.pod or "")
            if peer_node != node:
                raise ValueError(
                    f"--peer {peer}: rank {peer} runs on {peer_node}, another host than rank "
                    f"{rank}'s {node}; a link to another host is reset without --peer"
                )
            peer_pids = [view.pid]
        count = host.reset_links(pid, self.t.store_ports(), peer_pids)
        return (
            f"link: reset {count} connection(s) between rank {rank} (pid {pid} on {node}) and "
            + (f"rank {peer}" if peer is not None else "its peers")
        )

    def _ranks(self, rank: int | None, pod: str | None) -> list[tuple[int, int]]:
        ranks = self.t.rank_targets()
        if rank is not None:
            if not 0 <= rank < self.t.world_size:
                raise ValueError(f"rank {rank} does not exist (ranks 0-{self.t.world_size - 1})")
            view = ranks.get(rank)
            if view is None or not view.alive:
                raise ValueError(f"rank {rank} is not running now")
            return [(rank, view.pid)]
        pods = self.t.pod_names()
        if pod is None or pod not in pods:
            raise ValueError(f"pod {pod!r} does not exist (pods: {', '.join(pods)})")
        out = [(r, v.pid) for r, v in sorted(ranks.items()) if v.alive and v.pod == pod]
        if not out:
            raise ValueError(f"pod {pod} has no running rank now")
        return out
