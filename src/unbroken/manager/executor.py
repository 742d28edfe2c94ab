"""Carrying out the policy's commands on the embedded cluster.

The policy decides; this module acts: isolating devices and nodes in the scheduler's cluster
state, stopping pods (SIGTERM and a grace period, or SIGKILL), placing pods, starting agents and
telling running agents to restart their ranks under a new rendezvous generation. What it cannot
do (a rung this executor does not implement, a pod that cannot be placed) goes back to the policy
as an event, so a failed rung always falls to the next one.

Every restart is a new *generation*: every rank of the job, in every pod, starts again and joins
the process group under the store prefix of the new generation. In a data-parallel job the
healthy ranks of a broken world cannot continue without process-level recovery, so an in-pod
restart of the faulty pod is a restart of the world's processes, each on its own node, from the
latest checkpoint.

A hot switch (``subHealthyStrategy: hotSwitch``, :meth:`Executor._hot_switch`) moves a pod off a
sub-healthy device before it fails: while training goes on, the backup pod is placed on a free
node other than the pod's own, where a warm spare agent waits (its zygote has imported torch
since the job's start); then every rank stops at the next step boundary, the old pod is
deleted, the healthy pods' ranks rejoin the next generation in their processes and the
backup's ranks take their state from one of them. No step is lost or redone; training stands
still from the pause to the first step the new generation commits, which
:class:`~unbroken.ledger.PodHotSwitched` records beside the preparation time.

The executor owns the scheduler's cluster state and the policy's state; it reaches the job
manager only through :class:`ExecutorHost`. Multi-step rungs (rejoin, last words) are values
advanced by the pure steps of :mod:`unbroken.manager.rungs`. Every outcome it feeds back to the
policy names the policy generation of the rung it belongs to, so an outcome of a rung the policy
has given up is ignored as stale.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from unbroken.agent.image import Image
from unbroken.agent.remote import RemoteChild
from unbroken.chaos import ChaosFault
from unbroken.devices import (
    DeviceFaulted,
    DeviceRecovered,
    DeviceStateError,
    Reset,
    reset_device,
)
from unbroken.faults import CodeTable, Fault, FaultKind, FaultLevel
from unbroken.ledger import (
    CheckpointSaved,
    DecisionMade,
    DeviceIsolated,
    DeviceReset,
    DeviceResetStarted,
    DeviceReturned,
    Ledger,
    NodeDeprioritised,
    NodeIsolated,
    PodHotSwitched,
    PodPlaced,
    PodsStopped,
)
from unbroken.manager.console import Console
from unbroken.manager.detector import IdleDeviceFault, device_fault
from unbroken.manager.elastic import ElasticState
from unbroken.manager.incident import Incident
from unbroken.manager.layout import ClusterLayout, JobLayout, ManagerOptions
from unbroken.manager.planes import PlaneSwitcher
from unbroken.manager.pods import (
    PodProcess,
    Spare,
    agent_argv,
    assume,
    let_go,
    start_pod,
    start_spare,
)
from unbroken.manager.progress import RankView
from unbroken.manager.rungs import (
    STOP_TIMEOUT_S,
    AskWriter,
    LastWords,
    LastWordsFailed,
    NoReplica,
    RankSeen,
    Rejoin,
    RejoinFrom,
    Replacement,
    Saved,
    Wait,
    advance_last_words,
    advance_rejoin,
)
from unbroken.manager.service import CommandQueues, NodeRegistry
from unbroken.policy import (
    BackOff,
    Command,
    DeprioritiseNode,
    DeviceRef,
    DumpLastWords,
    FailJob,
    HotSwitch,
    IsolateDevice,
    IsolateNode,
    JobState,
    PodUnschedulable,
    Recovering,
    RecoverOnSpare,
    RecoveryFailed,
    RescheduleJob,
    ReschedulePods,
    RestartInPlace,
    RestartProcesses,
    RetryOnline,
    Rung,
    Running,
    ScaleIn,
    decide,
)
from unbroken.policy import Event as PolicyEvent
from unbroken.policy import FaultDetected as PolicyFaultDetected
from unbroken.policy.planes import PlaneConfig
from unbroken.protocol.messages import (
    CutPlane,
    EndRanks,
    JoinFrom,
    PauseRanks,
    RejoinRanks,
    RestartRanks,
    StopPod,
    WriteLastWords,
)
from unbroken.scheduler import (
    Binding,
    Cluster,
    EscalationPolicy,
    Pending,
    Placement,
    Pod,
    Unschedulable,
    attempt_failed,
    escalation_reason,
    passed_over,
    pending_line,
    place,
    should_escalate,
    start_pending,
)
from unbroken.scheduler import backend as pod_backend
from unbroken.spec.knobs import Strategy


class ExecutorHost(Protocol):
    """What the executor needs of the job manager: the job's live view and a few calls.

    The manager keeps the I/O (the RPC server, the store, the ledger's status); the executor
    owns the scheduler's cluster state and the policy's state, and gets the rest here.
    """

    pods: dict[str, PodProcess]
    incident: Incident | None
    history: list[Fault]
    pending_reason: str

    @property
    def ranks(self) -> Mapping[int, RankView]: ...

    @property
    def generation(self) -> int: ...

    @property
    def master_port(self) -> int: ...

    @property
    def control_address(self) -> str: ...

    @property
    def finished(self) -> bool: ...

    def begin_generation(self, replica_step: int | None) -> int:
        """Start the next rendezvous generation (a fresh store); ``replica_step``: its ranks
        resume at that step from a replica."""
        ...

    def finish(self, succeeded: bool, reason: str) -> None: ...

    @property
    def sim_dir(self) -> Path:
        """Where the ``sim`` health provider keeps the devices' state."""
        ...

    def fault_detected(self, fault: Fault, now: float) -> None: ...


log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Switch:
    """A hot switch under way: ``pod`` leaves ``from_node`` (sub-healthy ``device``) for the
    backup placed at ``bindings``; decided at ``decided_at``, the ranks asked to pause at
    ``paused_at``; ``generation``: the rendezvous generation it began (None until the rejoin
    went out)."""

    fault_id: str
    pod: str
    from_node: str
    device: int | None
    bindings: tuple[Binding, ...]
    decided_at: float
    paused_at: float
    generation: int | None = None

    @property
    def to_node(self) -> str:
        return self.bindings[0].node


#: Starts a placed pod's agent (pod, node, devices, generation) and returns its process;
#: the default starts ``unbroken launch``. The load harness (bench/scale.py) passes one whose
#: agents are simulated elsewhere and register over the real control channel.
PodStarter = Callable[[str, str, tuple[int, ...], int], PodProcess]


class Executor:
    def __init__(
        self,
        host: ExecutorHost,
        *,
        job: JobLayout,
        cluster_layout: ClusterLayout,
        options: ManagerOptions,
        codes: CodeTable,
        chaos: tuple[ChaosFault, ...],
        run_dir: Path,
        secret: str,
        ledger: Ledger,
        console: Console,
        commands: CommandQueues,
        clock: Callable[[], float] = time.time,
        pod_starter: PodStarter | None = None,
    ) -> None:
        self.m = host
        self.pod_starter = pod_starter
        self.clock = clock
        self.job = job
        self.cl = cluster_layout
        self.fh = job.fault_handling
        self.opt = options
        self.codes = codes
        self.chaos = chaos
        self.run_dir = run_dir
        self.secret = secret
        self.ledger = ledger
        self.console = console
        self.commands = commands
        #: The scheduler's view of nodes, devices and pod bindings: changed only here.
        self.cluster = Cluster.of(
            {n: cluster_layout.devices_per_node for n in cluster_layout.nodes}
        )
        #: Devices the health provider reports faulty now, with their codes.
        self.faulty_devices: dict[tuple[str, int], str] = {}
        #: Devices being reset (``-hotReset=2``), until they report healthy.
        self.resetting: dict[tuple[str, int], Reset] = {}
        #: The policy's state, fed only here.
        self.policy_state: JobState = Running()
        #: The policy generation of the rung being carried out, and of the rung that began
        #: each rendezvous generation: outcome events name it, so the policy can tell a stale
        #: outcome (of a rung given up) from a current one.
        self._rung: int | None = None
        self._rung_of: dict[int, int | None] = {}
        self._queue: list[PolicyEvent] = []
        self._deciding = False
        #: The multi-step rungs under way (:mod:`unbroken.manager.rungs`).
        self.pending_rejoin: Rejoin | None = None
        self.pending_dump: LastWords | None = None
        #: The hot switch under way, from its decision to its first committed step.
        self.switch: Switch | None = None
        #: Warm spare agents by node (see :meth:`keep_spares`); UNBROKEN_STANDBY=0: none.
        self.spares: dict[str, Spare] = {}
        self.use_spares = os.environ.get("UNBROKEN_STANDBY", "1") != "0"
        #: Nodes of hosts that joined (``unbroken serve``): their pods start there, remotely.
        self.remote_nodes: NodeRegistry | None = None
        self._spares_checked_at = 0.0
        #: The node image agents are forked from (:meth:`start_image`); None: cold agents.
        self.image: Image | None = None
        self.unplaced: tuple[str, ...] | None = None  # pods waiting for room to be placed
        #: Pods of pod-level rescheduling pending for room, tried again once per scheduler
        #: session; after ``escalation.sessions`` failed sessions the rung fails and the job
        #: is rescheduled as a whole (:mod:`unbroken.scheduler.escalation`).
        self.pending: Pending | None = None
        self.escalation = EscalationPolicy()
        #: Commands held back by a ``BackOff`` (a fault recurred without progress): when they
        #: are due, and what they are. A newer rung's decision replaces them.
        self.held: tuple[float, tuple[Command, ...]] | None = None
        self._next_placement_at = 0.0
        #: Elastic training: the pods the job scaled in without, and a change under way.
        self.elastic = ElasticState(
            job, job.min_pods if job.min_pods is not None else len(job.pods)
        )
        self._scale_out_checked_at = 0.0
        #: Pods of a scale-in that first wait for room to be placed again: until when, and
        #: the rung that waits.
        self.pending_room: tuple[tuple[str, ...], float, int | None] | None = None
        self._drop_nodes: dict[str, str] = {}
        #: Link failover between network planes (MS_ENABLE_TFT TSP:1): every rank regroups
        #: over another plane in its own process (unbroken.manager.planes).
        self.planes = PlaneSwitcher(
            PlaneConfig(enabled=self.fh.link_failover),
            ledger,
            console,
            busy=self._plane_switch_waits,
            cut=self._cut_plane,
            begin=lambda now: self._rejoin(replace={}, now=now),
        )

    # ---- the policy -------------------------------------------------------------------
    def policy(self, event: PolicyEvent, now: float) -> None:
        """Feed an event to the policy and carry out its commands (iteratively: a command
        that fails feeds a new event, handled after the current decision's commands)."""
        if isinstance(event, PolicyFaultDetected) and self._plane_takes(event.fault, now):
            return
        self._queue.append(event)
        if self._deciding:
            return
        self._deciding = True
        try:
            self._decide_queued(now)
        finally:
            self._deciding = False

    def _decide_queued(self, now: float) -> None:
        while self._queue and not self.m.finished:
            ev = self._queue.pop(0)
            before = self.policy_state
            d = decide(before, ev, self.fh, now)
            self.policy_state = d.state
            self._rung = d.state.generation if isinstance(d.state, Recovering) else None
            if self.pending_rejoin is not None and self.stale(self.pending_rejoin.rung):
                # The rung that paused the ranks was given up: its rejoin must not go out
                # beside what the new rung does. (Last words under way are kept: the new
                # decision's commands wait for them, see _run.)
                self.console.line("the rejoin under way is dropped: its rung was given up")
                self.pending_rejoin = None
            if self.held is not None and _new_rung(before, d.state):
                self.held = None  # the commands held back were for a rung given up
            self._switch_given_up(before, d.state, d.reason)
            if not d.commands and not _sub_health_answered(before, ev):
                continue
            strategy = str(d.state.rung) if isinstance(d.state, Recovering) else "none"
            inc = self.m.incident
            if inc is not None:
                inc.strategy = strategy
            self.ledger.record(
                DecisionMade(
                    fault_id=inc.fault_id if inc else "",
                    strategy=strategy,
                    commands=tuple(repr(c) for c in d.commands),
                    reason=d.reason,
                )
            )
            wait = ""
            if isinstance(d.state, Recovering) and d.state.deadline_at > now:
                wait = (
                    f"; {strategy} has {d.state.deadline_at - now:.0f} s to commit a step, "
                    "then the next rung is tried"
                )
            self.console.line(f"decision: {strategy}: {d.reason}{wait}")
            self._run(d.commands, now)
        if (
            isinstance(self.policy_state, Running)
            and self.m.incident is not None
            and self.planes.switch is None  # a failover's incident ends with its first step
        ):
            # The fault needed no recovery (recorded, ignored, or a hot switch not possible or
            # given up): training goes on and no incident is open.
            self.m.incident = None

    def _plane_takes(self, fault: Fault, now: float) -> bool:
        """Whether a collective's failure is the active plane's, failed over from (the
        recovery ladder does not see it)."""
        if fault.kind is not FaultKind.LINK or isinstance(self.policy_state, Recovering):
            return False
        if not self.planes.collective_failed(fault.describe(), now):
            return False
        if self.m.incident is not None:
            self.m.incident.strategy = "link-failover"
        return True

    def _switch_given_up(self, before: JobState, after: JobState, reason: str) -> None:
        """A hot switch the policy gave up (it failed, passed its deadline, or a stopping
        fault came) is over: what follows is the new decision's."""
        sw = self.switch
        if sw is None or not (isinstance(before, Recovering) and before.rung is Rung.HOT_SWITCH):
            return
        if isinstance(after, Recovering) and after.generation == before.generation:
            return
        self.switch = None
        self.console.line(f"hot switch of {sw.pod} given up: {reason}")

    def _hold_ranks(self, skip: Sequence[str]) -> None:
        """A decision whose orders come later (a back-off, a pod pending for room) is heard
        by the ranks at once as a pause: stopped ranks then wait past their decision wait
        (``MINDIO_WAIT_MINDX_TIME``) for the orders, up to the command timeout."""
        for p in self.m.pods.values():
            if p.pod not in skip and p.alive and not p.lost:
                self.commands.send(p.pod, p.pid, PauseRanks())

    def _run(self, commands: Sequence[Command], now: float) -> None:
        """Carry out ``commands`` in order. Last words being written hold back the commands
        after them (the newest decision's, when another came meanwhile) until they are
        done or have failed: a stop must not end the rank that writes them."""
        for i, cmd in enumerate(commands):
            if self.m.finished:
                return
            if self.pending_dump is not None:
                self.pending_dump = replace(self.pending_dump, then=tuple(commands[i:]))
                return
            waits = self._reset_wait(cmd)
            if waits is not None:
                until, what = waits
                self.held = (until, tuple(commands[i:]))
                self.console.line(
                    f"{type(cmd).__name__} waits {until - now:.1f} s for the reset of {what} "
                    "(hotReset=2: a device is reset before it is used again)"
                )
                return
            if isinstance(cmd, RecoverOnSpare):
                # The pods of one decision move together: one placement, one rejoin (a rack's
                # pods moved one by one would each find the others' agents gone).
                if not any(isinstance(c, RecoverOnSpare) for c in commands[:i]):
                    moved = [c for c in commands[i:] if isinstance(c, RecoverOnSpare)]
                    self._recover_on_spare(moved, now)
                continue
            if isinstance(cmd, BackOff):
                self.held = (now + cmd.delay_s, tuple(commands[i + 1 :]))
                self._hold_ranks(())
                self.console.line(
                    f"backing off {cmd.delay_s:.0f} s before recovering (the fault recurred "
                    "without progress)"
                )
                return
            self.execute(cmd, now)

    def _reset_wait(self, cmd: Command) -> tuple[float, str] | None:
        """A rung that restarts ranks on the devices they hold waits until every one of those
        devices being reset is done: when, and which devices."""
        if not isinstance(cmd, RestartProcesses | RestartInPlace | RetryOnline):
            return None
        held = {(b.node, d) for b in self.cluster.bindings.values() for d in b.devices}
        busy = {k: r for k, r in self.resetting.items() if k in held and r.until > self.clock()}
        if not busy:
            return None
        what = ", ".join(f"device {d} of {n}" for n, d in sorted(busy))
        return max(r.until for r in busy.values()), what

    def poll_held(self, now: float) -> None:
        """Carry out the commands a ``BackOff`` held back, once they are due."""
        if self.held is None or now < self.held[0]:
            return
        commands = self.held[1]
        self.held = None
        if self._deciding:
            self._run(commands, now)
            return
        self._deciding = True
        try:
            self._run(commands, now)
            self._decide_queued(now)
        finally:
            self._deciding = False

    def execute(self, cmd: Command, now: float) -> None:
        match cmd:
            case IsolateDevice(node=node, device=device, level=level):
                self._isolate_device(node, device, f"fault level {level}", level)
            case IsolateNode(node=node):
                self._isolate_node(node, "node lost")
            case DeprioritiseNode(node=node, reason=reason):
                self._deprioritise_node(node, reason)
            case RestartProcesses():
                self._restart_in_place()
            case ReschedulePods(isolate_devices=devs, isolate_nodes=nodes):
                self._isolate_all(devs, nodes)
                self._reschedule(cmd)
            case RescheduleJob(isolate_devices=devs, isolate_nodes=nodes):
                self._isolate_all(devs, nodes)
                self.elastic = self.elastic.abandoned()  # the whole job starts again
                self._reschedule(cmd)
            case FailJob(reason=reason):
                self.m.finish(False, reason)
            case RetryOnline(ranks=ranks):
                self._rejoin(replace={}, suspect=tuple(ranks), now=now)
            case RestartInPlace(pod=pod, ranks=ranks):
                self._rejoin(replace={pod: tuple(ranks) or self.job.ranks_of(pod)}, now=now)
            case RecoverOnSpare():
                self._recover_on_spare([cmd], now)
            case DumpLastWords(timeout_s=timeout_s):
                self._dump(now, timeout_s)
            case HotSwitch(pod=pod, node=node, device=device):
                self._hot_switch(pod, node, device, now)
            case ScaleIn(pod=pod, wait_s=wait_s):
                self._scale_in(pod, now, wait_s)
            case BackOff():
                pass  # held by _run: it holds back the commands after it
            case _:
                self._queue.append(
                    RecoveryFailed(
                        reason=f"{type(cmd).__name__} is not carried out by the embedded "
                        "executor in this version",
                        at=now,
                        generation=self._rung,
                    )
                )

    # ---- process-level recovery ---------------------------------------------------------
    def in_process_recovery(self) -> bool:
        """Whether every rank's worker can leave a broken group and be repaired in process."""
        return bool(self.m.ranks) and all(v.recoverable for v in self.m.ranks.values())

    def healthy_rank_left(self, faults: Sequence[Fault]) -> bool:
        """Whether a live rank outside the faults is left to be the replica source (looked
        for pod by pod, and only until one is found: 80k ranks at 10k nodes)."""
        named = {r for f in faults for r in f.ranks}
        whole_pods = {f.pod for f in faults if f.pod is not None and not f.ranks}
        lost_nodes = {f.node for f in faults if f.kind is FaultKind.NODE_LOST}
        for pod in self.m.pods.values():
            if pod.lost or not pod.alive or pod.pod in whole_pods or pod.node in lost_nodes:
                continue
            for r in self.job.ranks_of(pod.pod):
                v = self.m.ranks.get(r)
                if v is not None and v.alive and r not in named:
                    return True
        return False

    def _seen(self) -> dict[int, RankSeen]:
        """Every rank as the rung steps need to see it."""
        out = {}
        for r, v in self.m.ranks.items():
            pod_name = self.job.pod_of_rank(r)
            pod = self.m.pods.get(pod_name or "")
            out[r] = RankSeen(
                rank=r,
                pod=pod_name,
                alive=v.alive,
                pod_up=pod is not None and not pod.lost and pod.alive,
                pod_known=pod is not None and not pod.lost,
                stopping=v.phase == "stopping",
                committed=v.committed,
                dumped_step=v.dumped_step,
                dumped_at=v.dumped_at,
                dump_failed_at=v.dump_failed_at,
            )
        return out

    def _a_healthy_rank_runs(self, pr: Rejoin) -> bool:
        """Whether a rank the rejoin waits for has not stopped yet (the first one found)."""
        return any(
            v.alive
            and v.phase != "stopping"
            and r not in pr.lost
            and self.job.pod_of_rank(r) not in pr.skip_pods
            for r, v in self.m.ranks.items()
        )

    def ranks_seen(self) -> dict[int, RankSeen]:
        """Every rank as the multi-step operations see it."""
        return self._seen()

    def rejoin_in_place(self, now: float) -> None:
        """Every rank, stopped or stopping at a step boundary, rejoins a new generation in its
        own process with its own state (after an online stress test that found nothing)."""
        self._rejoin(replace={}, now=now)

    def _rejoin(
        self,
        replace: Mapping[str, tuple[int, ...]],
        now: float,
        suspect: tuple[int, ...] = (),
        skip_pods: tuple[str, ...] = (),
        replacement: Replacement | None = None,
        leaving: tuple[int, ...] = (),
    ) -> None:
        """Process-level recovery, first half: every healthy rank stops at a step boundary
        (``pause``; ranks whose collective already failed are stopped anyway). The second half,
        :meth:`poll_rejoin`, sends the rejoin once they all report ``stopping``, so the replica
        source and its step are known exactly rather than from a heartbeat of a moment ago."""
        dead = [
            p.pod
            for p in self.m.pods.values()
            if (not p.alive or p.lost) and p.pod not in skip_pods
        ]
        if dead:
            self._queue.append(
                RecoveryFailed(
                    reason=f"pod(s) {', '.join(dead)} have no running agent",
                    at=now,
                    generation=self._rung,
                )
            )
            return
        lost = {r for ranks in replace.values() for r in ranks} | set(suspect)
        for pod, ranks in replace.items():
            if pod in self.m.pods:
                self.commands.send(pod, self.m.pods[pod].pid, EndRanks(tuple(ranks)))
        for p in self.m.pods.values():
            if p.pod not in skip_pods:
                self.commands.send(p.pod, p.pid, PauseRanks())
        self.pending_rejoin = Rejoin(
            replace=dict(replace),
            lost=frozenset(lost),
            skip_pods=skip_pods,
            deadline_at=now + STOP_TIMEOUT_S,
            rung=self._rung,
            replacement=replacement,
            leaving=frozenset(leaving),
        )

    def _plane_switch_waits(self) -> bool:
        """A plane switch waits for a recovery, a rejoin, last words or a hot switch."""
        return (
            isinstance(self.policy_state, Recovering)
            or self.pending_rejoin is not None
            or self.pending_dump is not None
            or self.switch is not None
            or self.m.finished
        )

    def _cut_plane(self, plane: str) -> None:
        for p in self.m.pods.values():
            if p.alive and not p.lost:
                self.commands.send(p.pod, p.pid, CutPlane(plane))

    def poll_rejoin(self, now: float) -> None:
        pr = self.pending_rejoin
        if pr is None:
            return
        if now < pr.deadline_at and self._a_healthy_rank_runs(pr):
            return  # waited for, without seeing all 80k ranks every tick (advance_rejoin's Wait)
        match advance_rejoin(pr, self._seen().values(), now):
            case Wait():
                return
            case NoReplica(reason=reason):
                self.pending_rejoin = None
                self.policy(RecoveryFailed(reason=reason, at=now, generation=pr.rung), now)
                return
            case RejoinFrom(source=source, step=step, all_stopped=all_stopped):
                self.pending_rejoin = None
        if not all_stopped:
            self.console.line("not every healthy rank stopped in time; rejoining anyway")
        if pr.leaving and pr.replacement is not None:
            self._switch_over(pr.replacement)
        gen = self._next_generation(pr.rung, replica_step=step)
        plane = self.planes.rejoin_plane(gen)
        if pr.leaving and self.switch is not None:
            self.switch = replace(self.switch, generation=gen)
        for p in self.m.pods.values():
            if p.pod in pr.skip_pods:
                continue
            p.generation = gen
            self.commands.send(
                p.pod,
                p.pid,
                RejoinRanks(
                    generation=gen,
                    master_port=self.m.master_port,
                    source=source,
                    step=step,
                    replace=tuple(pr.replace.get(p.pod, ())),
                    world=self.elastic.world if self.elastic.shrunk else (),
                    plane=plane,
                ),
            )
        self.elastic = self.elastic.began(gen)
        what = ", ".join(f"ranks {list(r)} of {p}" for p, r in pr.replace.items())
        self.console.line(
            f"generation {gen}: healthy processes rejoin in place"
            + (f"; new processes for {what}" if what else "")
            + f"; state from rank {source} (step {step})"
        )
        if pr.replacement is not None:
            self._start_replacement(pr.replacement, gen, JoinFrom(source=source, step=step))

    # ---- elastic training --------------------------------------------------------------
    def world_size(self) -> int:
        """Ranks in the current world (fewer than the job's while it is scaled in)."""
        return self.elastic.world_size

    def elastic_refusal(self, faults: Sequence[Fault]) -> str | None:
        """Why the job cannot scale in without the faults' pods (None: it can)."""
        return self.elastic.refusal(tuple(dict.fromkeys(f.pod for f in faults if f.pod)))

    def _scale_in(self, pod: str, now: float, wait_s: float = 0.0) -> None:
        """``elastic-training``: the lost pod leaves the world; the other pods' ranks stop at
        a step boundary and rejoin the next generation in their processes at the smaller
        world size (:meth:`poll_rejoin` sends the new world with the rejoin). With
        ``wait_s``, the pod first pends that long for room (:meth:`poll_room`)."""
        refusal = self.elastic.refusal((pod,))
        if refusal is not None:
            self._queue.append(
                RecoveryFailed(reason=f"cannot scale in: {refusal}", at=now, generation=self._rung)
            )
            return
        node = self.m.pods[pod].node if pod in self.m.pods else ""
        if wait_s > 0:
            self._stop((pod,), None)
            pending = self.pending_room
            pods = (*pending[0], pod) if pending is not None else (pod,)
            self.pending_room = (pods, now + wait_s, self._rung)
            self._drop_nodes[pod] = node
            self._hold_ranks(pods)  # until the pod is placed or dropped
            self.console.line(
                f"no room to place {pod}: it pends up to {wait_s:.0f} s "
                "(wait-reschedule-timeout) for a node before the job scales in without it"
            )
            return
        self._drop(pod, node, now)

    def poll_room(self, now: float) -> None:
        """Pods pending before a scale-in: placed and recovered when room came, dropped
        when their wait is over."""
        if self.pending_room is None:
            return
        pods, until, rung = self.pending_room
        if self.stale(rung):
            self.pending_room = None
            return
        wanted = [Pod(name=p, devices_needed=self.job.nproc_per_node) for p in pods]
        result = place(self.cluster, wanted, self.warm_nodes(pods))
        if not isinstance(result, Unschedulable):
            self.pending_room = None
            self.cluster = self.cluster.bind(result.bindings)
            self.console.line(
                f"room for {', '.join(pods)} within wait-reschedule-timeout: recovered on "
                f"{', '.join(b.node for b in result.bindings)} instead of scaling in"
            )
            lost = tuple(sorted(r for p in pods for r in self.job.ranks_of(p)))
            self._rejoin(
                replace={},
                now=now,
                suspect=lost,
                replacement=Replacement(pod=pods[0], bindings=result.bindings),
            )
            return
        if now < until:
            return
        self.pending_room = None
        self.console.line(
            f"no room for {', '.join(pods)} within wait-reschedule-timeout: scaling in"
        )
        for pod in pods:
            self._drop(pod, self._drop_nodes.pop(pod, ""), now)

    def _drop(self, pod: str, node: str, now: float) -> None:
        before = self.elastic.world_size
        self._stop((pod,), None)
        inc = self.m.incident
        self.elastic = self.elastic.drop(pod, node, now, inc.fault_id if inc else "")
        self.console.line(
            f"scaling in: {pod} dropped (no node to place it on); world size {before} -> "
            f"{self.elastic.world_size} (minimum {self.elastic.min_pods} pod(s)); scales out "
            "when a node is free again"
        )
        lost = frozenset(self.job.ranks_of(pod))
        pr = self.pending_rejoin
        if pr is not None and pr.rung == self._rung:  # another pod of the same decision
            self.pending_rejoin = replace(pr, lost=pr.lost | lost)
            return
        self._rejoin(replace={}, now=now, suspect=tuple(sorted(lost)))

    def scale_out(self, now: float) -> None:
        """Once room is back for every dropped pod and no recovery is under way, place them
        and scale out at a step boundary: every rank pauses, the world's ranks rejoin the next
        generation at the full size and the new pods' ranks take a replica's state."""
        if (
            not self.elastic.shrunk
            or now < self._scale_out_checked_at
            or self.m.finished
            or not isinstance(self.policy_state, Running)
            or self.m.incident is not None
            or self.pending_rejoin is not None
            or self.pending_dump is not None
            or self.switch is not None
            or self.elastic.scaling is not None
        ):
            return
        self._scale_out_checked_at = now + 0.5
        pods = self.elastic.dropped_pods
        wanted = [Pod(name=p, devices_needed=self.job.nproc_per_node) for p in pods]
        result = place(self.cluster, wanted, self.warm_nodes(pods))
        if isinstance(result, Unschedulable):
            return
        cold = [
            b.node
            for b in result.bindings
            if self.use_spares and (b.node not in self.spares or not self.spares[b.node].alive)
        ]
        if cold:
            # Training goes on while a spare agent (forked from the node image, torch already
            # imported) starts there: the ranks then pause only for the newcomers to join.
            for node in cold:
                self._start_spare(node)
            self._scale_out_checked_at = now + 1.0
            return
        self.cluster = self.cluster.bind(result.bindings)
        before = self.elastic.world_size
        self.elastic = self.elastic.restore(now)
        self.console.line(
            f"scaling out: room for {', '.join(pods)} "
            f"({', '.join(b.node for b in result.bindings)}); world size {before} -> "
            f"{self.elastic.world_size} at the next step boundary"
        )
        self._rejoin(
            replace={}, now=now, replacement=Replacement(pod=pods[0], bindings=result.bindings)
        )

    def generation_committed(self, generation: int, first_commit_at: float, step: int) -> None:
        """Generation ``generation`` committed its first step (``step``): a change of world
        size it began is done, recorded with the time training stood still for it."""
        self.planes.committed(generation, first_commit_at, step)
        self.elastic, done = self.elastic.committed(generation)
        if done is None:
            return
        kind = "ScaledIn" if done.kind == "in" else "ScaledOut"
        took_s = first_commit_at - done.began_at
        self.ledger.record_raw(
            kind,
            {
                "fault_id": done.fault_id,
                "pods": list(done.pods),
                "from_world_size": done.from_size,
                "world_size": done.to_size,
                "generation": generation,
                "step": step,
                "took_s": took_s,
            },
            at=first_commit_at,
        )
        self.console.line(
            f"scaled {done.kind} to world size {done.to_size} (from {done.from_size}): "
            f"step {step} committed by generation {generation}, {took_s:.2f} s after the "
            + ("decision" if done.kind == "in" else "new pod was placed")
        )

    # ---- last words (dump) -----------------------------------------------------------
    def _incident_faults(self) -> tuple[Fault, ...]:
        faults = getattr(self.policy_state, "faults", ())
        if faults:
            return tuple(faults)
        return (self.m.incident.fault,) if self.m.incident is not None else ()

    def _lost_ranks(self, faults: Sequence[Fault]) -> set[int]:
        """Ranks whose state the faults took or made suspect."""
        lost: set[int] = set()
        for f in faults:
            lost.update(f.ranks)
            if f.pod is not None and not f.ranks:
                lost.update(self.job.ranks_of(f.pod))
            if f.kind is FaultKind.NODE_LOST and f.node is not None:
                for p in self.m.pods.values():
                    if p.node == f.node:
                        lost.update(self.job.ranks_of(p.pod))
        return lost

    def _dump(self, now: float, timeout_s: float) -> None:
        """``dump``, first half: the lost ranks end (a hung one holds its peers inside a
        collective), every other rank stops at a step boundary. :meth:`poll_dump` then asks
        the most advanced healthy replica for its last words and, once they are written (or
        have failed), carries out the commands that followed."""
        lost = self._lost_ranks(self._incident_faults())
        for p in self.m.pods.values():
            if not p.alive or p.lost:
                continue
            mine = [r for r in self.job.ranks_of(p.pod) if r in lost]
            if mine:
                self.commands.send(p.pod, p.pid, EndRanks(tuple(mine)))
            self.commands.send(p.pod, p.pid, PauseRanks())
        self.console.line("last words: healthy ranks stop at a step boundary")
        self.pending_dump = LastWords(
            lost=frozenset(lost),
            stop_deadline_at=now + STOP_TIMEOUT_S,
            deadline_at=now + timeout_s,
            began_at=now,
            rung=self._rung,
        )

    def poll_dump(self, now: float) -> None:
        pd = self.pending_dump
        if pd is None:
            return
        pd, step = advance_last_words(pd, self._seen(), now)
        self.pending_dump = pd
        match step:
            case Wait():
                pass
            case AskWriter(rank=rank, step=at_step):
                pod = self.m.pods[self.job.pod_of_rank(rank) or ""]
                self.commands.send(pod.pod, pod.pid, WriteLastWords(rank))
                self.console.line(f"last words: rank {rank} saves step {at_step}")
            case Saved(rank=rank, step=at_step, dumped_at=dumped_at, took_s=took_s):
                self.ledger.record(
                    CheckpointSaved(step=at_step, path="", duration_s=took_s, last_words=True),
                    at=dumped_at,
                )
                self.console.line(f"last words: rank {rank} saved step {at_step} ({took_s:.2f} s)")
                self._dump_done(now)
            case LastWordsFailed(reason=reason):
                self._dump_done(now, failed=reason)

    def _dump_done(self, now: float, failed: str = "") -> None:
        pd = self.pending_dump
        assert pd is not None
        self.pending_dump = None
        if failed:
            # Not a failure of the rung that follows: it resumes from the periodic checkpoint.
            self.ledger.record_raw("LastWordsFailed", {"reason": failed})
            self.console.line(f"last words failed: {failed}; the periodic checkpoint is used")
        if self._deciding:
            self._run(pd.then, now)
            return
        self._deciding = True
        try:
            self._run(pd.then, now)
            self._decide_queued(now)
        finally:
            self._deciding = False

    def _recover_on_spare(self, moved: Sequence[RecoverOnSpare], now: float) -> None:
        """``recover``: the pods are placed on spare nodes together, and the healthy ranks
        rejoin once with all of them."""
        for cmd in moved:
            self._isolate_all(cmd.isolate_devices, cmd.isolate_nodes)
        pods = tuple(cmd.pod for cmd in moved)
        self._stop(pods, None)
        result = place(
            self.cluster,
            [Pod(name=pod, devices_needed=self.job.nproc_per_node) for pod in pods],
            self.warm_nodes(pods),
        )
        if isinstance(result, Unschedulable):
            self.console.line(f"cannot place {', '.join(pods)}: {result.reason}")
            self._queue.append(PodUnschedulable(pod=pods[0], at=now, generation=self._rung))
            return
        self._say_passed_over(result.bindings)
        self.cluster = self.cluster.bind(result.bindings)
        self._rejoin(
            replace={},
            now=now,
            suspect=tuple(r for pod in pods for r in self.job.ranks_of(pod)),
            replacement=Replacement(pod=pods[0], bindings=result.bindings),
        )

    # ---- hot switch -------------------------------------------------------------------
    def _hot_switch(self, pod: str, node: str | None, device: int | None, now: float) -> None:
        """A hot switch, first half, while training goes on: the backup of ``pod`` is placed
        on a free node other than its own, where a warm spare agent waits; then every rank is
        asked to stop at its next step boundary. :meth:`poll_rejoin` does the switch itself
        once they stopped (:meth:`_switch_over`)."""
        proc = self.m.pods.get(pod)
        from_node = self.cluster.node_of(pod)
        refused = ""
        if proc is None or not proc.alive or proc.lost or from_node is None:
            refused = f"pod {pod} has no running agent"
        elif not self.in_process_recovery():
            refused = "a rank cannot be repaired in process, so no backup can take a replica"
        if refused:
            self._switch_refused(refused, now)
            return
        assert from_node is not None
        # The backup runs beside the old pod until the switch: never on the old pod's node.
        probe = self.cluster.isolate_node(from_node, "the pod being switched")
        warm = [n for n, sp in sorted(self.spares.items()) if sp.alive and n != from_node]
        result = place(
            probe,
            [Pod(name=pod, devices_needed=self.job.nproc_per_node)],
            {pod: warm[0]} if warm else {},
        )
        if isinstance(result, Unschedulable):
            self._switch_refused(f"no free node for the backup pod: {result.reason}", now)
            return
        to_node = result.bindings[0].node
        spare = self.spares.get(to_node)
        if self.use_spares and (spare is None or not spare.alive):
            self._start_spare(to_node)
            warm_note = "a spare agent started there now"
        elif spare is not None:
            warm_note = f"its warm spare agent (pid {spare.proc.pid}) waiting there"
        else:
            warm_note = "its agent starts cold at the switch (no spare agents)"
        inc = self.m.incident
        self.switch = Switch(
            fault_id=inc.fault_id if inc is not None else "",
            pod=pod,
            from_node=from_node,
            device=device,
            bindings=result.bindings,
            decided_at=now,
            paused_at=self.clock(),
        )
        where = f"device {device} of {node}" if device is not None and node else from_node
        self.console.line(
            f"hot switch of {pod} off sub-healthy {where}: backup on {to_node} ({warm_note}); "
            "every rank stops at its next step boundary"
        )
        self._rejoin(
            replace={},
            now=now,
            leaving=self.job.ranks_of(pod),
            replacement=Replacement(pod=pod, bindings=result.bindings),
        )

    def _switch_refused(self, why: str, now: float) -> None:
        self._queue.append(
            RecoveryFailed(reason=f"hot switch refused: {why}", at=now, generation=self._rung)
        )

    def _switch_over(self, r: Replacement) -> None:
        """Every rank stopped at a step boundary: the old pod is deleted, its sub-healthy
        device taken out of the pool, and the backup bound to its node (its agent starts with
        the rejoin, :meth:`_start_replacement`)."""
        sw = self.switch
        self._stop((r.pod,), None)
        if sw is not None and sw.device is not None:
            self._isolate_device(sw.from_node, sw.device, "sub-healthy (hot switch)")
        self.cluster = self.cluster.bind(r.bindings)

    def switch_done(self, generation: int, first_commit_at: float, step: int) -> None:
        """The generation a hot switch began committed its first step: the switch is done."""
        sw = self.switch
        if sw is None or sw.generation != generation:
            return
        self.switch = None
        prepare_s = sw.paused_at - sw.decided_at
        switch_s = first_commit_at - sw.paused_at
        self.ledger.record(
            PodHotSwitched(
                fault_id=sw.fault_id,
                pod=sw.pod,
                from_node=sw.from_node,
                to_node=sw.to_node,
                generation=generation,
                step=step,
                prepare_s=prepare_s,
                switch_s=switch_s,
            ),
            at=first_commit_at,
        )
        self.console.line(
            f"hot switch of {sw.pod} from {sw.from_node} to {sw.to_node} done: training stood "
            f"still {switch_s:.2f} s (prepared in {prepare_s:.2f} s while it went on), step "
            f"{step} committed by generation {generation}"
        )

    def _start_replacement(self, r: Replacement, gen: int, join: JoinFrom) -> None:
        """``recover``, once the rejoin is out: the replacement pod's agent starts, its ranks
        joining generation ``gen`` with their state from the replica."""
        for b in r.bindings:
            self.ledger.record(PodPlaced(pod=b.pod, node=b.node, devices=b.devices, generation=gen))
            self.console.line(f"replacement pod {b.pod} placed on {b.node}")
            self._start_agent(b.pod, b.node, b.devices, gen)
            self.m.pods[b.pod].join = join
        if self.m.incident is not None:
            self.m.incident.awaiting_replacement = {b.pod for b in r.bindings}

    # ---- isolation --------------------------------------------------------------------
    def _isolate_all(self, devs: tuple[DeviceRef, ...], nodes: tuple[str, ...]) -> None:
        for d in devs:
            self._isolate_device(d.node, d.device, "fault")
        for n in nodes:
            self._isolate_node(n, "node lost")

    def return_node(self, node: str) -> str:
        """A node taken out of the pool is back (``unbroken inject node --clear``): pods may
        be placed on it again (an elastic job scales out onto it)."""
        if node not in self.cluster.isolated_nodes:
            raise ValueError(f"node {node} is not out of the pool; nothing to clear")
        if any(p.node == node and p.alive and not p.lost for p in self.m.pods.values()):
            raise ValueError(f"node {node} still runs a pod of the job")
        self.cluster = self.cluster.return_node(node)
        self.ledger.record_raw("NodeReturned", {"node": node})
        self.console.line(f"node {node} back in the pool")
        return f"node {node} back in the pool"

    def _isolate_device(
        self, node: str, device: int, reason: str, level: FaultLevel | None = None
    ) -> None:
        """Take a device out of the pool. At ``ManuallySeparate`` (``level``, else the level
        of the device's newest fault) it is held until ``unbroken release`` returns it, also
        when it was out of the pool already."""
        newest = next(
            (f for f in reversed(self.m.history) if f.node == node and f.device == device), None
        )
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
        self.ledger.record(DeviceIsolated(node=node, device=device, code=code, reason=reason))
        self.console.line(f"device {device} of {node} isolated ({reason})")

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
            if self.cl.auto_stowing:
                c.release_device(node, device)  # raises: it returns by itself
            self.cluster = c.return_device(node, device)
        else:
            self.cluster = c.release_device(node, device)  # raises unless held
        self.ledger.record(
            DeviceReturned(node=node, device=device, reason="released by an operator")
        )
        self.console.line(f"device {device} of {node} released by an operator: back in the pool")
        return f"device {device} of {node} back in the pool"

    def _deprioritise_node(self, node: str, reason: str) -> None:
        if node in self.cluster.deprioritised_nodes:
            return
        self.cluster = self.cluster.deprioritise_node(node, reason)
        self.ledger.record(NodeDeprioritised(node=node, reason=reason))
        self.console.line(f"node {node} placed on last from now on ({reason})")

    def _isolate_node(self, node: str, reason: str) -> None:
        if node in self.cluster.isolated_nodes:
            return
        self.cluster = self.cluster.isolate_node(node, reason)
        self.ledger.record(NodeIsolated(node=node, reason=reason))
        self.console.line(f"node {node} isolated ({reason})")

    def device_event(self, event: Any) -> None:
        now = self.clock()
        if isinstance(event, DeviceFaulted):
            self.faulty_devices[(event.node, event.device)] = event.code or "unknown"
            found = device_fault(event, self._holder(event.node, event.device), self.codes)
            if self.cl.offline_reset and found.level.resets_device:
                self._reset_device(event.node, event.device, found.code, found.level, now)
            match found:
                case IdleDeviceFault() as idle:
                    self._idle_device_fault(idle)
                case Fault() as fault:
                    self.m.fault_detected(fault, now)
        elif isinstance(event, DeviceRecovered):
            self._device_recovered(event)

    def _device_recovered(self, event: DeviceRecovered) -> None:
        node, device = event.node, event.device
        self.faulty_devices.pop((node, device), None)
        reset = self.resetting.pop((node, device), None)
        if reset is not None:
            self.ledger.record(DeviceReset(node=node, device=device, took_s=event.at - reset.at))
            self.console.line(
                f"device {device} of {node} reset: healthy again after {event.at - reset.at:.2f} s"
            )
        if self.cluster.device_held(node, device):
            self.console.line(
                f"device {device} of {node} reports healthy; it stays out of the pool until "
                "released (ManuallySeparate: unbroken release)"
            )
        elif self.cl.auto_stowing and self.cluster.device_isolated(node, device):
            self.cluster = self.cluster.return_device(node, device)
            self.ledger.record(
                DeviceReturned(node=node, device=device, reason="healthy again (autoStowing)")
            )
            self.console.line(f"device {device} of {node} back in the pool")

    def _reset_device(
        self, node: str, device: int, code: str, level: FaultLevel, now: float
    ) -> None:
        """``-hotReset=2``: a device whose fault level resets it is reset offline, out of the
        pool, before it is used again: no pod is placed on it and no rank restarts on it
        (:meth:`_reset_wait`) until it reports healthy."""
        key = (node, device)
        if key in self.resetting:
            return
        try:
            reset = reset_device(self.m.sim_dir, node, device, now, self.cl.reset_s)
        except (ValueError, DeviceStateError) as exc:
            self.console.line(f"device {device} of {node} not reset: {exc}")
            return
        self.resetting[key] = reset
        self.ledger.record(
            DeviceResetStarted(node=node, device=device, code=code, reset_s=self.cl.reset_s)
        )
        self._isolate_device(node, device, f"resetting after {code} (hotReset=2)", level)
        self.console.line(
            f"device {device} of {node} resetting after {code} ({level}), "
            f"{self.cl.reset_s:.1f} s out of the pool"
        )

    def _holder(self, node: str, device: int) -> tuple[str, int] | None:
        """The pod and rank of this job that run on ``device`` of ``node``, if any."""
        pod = self.cluster.pod_on(node)
        binding = self.cluster.bindings.get(pod) if pod else None
        if pod is None or binding is None or device not in binding.devices:
            return None
        return pod, self.job.ranks_of(pod)[binding.devices.index(device)]

    def _idle_device_fault(self, idle: IdleDeviceFault) -> None:
        """Training is not touched; an isolating level takes the device out of the pool so
        that no pod is placed on it."""
        node, device, code, level = idle.node, idle.device, idle.code, idle.level
        self.ledger.record_raw(
            "IdleDeviceFault",
            {"node": node, "device": device, "code": code, "level": str(level)},
        )
        self.console.line(
            f"device {device} of {node} reported {code} ({level}); no rank of the job runs "
            "there, training goes on"
        )
        if level.isolates_device:
            self._isolate_device(node, device, f"fault level {level}", level)
        elif level is FaultLevel.SUB_HEALTH:
            # No pod to switch or reschedule: whatever the strategy, new pods avoid the node.
            self._deprioritise_node(node, f"sub-healthy: {code}")

    # ---- feasibility ------------------------------------------------------------------
    def spare_node_free(self, needed: int = 1) -> bool:
        """Whether ``needed`` spare nodes are free (one per pod to move)."""
        return len(self.free_nodes()) >= needed

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
        names = dict.fromkeys(f.pod for f in faults if f.pod is not None)
        return [Pod(name=pod, devices_needed=self.job.nproc_per_node) for pod in names]

    # ---- pods -------------------------------------------------------------------------
    def _next_generation(self, rung: int | None, replica_step: int | None = None) -> int:
        """A new rendezvous generation, begun by the rung of policy generation ``rung``."""
        gen = self.m.begin_generation(replica_step)
        self._rung_of[gen] = rung
        return gen

    def stale(self, rung: int | None) -> bool:
        """Whether an outcome of the rung of policy generation ``rung`` is stale: the policy
        has given that rung up for another."""
        state = self.policy_state
        return rung is not None and isinstance(state, Recovering) and state.generation != rung

    def rung_of(self, generation: int) -> int | None:
        """The policy generation of the rung that began rendezvous ``generation`` (None: the
        job's start, or no rung): the generation its outcome events carry."""
        return self._rung_of.get(generation)

    def _restart_in_place(self) -> None:
        dead = [p.pod for p in self.m.pods.values() if not p.alive or p.lost]
        if dead:
            self._queue.append(
                RecoveryFailed(
                    reason=f"pod(s) {', '.join(dead)} have no running agent to restart",
                    at=self.clock(),
                    generation=self._rung,
                )
            )
            return
        gone = tuple(p.name for p in self.job.pods if p.name not in self.m.pods)
        if gone:
            # An earlier rung stopped these pods and released their nodes: restarting only
            # the others in place would leave the job without their ranks, idle. They are
            # placed and started anew, and the others restart into their generation.
            self.console.line(f"pod(s) {', '.join(gone)} stopped by an earlier rung: started anew")
            self.unplaced = None
            self.place_and_start(gone, prefer=self.warm_nodes(gone))
            self._restart_others(gone)
            return
        gen = self._next_generation(self._rung)
        for p in self.m.pods.values():
            p.generation = gen
            p.finished = False
            self.commands.send(
                p.pod,
                p.pid,
                RestartRanks(generation=gen, master_port=self.m.master_port),
            )
        self.console.line(f"generation {gen}: ranks restart in place")

    def _stop(self, pods: tuple[str, ...], grace_s: float | None) -> None:
        procs = [self.m.pods[p] for p in pods if p in self.m.pods]
        for p in procs:
            if p.alive and not p.lost:
                self.commands.send(p.pod, p.pid, StopPod(grace_s=grace_s, success=False))
        deadline = time.monotonic() + (grace_s or 0.0) + 3.0
        for p in procs:
            left = max(0.0, deadline - time.monotonic())
            if p.lost or p.reap(left) is None:
                p.kill_all()
                p.reap(5.0)
            else:
                p.kill_all()  # ranks the agent may have left behind
            p.stopped = True
        if procs:
            self.ledger.record(
                PodsStopped(
                    pods=tuple(p.pod for p in procs),
                    graceful=grace_s is not None,
                    generation=self.m.generation,
                )
            )
        # A pod placed but not yet started (a replacement waiting for the others' pause)
        # holds its node too.
        self.cluster = self.cluster.release_all(pods)
        for p in procs:
            del self.m.pods[p.pod]

    def free_nodes(self) -> list[str]:
        """Nodes no pod is bound to, not isolated, with enough healthy devices for a pod."""
        c = self.cluster
        bound = {b.node for b in c.bindings.values()}
        return [
            n.name
            for n in c.nodes
            if n.name not in bound
            and n.name not in c.isolated_nodes
            and len(c.healthy_devices(n.name)) >= self.job.nproc_per_node
        ]

    def keep_spares(self, now: float) -> None:
        """One warm spare agent per free node while no incident is being handled, from the
        job's start: its zygote imports torch once, beside the pods' own zygotes (one each), so
        that it is warm before the first fault it is kept for. A spare on a node that is no
        longer free is let go."""
        if not self.use_spares or self.m.finished or now < self._spares_checked_at:
            return
        self._spares_checked_at = now + 1.0
        free = self.free_nodes()
        # A node bound to a pod whose agent is not started yet keeps its spare: that pod
        # takes it over.
        running = {p.node for p in self.m.pods.values()}
        for node, spare in list(self.spares.items()):
            if (node not in free and node in running) or self._unfit(node) or not spare.alive:
                del self.spares[node]
                let_go(spare, timeout_s=0.0 if not spare.alive else 5.0)
        if not (
            self.m.incident is None and self.pending_rejoin is None and self.pending_dump is None
        ):
            return
        for node in free:
            if node not in self.spares:
                self._start_spare(node)

    def _start_spare(self, node: str) -> None:
        env = dict(os.environ)
        env.setdefault("OMP_NUM_THREADS", "1")
        spare = start_spare(
            node=node,
            nproc=self.job.nproc_per_node,
            env=env,
            log_dir=self.run_dir / "spares" / node,
            cwd=self.job.workdir,
            image=self.image,
        )
        self.spares[node] = spare
        self.ledger.record_raw("SpareStarted", {"node": node, "pid": spare.proc.pid})

    def _unfit(self, node: str) -> bool:
        c = self.cluster
        return node in c.isolated_nodes or len(c.healthy_devices(node)) < self.job.nproc_per_node

    def warm_nodes(self, pods: Sequence[str]) -> dict[str, str]:
        """Where to place ``pods`` first: free nodes with a warm spare agent, whose ranks
        start without importing torch (the scheduler falls back to any node that fits)."""
        warm = [n for n, s in sorted(self.spares.items()) if s.alive and n in self.free_nodes()]
        return dict(zip(pods, warm, strict=False))

    def end_spare(self, node: str) -> None:
        """The spare on ``node`` dies with it (a node taken down)."""
        spare = self.spares.pop(node, None)
        if spare is not None and spare.alive:
            spare.proc.kill()
            spare.proc.wait()

    @property
    def store_host(self) -> str:
        """Where ranks reach the rendezvous store: 127.0.0.1, or the control plane's address
        when pods run on other hosts."""
        if self.remote_nodes is None:
            return "127.0.0.1"
        return self.m.control_address.rpartition(":")[0]

    def start_image(self) -> None:
        """Start the node image (:mod:`unbroken.agent.image`): torch imported once for every
        agent and zygote of the embedded cluster's nodes, which share this machine. Off with
        the zygotes (UNBROKEN_STANDBY=0); agents start cold where it cannot start. With
        ``UNBROKEN_SHARED_IMAGE=DIR`` (a directory private to the user) runs share one image,
        which ends a while after its last run."""
        if not self.use_spares or self.image is not None:
            return
        env = dict(os.environ)
        env.setdefault("OMP_NUM_THREADS", "1")
        shared = env.pop("UNBROKEN_SHARED_IMAGE", "")
        try:
            if shared:  # runs on this machine share one image (see unbroken.agent.image)
                self.image = Image.shared(Path(shared), env)
            if self.image is None:
                self.image = Image.start(env, self.job.workdir, self.run_dir / "image.log")
        except OSError as exc:
            log.warning("no node image (agents start cold): %s", exc)

    def stop_all(self, grace_s: float | None, success: bool) -> None:
        for node in list(self.spares):
            let_go(self.spares.pop(node))
        for p in list(self.m.pods.values()):
            if p.alive:
                self.commands.send(p.pod, p.pid, StopPod(grace_s=grace_s, success=success))
        deadline = time.monotonic() + (grace_s or 0.0) + 3.0
        for p in list(self.m.pods.values()):
            if p.reap(max(0.0, deadline - time.monotonic())) is None:
                p.kill_all()
                p.reap(5.0)
            else:
                p.kill_all()

    def close_image(self) -> None:
        """Let the node image go (after :meth:`stop_all` and the stores' keepers)."""
        if self.image is not None:
            self.image.close()
            self.image = None

    def _reschedule(self, cmd: ReschedulePods | RescheduleJob) -> None:
        """Pod- or job-level rescheduling, read and ordered by the code the operator uses on
        Kubernetes (:mod:`unbroken.scheduler.backend`), carried out by the local engine."""
        r = pod_backend.replacement([cmd], tuple(p.name for p in self.job.pods), ())
        assert isinstance(r, pod_backend.Replacement)
        pod_backend.carry_out(LocalPods(self), r)

    def _restart_others(self, placed: tuple[str, ...]) -> None:
        """Once ``placed`` run in the new generation, the other pods restart their ranks in
        place into it."""
        if self.m.finished or any(p not in self.m.pods for p in placed):
            return
        gen = self.m.generation
        for name in [p for p in self.m.pods if p not in placed]:
            proc = self.m.pods[name]
            proc.generation = gen
            proc.finished = False
            self.commands.send(
                name,
                proc.pid,
                RestartRanks(generation=gen, master_port=self.m.master_port),
            )

    def place_and_start(self, pods: tuple[str, ...], prefer: Mapping[str, str]) -> None:
        job = self.job
        wanted = [Pod(name=p, devices_needed=job.nproc_per_node) for p in pods]
        result = place(self.cluster, wanted, prefer)
        if isinstance(result, Unschedulable):
            self.console.line(f"cannot place {result.pod}: {result.reason}")
            reason = f"cannot place pod {result.pod}: {result.reason}"
            if self.m.generation == 0 and not self.m.pods and self.m.incident is None:
                self.m.finish(False, reason)
                return
            if not self._could_fit(wanted):
                # Lost nodes do not come back: no device returning to the pool can help.
                self.m.finish(False, reason + "; the nodes left cannot hold the job")
                return
            self.ledger.record_raw("PodUnschedulable", {"pod": result.pod, "reason": reason})
            self.m.pending_reason = reason
            if self._pod_level():
                self._pend(tuple(pods), reason, self.clock())
                return
            if self.unplaced is None:
                rec = self.policy_state
                until = (
                    f" for up to {rec.deadline_at - self.clock():.0f} s"
                    if isinstance(rec, Recovering) and rec.deadline_at > self.clock()
                    else ""
                )
                self.console.line(
                    f"waiting{until} for room for {', '.join(pods)}: a device or node back "
                    "in the pool"
                )
            if self.unplaced is None:
                self.unplaced = tuple(pods)
                self._queue.append(
                    PodUnschedulable(pod=result.pod, at=self.clock(), generation=self._rung)
                )
            return
        self.unplaced = None
        self.pending = None
        self.m.pending_reason = ""
        self._say_passed_over(result.bindings)
        self.cluster = self.cluster.bind(result.bindings)
        gen = (
            self._next_generation(self._rung)
            if self.m.pods or self.m.incident
            else self.m.generation
        )
        for b in result.bindings:
            self.ledger.record(PodPlaced(pod=b.pod, node=b.node, devices=b.devices, generation=gen))
            self.console.line(f"pod {b.pod} placed on {b.node} (devices {list(b.devices)})")
            self._start_agent(b.pod, b.node, b.devices, gen)

    def _say_passed_over(self, bindings: tuple[Binding, ...]) -> None:
        """The console says which deprioritised nodes a placement passed over, and why."""
        skipped = passed_over(self.cluster, Placement(bindings))
        if skipped:
            pods = ", ".join(b.pod for b in bindings)
            why = "; ".join(f"{n} ({reason})" for n, reason in sorted(skipped.items()))
            self.console.line(f"placing {pods}: passed over {why}, placed on last")

    def _could_fit(self, wanted: list[Pod]) -> bool:
        """Whether ``wanted`` could be placed if every isolated device came back healthy (a
        device held at ``ManuallySeparate`` does not come back on its own)."""
        c = self.cluster
        for node, device in list(c.isolated_devices):
            c = c.return_device(node, device)
        return not isinstance(place(c, wanted), Unschedulable)

    def retry_placement(self, now: float) -> None:
        """Pods the scheduler could not place are tried again (a device may have returned to
        the pool, autoStowing); once placed, the other pods restart into their generation."""
        if self.unplaced is None or now < self._next_placement_at:
            return
        self._next_placement_at = now + 1.0
        pods = self.unplaced
        wanted = [Pod(name=p, devices_needed=self.job.nproc_per_node) for p in pods]
        result = place(self.cluster, wanted)
        if self.pending is not None and not self._pod_level():
            self.pending = None  # the policy has left pod-level rescheduling
        if isinstance(result, Unschedulable):
            if self.pending is not None:
                self._pend(pods, f"cannot place pod {result.pod}: {result.reason}", now)
            return
        self.place_and_start(pods, prefer={})
        self._restart_others(pods)

    def _pod_level(self) -> bool:
        """Whether the rung being carried out is pod-level rescheduling."""
        state = self.policy_state
        return isinstance(state, Recovering) and state.rung is Rung.POD_RESCHEDULE

    def _pend(self, pods: tuple[str, ...], reason: str, now: float) -> None:
        """Pods of pod-level rescheduling found no room in a scheduler session: counted, and
        after the policy's number of sessions reported unschedulable, so that the policy
        reschedules the whole job (the reference's 12 sessions of Volcano)."""
        if self.pending is None or self.pending.pods != pods:
            self.pending = start_pending(pods, now)
            self.unplaced = pods
            self.ledger.record_raw(
                "PodsPending",
                {
                    "pods": list(pods),
                    "sessions": self.escalation.sessions,
                    "session_s": self.escalation.session_s,
                    "reason": reason,
                },
            )
            self.console.line(
                f"{', '.join(pods)} pending: placement tried once per scheduler session "
                f"({self.escalation.session_s:g} s); after {self.escalation.sessions} failed "
                "sessions the whole job is rescheduled"
            )
        self.pending = attempt_failed(self.pending, now, self.escalation)
        self.m.pending_reason = f"{reason}; {pending_line(self.pending, self.escalation, now)}"
        if not should_escalate(self.pending, self.escalation):
            return
        pending, self.pending, self.unplaced = self.pending, None, None
        why = escalation_reason(pending, now)
        self.ledger.record_raw(
            "PodsEscalated",
            {
                "pods": list(pending.pods),
                "sessions": pending.attempts,
                "pending_s": now - pending.since_at,
                "reason": why,
            },
        )
        self.console.line(why)
        self._queue.append(PodUnschedulable(pod=pods[0], at=now, generation=self._rung))

    def _start_agent(self, pod: str, node: str, devices: tuple[int, ...], gen: int) -> None:
        m = self.m
        if self.pod_starter is not None:
            m.pods[pod] = self.pod_starter(pod, node, devices, gen)
            return
        layout = next(p for p in self.job.pods if p.name == pod)
        env = dict(os.environ)
        env.update(layout.env)
        env.update(
            {
                "UNBROKEN_CONTROL": m.control_address,
                "UNBROKEN_SECRET": self.secret,
                "UNBROKEN_POD": pod,
                "UNBROKEN_NODE": node,
                "UNBROKEN_DEVICES": ",".join(map(str, devices)),
                "UNBROKEN_RUN_DIR": str(self.run_dir),
                "UNBROKEN_JOB_ID": self.job.job_id,
                "UNBROKEN_HANG_FLOOR_S": str(self.opt.hang_floor_s),
                "UNBROKEN_HANG_FACTOR": str(self.opt.hang_factor),
                "UNBROKEN_HANG_STARTUP_S": str(self.opt.hang_startup_s),
                # MINDIO_WAIT_MINDX_TIME: how long a stopped rank waits for a decision.
                "UNBROKEN_DECISION_WAIT_S": f"{self.fh.decision_wait_s:g}",
                "UNBROKEN_CHAOS": json.dumps(
                    [
                        c.to_json()
                        for c in self.chaos
                        if c.in_rank and self.job.pod_of_rank(c.rank or 0) == pod
                    ]
                ),
                "UNBROKEN_CHAOS_DIR": str(self.run_dir / "chaos"),
                "OMP_NUM_THREADS": env.get("OMP_NUM_THREADS", "1"),
            }
        )
        if Strategy.ELASTIC_TRAINING in self.fh.strategies:
            # Stopped ranks wait for their world as long as the elastic rung may take: the
            # pending pod's wait-reschedule-timeout and the decision wait.
            wait_s = self.fh.decision_wait_s + STOP_TIMEOUT_S
            if Strategy.RECOVER in self.fh.strategies:
                wait_s += self.fh.wait_reschedule_s
            env.setdefault("UNBROKEN_COMMAND_TIMEOUT_S", f"{max(120.0, wait_s):g}")
        argv = agent_argv(
            nproc_per_node=layout.nproc,
            nnodes=len(self.job.pods),
            node_rank=layout.node_rank,
            master_addr=self.store_host,
            master_port=m.master_port,
            max_restarts=self.fh.max_restarts,
            monitor_interval_s=self.fh.monitor_interval_s,
            run_id=self.job.job_id,
            script=self.job.script,
            script_args=self.job.script_args,
        )
        log_path = self.run_dir / "pods" / pod / "agent.log"
        if self.remote_nodes is not None:  # the pod's agent starts on its node's host
            child = RemoteChild(self.remote_nodes, node, pod, argv, env, self.job.workdir, log_path)
            m.pods[pod] = PodProcess(pod, node, gen, child, started_at=time.time())
            return
        spare = self.spares.pop(node, None)
        if spare is not None:
            taken = assume(
                spare,
                pod=pod,
                generation=gen,
                argv=argv,
                env=env,
                log_path=log_path,
                cwd=self.job.workdir,
            )
            if taken is not None:
                m.pods[pod] = taken
                self.ledger.record_raw("SpareTaken", {"node": node, "pod": pod, "pid": taken.pid})
                return
            let_go(spare, timeout_s=0.0)
        m.pods[pod] = start_pod(
            pod=pod,
            node=node,
            generation=gen,
            argv=argv,
            env=env,
            log_path=log_path,
            cwd=self.job.workdir,
            image=self.image,
        )


class LocalPods:
    """The local engine's side of :class:`unbroken.scheduler.backend.PodBackend`: pods are agent
    processes on the embedded cluster's nodes."""

    def __init__(self, executor: Executor) -> None:
        self.x = executor

    def stop_pods(self, pods: tuple[str, ...], grace_s: float | None) -> None:
        """Ask each pod's agent to stop (``grace_s`` after SIGTERM for its ranks), kill what
        is left, free its devices."""
        self.x._stop(pods, grace_s)

    def start_pods(self, pods: tuple[str, ...], avoid_nodes: tuple[str, ...]) -> None:
        """Place the pods (a warm spare agent's node first) and start their agents; the other
        pods' ranks restart in place into the new generation. The isolated nodes are in the
        cluster state the placement reads, so ``avoid_nodes`` adds nothing here."""
        x = self.x
        x.unplaced = None
        x.place_and_start(pods, prefer=x.warm_nodes(pods))
        x._restart_others(pods)


def _sub_health_answered(before: JobState, event: PolicyEvent) -> bool:
    """Whether the decision for ``event`` is shown and recorded even without commands: a
    sub-health fault while training runs (``subHealthyStrategy`` ignores it, or a hot switch is
    not possible now), so that a person sees why training goes on on that device."""
    return (
        isinstance(before, Running)
        and isinstance(event, PolicyFaultDetected)
        and event.fault.level is FaultLevel.SUB_HEALTH
    )


def _new_rung(before: object, after: object) -> bool:
    """Whether the decision from ``before`` to ``after`` began another rung or ended the job."""
    if isinstance(after, Recovering):
        return not isinstance(before, Recovering) or before.generation != after.generation
    return after is not before and not isinstance(after, Running)
