"""The device pool of the embedded cluster: nodes, devices, isolation, health and probes.

The scheduler's :class:`~unbroken.scheduler.Cluster` value (nodes, devices, which pod is bound
where, what is out of the pool) has one owner, :class:`Pool`; placing, binding and releasing
pods, taking devices and nodes out of the pool and returning them go through it. Device health
arrives here (:meth:`Pool.device_event`): a fault on a device a rank uses is returned to the
loop as a :class:`~unbroken.faults.Fault`; one on an idle device is handled here (isolated or
the node placed on last), training untouched. With ``-hotReset=2`` a faulty device is reset
offline and nothing restarts on it until it reports healthy (:meth:`Pool.reset_wait`).

The feasibility probes (:meth:`Pool.schedulable`, :meth:`Pool.may_pend`) place the faults'
pods on a copy of the cluster with the faults' nodes and devices out: nothing changes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from unbroken.devices import (
    DeviceFaulted,
    DeviceRecovered,
    DeviceStateError,
    Reset,
    reset_device,
)
from unbroken.faults import Fault, FaultKind, FaultLevel
from unbroken.ledger import (
    DeviceIsolated,
    DeviceReset,
    DeviceResetStarted,
    DeviceReturned,
    NodeDeprioritised,
    NodeIsolated,
)
from unbroken.manager.context import Context
from unbroken.manager.detector import IdleDeviceFault, device_fault
from unbroken.manager.incident import Incidents
from unbroken.policy import Command, DeviceRef, RestartInPlace, RestartProcesses, RetryOnline
from unbroken.scheduler import (
    Binding,
    Cluster,
    Placement,
    Pod,
    Unschedulable,
    passed_over,
    place,
)


class Pool:
    """The cluster's nodes and devices as the scheduler sees them (``cluster``, changed only
    here), the devices reporting a fault now (``faulty_devices``) and those being reset."""

    def __init__(self, ctx: Context, incidents: Incidents) -> None:
        self.ctx = ctx
        self.incidents = incidents
        cl = ctx.cluster
        self.cluster = Cluster.of({n: cl.devices_per_node for n in cl.nodes})
        #: Devices the health provider reports faulty now, with their codes.
        self.faulty_devices: dict[tuple[str, int], str] = {}
        #: Devices being reset (``-hotReset=2``), until they report healthy.
        self.resetting: dict[tuple[str, int], Reset] = {}
        #: ``FreeRestartNPU`` devices to reset once idle, with their fault's code.
        self.reset_when_idle: dict[tuple[str, int], str] = {}
        #: On NVIDIA GPUs: what resets the GPU a device slot runs on (the run's endpoints set it:
        #: :meth:`unbroken.manager.endpoints.Endpoints.reset_gpu`).
        self.reset_gpu: Callable[[str, int, str, float], Reset | None] | None = None

    # ---- placement ----------------------------------------------------------------------
    def wanted(self, pods: Sequence[str]) -> list[Pod]:
        """``pods`` as the scheduler places them (the job's devices per pod each)."""
        return [Pod(name=p, devices_needed=self.ctx.job.nproc_per_node) for p in pods]

    def place(self, pods: Sequence[str], prefer: Mapping[str, str] | None = None) -> Any:
        """Where ``pods`` would go now (:class:`~unbroken.scheduler.Placement`), or why they
        cannot (:class:`~unbroken.scheduler.Unschedulable`); nothing is bound."""
        return place(self.cluster, self.wanted(pods), prefer or {})

    def bind(self, bindings: tuple[Binding, ...], say_passed_over: bool = False) -> None:
        """Bind pods where a placement put them; ``say_passed_over``: the console says which
        deprioritised nodes the placement passed over, and why."""
        if say_passed_over:
            skipped = passed_over(self.cluster, Placement(bindings))
            if skipped:
                pods = ", ".join(b.pod for b in bindings)
                why = "; ".join(f"{n} ({reason})" for n, reason in sorted(skipped.items()))
                self.ctx.console.line(f"placing {pods}: passed over {why}, placed on last")
        self.cluster = self.cluster.bind(bindings)
        self.reset_idle(self.ctx.clock())  # a pod that moved left its devices idle

    def release(self, pods: Sequence[str]) -> None:
        """The pods' nodes and devices are free again (a ``FreeRestartNPU`` device left idle
        is reset now, before a pod is placed on it)."""
        self.cluster = self.cluster.release_all(pods)
        self.reset_idle(self.ctx.clock())

    def binding(self, pod: str) -> Binding | None:
        return self.cluster.bindings.get(pod)

    def free_nodes(self) -> list[str]:
        """Nodes no pod is bound to, not isolated, with enough healthy devices for a pod."""
        c = self.cluster
        bound = {b.node for b in c.bindings.values()}
        need = self.ctx.job.nproc_per_node
        return [
            n.name
            for n in c.nodes
            if n.name not in bound
            and n.name not in c.isolated_nodes
            and len(c.healthy_devices(n.name)) >= need
        ]

    def spare_node_free(self, needed: int = 1) -> bool:
        """Whether ``needed`` spare nodes are free (one per pod to move)."""
        return len(self.free_nodes()) >= needed

    def unfit(self, node: str) -> bool:
        """Whether ``node`` cannot take a pod (out of the pool, or too few healthy devices)."""
        c = self.cluster
        return (
            node in c.isolated_nodes or len(c.healthy_devices(node)) < self.ctx.job.nproc_per_node
        )

    def could_fit(self, pods: Sequence[str]) -> bool:
        """Whether ``pods`` could be placed if every isolated device came back healthy (a
        device held at ``ManuallySeparate`` does not come back on its own)."""
        c = self.cluster
        for node, device in list(c.isolated_devices):
            c = c.return_device(node, device)
        return not isinstance(place(c, self.wanted(pods)), Unschedulable)

    # ---- feasibility probes -------------------------------------------------------------
    def _probe(self, faults: Sequence[Fault]) -> tuple[Cluster, list[Pod]]:
        """The cluster as it would be with the faults' nodes and isolating devices out and
        their pods released, and those pods to place."""
        named = [f for f in faults if f.node is not None and f.pod is not None]
        lost = [f.node for f in named if f.node is not None and f.kind is FaultKind.NODE_LOST]
        c = self.cluster.isolate_nodes(lost, "probe") if lost else self.cluster
        for f in named:
            device = f.device if f.level.isolates_device else None
            if f.node is not None and f.kind is not FaultKind.NODE_LOST and device is not None:
                c = c.isolate_device(f.node, device, "probe")
        pods = self._pods_of(faults)
        return c.release_all(p.name for p in pods), pods

    def schedulable(self, faults: Sequence[Fault]) -> bool:
        """Whether the faults' pods could all be placed elsewhere now."""
        c, pods = self._probe(faults)
        return not pods or not isinstance(place(c, pods), Unschedulable)

    def may_pend(self, faults: Sequence[Fault]) -> bool:
        """Whether the faulty pods, with no room now, could be placed once the isolated
        devices (the faults' own among them, unless held out) are back in the pool: pod-level
        rescheduling then pends for room. A lost node does not come back."""
        if any(f.pod is None or f.kind is FaultKind.NODE_LOST for f in faults):
            return False
        if self.schedulable(faults):
            return False
        c = self.cluster
        for node, device in list(c.isolated_devices):
            if not c.device_held(node, device):
                c = c.return_device(node, device)
        for f in faults:
            held = f.level is FaultLevel.MANUALLY_SEPARATE
            if held and f.node is not None and f.device is not None:
                c = c.isolate_device(f.node, f.device, "probe")
        wanted = self._pods_of(faults)
        return not isinstance(place(c.release_all(p.name for p in wanted), wanted), Unschedulable)

    def _pods_of(self, faults: Sequence[Fault]) -> list[Pod]:
        return self.wanted(list(dict.fromkeys(f.pod for f in faults if f.pod is not None)))

    # ---- isolation ----------------------------------------------------------------------
    def isolate_all(self, devs: tuple[DeviceRef, ...], nodes: tuple[str, ...]) -> None:
        for d in devs:
            self.isolate_device(d.node, d.device, "fault")
        for n in nodes:
            self.isolate_node(n, "node lost")

    def isolate_device(
        self, node: str, device: int, reason: str, level: FaultLevel | None = None
    ) -> None:
        """Take a device out of the pool. At ``ManuallySeparate`` (``level``, else the level
        of the device's newest fault) it is held until ``unbroken release`` returns it, also
        when it was out of the pool already."""
        newest = self.incidents.newest_of_device(node, device)
        if level is None and newest is not None:
            level = newest.level
        manual = level is FaultLevel.MANUALLY_SEPARATE
        if manual:
            reason = f"{FaultLevel.MANUALLY_SEPARATE}: out until released (unbroken release)"
        isolated = self.cluster.device_isolated(node, device)
        if isolated and (not manual or self.cluster.device_held(node, device)):
            return
        self.cluster = self.cluster.isolate_device(node, device, reason, manual=manual)
        code = newest.code if newest is not None else self.faulty_devices.get((node, device))
        self.ctx.ledger.record(DeviceIsolated(node=node, device=device, code=code, reason=reason))
        self.ctx.console.line(f"device {device} of {node} isolated ({reason})")

    def isolate_node(self, node: str, reason: str) -> None:
        if node in self.cluster.isolated_nodes:
            return
        self.cluster = self.cluster.isolate_node(node, reason)
        self.ctx.ledger.record(NodeIsolated(node=node, reason=reason))
        self.ctx.console.line(f"node {node} isolated ({reason})")

    def deprioritise_node(self, node: str, reason: str) -> None:
        if node in self.cluster.deprioritised_nodes:
            return
        self.cluster = self.cluster.deprioritise_node(node, reason)
        self.ctx.ledger.record(NodeDeprioritised(node=node, reason=reason))
        self.ctx.console.line(f"node {node} placed on last from now on ({reason})")

    def return_node(self, node: str) -> str:
        """A node taken out of the pool is back: pods may be placed on it again. Raises
        ``ValueError`` when it is not out of the pool."""
        if node not in self.cluster.isolated_nodes:
            raise ValueError(f"node {node} is not out of the pool; nothing to clear")
        self.cluster = self.cluster.return_node(node)
        self.ctx.ledger.record_raw("NodeReturned", {"node": node})
        self.ctx.console.line(f"node {node} back in the pool")
        return f"node {node} back in the pool"

    def release_device(self, node: str, device: int) -> str:
        """An operator returns a device to the pool (``unbroken release``): one held at
        ``ManuallySeparate``, or, with ``autoStowing`` off, any isolated one. A device that
        still reports a fault is refused: it would take pods while faulty."""
        c = self.cluster
        c.node(node)
        code = self.faulty_devices.get((node, device))
        if code is not None:
            raise ValueError(
                f"device {device} of {node} still reports fault {code}; release it once it "
                "reports healthy (unbroken inject device --clear, for a sim device)"
            )
        if not c.device_held(node, device) and c.device_isolated(node, device):
            if self.ctx.cluster.auto_stowing:
                c.release_device(node, device)  # raises: it returns by itself
            self.cluster = c.return_device(node, device)
        else:
            self.cluster = c.release_device(node, device)  # raises unless held
        self.ctx.ledger.record(
            DeviceReturned(node=node, device=device, reason="released by an operator")
        )
        self.ctx.console.line(
            f"device {device} of {node} released by an operator: back in the pool"
        )
        return f"device {device} of {node} back in the pool"

    # ---- device health ------------------------------------------------------------------
    def device_event(self, event: Any, now: float) -> Fault | None:
        """A health event of a device: the fault of the rank that uses it (for the loop to
        decide), or None (a recovery, or a fault of an idle device, handled here)."""
        if isinstance(event, DeviceFaulted):
            self.faulty_devices[(event.node, event.device)] = event.code or "unknown"
            found = device_fault(event, self._holder(event.node, event.device), self.ctx.codes)
            if self.ctx.cluster.offline_reset and found.level.resets_device:
                self._reset(event.node, event.device, found.code, found.level, now)
            match found:
                case IdleDeviceFault() as idle:
                    self._idle_device_fault(idle)
                case Fault() as fault:
                    return fault
        elif isinstance(event, DeviceRecovered):
            self._device_recovered(event)
        return None

    def _device_recovered(self, event: DeviceRecovered) -> None:
        node, device = event.node, event.device
        console = self.ctx.console
        self.faulty_devices.pop((node, device), None)
        self.reset_when_idle.pop((node, device), None)
        reset = self.resetting.pop((node, device), None)
        if reset is not None:
            took_s = event.at - reset.at
            self.ctx.ledger.record(DeviceReset(node=node, device=device, took_s=took_s))
            console.line(f"device {device} of {node} reset: healthy again after {took_s:.2f} s")
        if self.cluster.device_held(node, device):
            console.line(
                f"device {device} of {node} reports healthy; it stays out of the pool until "
                "released (ManuallySeparate: unbroken release)"
            )
        elif self.cluster.device_isolated(node, device):
            if not self.ctx.cluster.auto_stowing:
                console.line(
                    f"device {device} of {node} reports healthy; it stays out of the pool until "
                    "released (autoStowing=false: unbroken release)"
                )
                return
            self.cluster = self.cluster.return_device(node, device)
            self.ctx.ledger.record(
                DeviceReturned(node=node, device=device, reason="healthy again (autoStowing)")
            )
            console.line(f"device {device} of {node} back in the pool")

    def _reset(self, node: str, device: int, code: str, level: FaultLevel, now: float) -> None:
        """A device at ``RestartNPU`` is reset at once; one at ``FreeRestartNPU`` once no pod of
        the job is bound to it (at once when none is)."""
        key = (node, device)
        if level is not FaultLevel.FREE_RESTART_NPU or not self._bound(node, device):
            self.reset_when_idle.pop(key, None)
            self._reset_device(node, device, code, level, now)
            return
        if key not in self.reset_when_idle:
            self.reset_when_idle[key] = code
            self.ctx.console.line(
                f"device {device} of {node} reported {code} ({level}): it is reset once no rank "
                "of the job uses it; its ranks recover without waiting for a reset"
            )

    def reset_idle(self, now: float, job_over: bool = False) -> None:
        """Reset the ``FreeRestartNPU`` devices no pod is bound to any more (every one of them
        once the job is over: ``job_over``)."""
        for (node, device), code in list(self.reset_when_idle.items()):
            if job_over or not self._bound(node, device):
                del self.reset_when_idle[(node, device)]
                self._reset_device(node, device, code, FaultLevel.FREE_RESTART_NPU, now)

    def _bound(self, node: str, device: int) -> bool:
        return any(b.node == node and device in b.devices for b in self.cluster.bindings.values())

    def _reset_device(
        self, node: str, device: int, code: str, level: FaultLevel, now: float
    ) -> None:
        """``-hotReset=2``: a device whose fault level resets it is reset offline, out of the
        pool, before it is used again: no pod is placed on it and no rank restarts on it
        (:meth:`reset_wait`) until it reports healthy."""
        key = (node, device)
        if key in self.resetting:
            return
        reset_s = self.ctx.cluster.reset_s
        try:
            if self.ctx.cluster.device_provider == "sim":
                reset = reset_device(self.ctx.sim_dir, node, device, now, reset_s)
            elif self.reset_gpu is not None and (gpu := self.reset_gpu(node, device, code, now)):
                reset, reset_s = gpu, gpu.until - now  # the command's bound
            else:
                raise ValueError("this run has no reset command for its GPUs")
        except (ValueError, DeviceStateError) as exc:
            self.ctx.console.line(f"device {device} of {node} not reset: {exc}")
            return
        self.resetting[key] = reset
        self.ctx.ledger.record(
            DeviceResetStarted(node=node, device=device, code=code, reset_s=reset_s)
        )
        self.isolate_device(node, device, f"resetting after {code} (hotReset=2)", level)
        self.ctx.console.line(
            f"device {device} of {node} resetting after {code} ({level}), "
            f"{reset_s:.1f} s out of the pool"
        )

    def reset_wait(self, cmd: Command) -> tuple[float, str] | None:
        """A rung that restarts ranks on the devices they hold waits until every one of those
        devices being reset is done: when, and which devices."""
        if not isinstance(cmd, RestartProcesses | RestartInPlace | RetryOnline):
            return None
        held = {(b.node, d) for b in self.cluster.bindings.values() for d in b.devices}
        now = self.ctx.clock()
        busy = {k: r for k, r in self.resetting.items() if k in held and r.until > now}
        if not busy:
            return None
        what = ", ".join(f"device {d} of {n}" for n, d in sorted(busy))
        return max(r.until for r in busy.values()), what

    def _holder(self, node: str, device: int) -> tuple[str, int] | None:
        """The pod and rank of this job that run on ``device`` of ``node``, if any."""
        pod = self.cluster.pod_on(node)
        binding = self.cluster.bindings.get(pod) if pod else None
        if pod is None or binding is None or device not in binding.devices:
            return None
        return pod, self.ctx.job.ranks_of(pod)[binding.devices.index(device)]

    def _idle_device_fault(self, idle: IdleDeviceFault) -> None:
        """Training is not touched; an isolating level takes the device out of the pool so
        that no pod is placed on it."""
        node, device, code, level = idle.node, idle.device, idle.code, idle.level
        self.ctx.ledger.record_raw(
            "IdleDeviceFault",
            {"node": node, "device": device, "code": code, "level": str(level)},
        )
        self.ctx.console.line(
            f"device {device} of {node} reported {code} ({level}); no rank of the job runs "
            "there, training goes on"
        )
        if level.isolates_device:
            self.isolate_device(node, device, f"fault level {level}", level)
        elif level is FaultLevel.SUB_HEALTH:
            # No pod to switch or reschedule: whatever the strategy, new pods avoid the node.
            self.deprioritise_node(node, f"sub-healthy: {code}")
