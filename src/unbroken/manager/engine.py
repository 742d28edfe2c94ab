"""The local pod engine: the job's pods as agent processes on the embedded cluster's nodes.

:class:`Engine` owns the pods table (pod name -> :class:`~unbroken.manager.pods.PodProcess`),
and everything that starts or ends a process of the run: the node image agents are forked from,
the warm spare agents kept on free nodes, the rendezvous store of every generation, placing pods
(through the :class:`~unbroken.manager.pool.Pool`) and starting their agents, stopping pods,
restarting ranks in place, and pod-level rescheduling with its escalation to the job level
(:mod:`unbroken.scheduler.escalation`). It is the local side of
:class:`unbroken.scheduler.backend.PodBackend` (:class:`LocalPods`).

What a placement or a restart could not do is returned (:class:`Refused`, :class:`NoRoom`,
:class:`CannotRun`); the executor turns it into the policy's event or the job's end.

Every restart is a new *generation* (:meth:`Engine.begin_generation`): every rank of the job,
in every pod, starts again and joins the process group under a fresh store. In a data-parallel
job the healthy ranks of a broken world cannot continue without process-level recovery, so an
in-pod restart of the faulty pod is a restart of the world's processes, each on its own node,
from the latest checkpoint.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from unbroken.agent.env import CUDA_DEVICES
from unbroken.agent.image import Image, StoreKeeper
from unbroken.agent.mindspore import FRAMEWORK, MINDSPORE
from unbroken.agent.planes import START_PLANE_VAR
from unbroken.devices.nvml import gpu_of_slot
from unbroken.ledger import PodPlaced, PodsStopped
from unbroken.manager.context import Context
from unbroken.manager.generations import Generations
from unbroken.manager.layout import ClusterLayout
from unbroken.manager.pods import (
    PodProcess,
    Spare,
    agent_argv,
    assume,
    let_go,
    start_pod,
    start_spare,
)
from unbroken.manager.pool import Pool
from unbroken.manager.remotepods import RemoteChild, order_env
from unbroken.manager.rungs import STOP_TIMEOUT_S
from unbroken.manager.service import NodeRegistry
from unbroken.policy import RescheduleJob, ReschedulePods
from unbroken.protocol.messages import PauseRanks, RestartRanks, StopPod
from unbroken.rpc.store import host_store
from unbroken.scheduler import (
    Binding,
    EscalationPolicy,
    Pending,
    Unschedulable,
    attempt_failed,
    escalation_reason,
    pending_line,
    should_escalate,
    start_pending,
)
from unbroken.scheduler import backend as pod_backend
from unbroken.spec.knobs import Framework, Strategy

log = logging.getLogger(__name__)

#: Starts a placed pod's agent (pod, node, devices, generation) and returns its process;
#: the default starts ``unbroken launch``. The load harness (bench/scale.py) passes one whose
#: agents are simulated elsewhere and register over the real control channel.
PodStarter = Callable[[str, str, tuple[int, ...], int], PodProcess]
#: Hosts a rendezvous store on (host, port) and returns it (``.port`` is where it listens);
#: raises ``OSError`` when it cannot listen there. The default hosts torch's TCPStore.
StoreOpener = Callable[[str, int], Any]


class ManagerError(RuntimeError):
    """The job could not be started or run; the message says why."""


@dataclass(frozen=True)
class Refused:
    """The rung cannot be carried out: ``reason``."""

    reason: str


@dataclass(frozen=True)
class NoRoom:
    """Pod ``pod`` stays pending (no room now, or its scheduler sessions ran out) at ``at``:
    the policy hears it is unschedulable (``may_pend``: and that it pends for room)."""

    pod: str
    at: float
    may_pend: bool = False


@dataclass(frozen=True)
class CannotRun:
    """The job can never run as laid out (its first placement failed, or the nodes left
    cannot hold it): it fails with ``reason``."""

    reason: str


Outcome = Refused | NoRoom | CannotRun


@dataclass(frozen=True)
class Terms:
    """The rung a placement or restart is carried out for: its policy generation (``rung``),
    whether it is pod-level rescheduling (whose pods pend session by session), until when it
    may wait (``deadline_at``), and whether an incident is open (a placement then begins a
    new generation)."""

    rung: int | None = None
    pod_level: bool = False
    deadline_at: float | None = None
    incident_open: bool = False


class SchedulerPort:
    """A MindSpore generation's rendezvous: the port its Scheduler will listen on (the one
    given, else one free now on ``host``). Nothing is held: the Scheduler binds it."""

    def __init__(self, host: str, port: int) -> None:
        if not port:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind((host, 0))
                port = s.getsockname()[1]
        self.port = port


def let_store_go(store: Any, wait_s: float = 0.0) -> None:
    """A store of :meth:`Engine.host_store` ends: a keeper is told to (and waited for up
    to ``wait_s``), torch's store closes with its last reference."""
    if isinstance(store, StoreKeeper):
        store.close(wait_s)


class Engine:
    """The job's pods and the processes behind them.

    Args:
        ctx: the job, the cluster and the run's sinks.
        pool: the device pool placements bind in.
        generations: the run's generations (begun here, with their store).
        secret: the run's token, given to every agent.
        pod_starter: starts a placed pod's agent (default: ``unbroken launch`` here or on
            the node's joined host).
        store_opener: hosts a generation's rendezvous store (default: torch's TCPStore,
            kept by a process forked from the node image where there is one).
    """

    def __init__(
        self,
        ctx: Context,
        pool: Pool,
        generations: Generations,
        secret: str,
        pod_starter: PodStarter | None = None,
        store_opener: StoreOpener | None = None,
    ) -> None:
        self.ctx = ctx
        self.pool = pool
        self.gens = generations
        self.secret = secret
        self.pod_starter = pod_starter
        #: The plane a generation's agents, started anew, put their ranks on ("": the
        #: host's first): the executor's link failover sets it (unbroken.manager.planes).
        self.start_plane: Callable[[int], str] = lambda generation: ""
        self.store_opener = store_opener
        #: The pods of the job that have an agent, by name: changed only here.
        self.pods: dict[str, PodProcess] = {}
        #: Warm spare agents by node (see :meth:`keep_spares`); UNBROKEN_STANDBY=0: none.
        self.spares: dict[str, Spare] = {}
        #: MindSpore ranks: a generation's "store" is its Scheduler's port, and no agent waits
        #: warm with torch imported (unbroken.agent.mindspore).
        self.mindspore = ctx.job.framework is Framework.MINDSPORE
        self.use_spares = os.environ.get("UNBROKEN_STANDBY", "1") != "0" and not self.mindspore
        #: Nodes of hosts that joined (``unbroken serve``): their pods start there, remotely.
        self.remote_nodes: NodeRegistry | None = None
        #: The node image agents are forked from (:meth:`start_image`); None: cold agents.
        self.image: Image | None = None
        #: Where the control plane and the rendezvous stores listen (``unbroken serve``).
        self.listen: tuple[str, int] = ("127.0.0.1", 0)
        #: The control plane's address, once its server listens.
        self.control_address = ""
        self.store: Any = None
        self._next_store: Any = None  # opened ahead of the next generation (prepare_store)
        self.master_port = 0
        #: Pods waiting for room to be placed, and why (for the status).
        self.unplaced: tuple[str, ...] | None = None
        self.pending_reason = ""
        #: Pods of pod-level rescheduling pending for room, tried again once per scheduler
        #: session; after ``escalation.sessions`` failed sessions the rung fails and the job
        #: is rescheduled as a whole (:mod:`unbroken.scheduler.escalation`).
        self.pending: Pending | None = None
        self.escalation = EscalationPolicy()
        self._next_placement_at = 0.0
        self._spares_checked_at = 0.0

    # ---- generations and their stores ---------------------------------------------------
    def begin_generation(self, rung: int | None, replica_step: int | None = None) -> int:
        """A new rendezvous generation with a fresh store, begun by the rung of policy
        generation ``rung``; ``replica_step``: its ranks resume at that step from a replica."""
        gen = self.gens.begin(self.ctx.clock(), rung, replica_step)
        self.open_store()
        return gen

    def open_store(self, port: int = 0) -> None:
        """A fresh rendezvous store for the next generation.

        torch 2.13's env:// rendezvous under ``TORCHELASTIC_USE_AGENT_STORE`` puts no
        per-attempt prefix on its keys, so a store reused across restarts hands restarted
        ranks the addresses of dead ones (pytorch/pytorch#135712). Every generation gets its
        own store instead; only the first uses the job's ``--master_port`` when it gives one.
        """
        store, self._next_store = (self._next_store, None) if not port else (None, None)
        try:
            store = store or self.host_store(port)
        except Exception as exc:
            raise ManagerError(
                f"cannot open the rendezvous store on {self.listen[0]}:{port}"
                f"{' (--master_port of the job: is the port in use?)' if port else ''}: {exc}"
            ) from None
        let_store_go(self.store)
        self.store = store
        self.master_port = int(store.port)

    def prepare_store(self) -> None:
        """Open the next generation's store now (a rung paused the ranks and waits for them to
        stop): :meth:`open_store` takes it then, instead of opening one while they wait. A
        failure here is left to :meth:`open_store` to report."""
        if self._next_store is not None:
            return
        try:
            self._next_store = self.host_store(0)
        except Exception as exc:
            log.debug("the next generation's store did not open ahead: %s", exc)

    def host_store(self, port: int) -> Any:
        """A store on 127.0.0.1 alone (it has no authentication; see unbroken.rpc.store),
        hosted by a keeper forked from the node image where there is one (torch is imported
        there already, and this process then imports none), else in this process. Raises
        ``OSError`` when it cannot listen there."""
        host = self.listen[0]
        if self.store_opener is not None:
            return self.store_opener(host, port)
        if self.mindspore:  # the node-0 agent's Scheduler listens there
            return SchedulerPort(host, port)
        store = None if self.image is None else self.image.host_store(host, port)
        return host_store(host, port) if store is None else store

    def close_stores(self) -> None:
        """The store's keeper ends (before the image it was forked from)."""
        let_store_go(self.store, wait_s=5.0)
        let_store_go(self._next_store, wait_s=5.0)
        self.store = self._next_store = None

    @property
    def rendezvous(self) -> str:
        """Where a generation's ranks meet: its store, or a MindSpore job's Scheduler."""
        return f"{'scheduler' if self.mindspore else 'store'} {self.listen[0]}:{self.master_port}"

    @property
    def store_host(self) -> str:
        """Where ranks reach the rendezvous store: 127.0.0.1, or the control plane's address
        when pods run on other hosts."""
        if self.remote_nodes is None:
            return "127.0.0.1"
        return self.control_address.rpartition(":")[0]

    # ---- the node image -----------------------------------------------------------------
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
                self.image = Image.start(env, self.ctx.job.workdir, self.ctx.run_dir / "image.log")
        except OSError as exc:
            log.warning("no node image (agents start cold): %s", exc)

    def close_image(self) -> None:
        """Let the node image go (after :meth:`stop_all` and the stores' keepers)."""
        if self.image is not None:
            self.image.close()
            self.image = None

    # ---- orders to every pod ------------------------------------------------------------
    def running(self) -> list[PodProcess]:
        """The pods whose agent runs and is not lost."""
        return [p for p in self.pods.values() if p.alive and not p.lost]

    def pause_all(self, skip: Sequence[str] = ()) -> None:
        """Every running pod's ranks (but ``skip``'s) stop at their next step boundary."""
        self.ctx.commands.send_all(
            (p.pod, p.pid, PauseRanks()) for p in self.running() if p.pod not in skip
        )

    def pause_pods(self, pods: Sequence[str]) -> None:
        """The ranks of ``pods`` (those running) stop at their next step boundary."""
        up = [p for name in pods if (p := self.pods.get(name)) is not None]
        self.ctx.commands.send_all(
            (p.pod, p.pid, PauseRanks()) for p in up if p.alive and not p.lost
        )

    def dead_pods(self, skip: Sequence[str] = ()) -> list[str]:
        """Pods (but ``skip``) whose agent has ended or is lost."""
        return [p.pod for p in self.pods.values() if (not p.alive or p.lost) and p.pod not in skip]

    # ---- stopping -----------------------------------------------------------------------
    def stop(self, pods: Sequence[str], grace_s: float | None) -> None:
        """Ask each pod's agent to stop (``grace_s`` after SIGTERM for its ranks), kill what
        is left, free its devices and drop it from the table."""
        procs = [self.pods[p] for p in pods if p in self.pods]
        for p in procs:
            if p.alive and not p.lost:
                self.ctx.commands.send(p.pod, p.pid, StopPod(grace_s=grace_s, success=False))
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
            self.ctx.ledger.record(
                PodsStopped(
                    pods=tuple(p.pod for p in procs),
                    graceful=grace_s is not None,
                    generation=self.gens.current,
                )
            )
        # A pod placed but not yet started (a replacement waiting for the others' pause)
        # holds its node too.
        self.pool.release(pods)
        for p in procs:
            del self.pods[p.pod]

    def stop_all(self, grace_s: float | None, success: bool) -> None:
        """The run ends: every spare is let go and every pod stopped."""
        for node in list(self.spares):
            let_go(self.spares.pop(node))
        for p in list(self.pods.values()):
            if p.alive:
                self.ctx.commands.send(p.pod, p.pid, StopPod(grace_s=grace_s, success=success))
        deadline = time.monotonic() + (grace_s or 0.0) + 3.0
        for p in list(self.pods.values()):
            if p.reap(max(0.0, deadline - time.monotonic())) is None:
                p.kill_all()
                p.reap(5.0)
            else:
                p.kill_all()

    def take_node_down(self, node: str) -> int:
        """Every process of every pod on ``node`` (and its spare) is killed: a node going
        down. Returns how many processes were killed."""
        killed: list[int] = []
        for p in self.pods.values():
            if p.node == node and p.alive:
                killed += p.kill_all()
        self.end_spare(node)
        return len(killed)

    # ---- restarting in place ------------------------------------------------------------
    def restart_in_place(self, terms: Terms) -> list[Outcome]:
        """In-pod restart: every pod's ranks restart into a new generation from the latest
        checkpoint; pods an earlier rung stopped are placed and started anew."""
        dead = self.dead_pods()
        if dead:
            return [Refused(f"pod(s) {', '.join(dead)} have no running agent to restart")]
        gone = tuple(p.name for p in self.ctx.job.pods if p.name not in self.pods)
        if gone:
            # An earlier rung stopped these pods and released their nodes: restarting only
            # the others in place would leave the job without their ranks, idle. They are
            # placed and started anew, and the others restart into their generation.
            self.ctx.console.line(
                f"pod(s) {', '.join(gone)} stopped by an earlier rung: started anew"
            )
            self.unplaced = None
            return self.start_then_restart_others(gone, self.warm_nodes(gone), terms)
        written = self.gens.last_words_written()
        gen = self.begin_generation(terms.rung)
        self._restart_ranks(list(self.pods), gen, last_words=written)
        self.ctx.console.line(f"generation {gen}: ranks restart in place")
        return []

    def start_then_restart_others(
        self, pods: tuple[str, ...], prefer: Mapping[str, str], terms: Terms
    ) -> list[Outcome]:
        """Place and start ``pods``; once they run in the new generation, the other pods
        restart their ranks in place into it (not when the job cannot run)."""
        out = self.place_and_start(pods, prefer, terms)
        if not any(isinstance(o, CannotRun) for o in out):
            self.restart_others(pods)
        return out

    def restart_others(self, placed: tuple[str, ...]) -> None:
        """Once ``placed`` run in the new generation, the other pods restart their ranks in
        place into it."""
        if any(p not in self.pods for p in placed):
            return
        self._restart_ranks([p for p in self.pods if p not in placed], self.gens.current)

    def _restart_ranks(self, pods: Sequence[str], gen: int, *, last_words: bool = False) -> None:
        order = RestartRanks(generation=gen, master_port=self.master_port, last_words=last_words)
        for name in pods:
            proc = self.pods[name]
            proc.generation = gen
            proc.finished = False
            self.ctx.commands.send(name, proc.pid, order)

    # ---- placing ------------------------------------------------------------------------
    def place_and_start(
        self,
        pods: tuple[str, ...],
        prefer: Mapping[str, str],
        terms: Terms,
    ) -> list[Outcome]:
        """Place ``pods`` and start their agents in a new generation (the job's first when
        no pod runs yet). Without room: the job fails when it can never run; pods of pod-level
        rescheduling pend, session by session; others wait for room (up to the rung's
        deadline, said on the console) and the policy hears of it."""
        ctx = self.ctx
        result = self.pool.place(pods, prefer)
        if isinstance(result, Unschedulable):
            ctx.console.line(f"cannot place {result.pod}: {result.reason}")
            reason = f"cannot place pod {result.pod}: {result.reason}"
            if self.gens.current == 0 and not self.pods and not terms.incident_open:
                return [CannotRun(reason)]
            if not self.pool.could_fit(pods):
                # Lost nodes do not come back: no device returning to the pool can help.
                return [CannotRun(reason + "; the nodes left cannot hold the job")]
            ctx.ledger.record_raw("PodUnschedulable", {"pod": result.pod, "reason": reason})
            self.pending_reason = reason
            if terms.pod_level:
                return self._pend(tuple(pods), reason, ctx.clock())
            if self.unplaced is not None:
                return []
            now = ctx.clock()
            deadline_at = terms.deadline_at
            until = (
                f" for up to {deadline_at - now:.0f} s"
                if deadline_at is not None and deadline_at > now
                else ""
            )
            ctx.console.line(
                f"waiting{until} for room for {', '.join(pods)}: a device or node back in the pool"
            )
            self.unplaced = tuple(pods)
            return [NoRoom(result.pod, ctx.clock())]
        self.unplaced = None
        self.pending = None
        self.pending_reason = ""
        self.pool.bind(result.bindings, say_passed_over=True)
        gen = (
            self.begin_generation(terms.rung)
            if self.pods or terms.incident_open
            else self.gens.current
        )
        for b in result.bindings:
            ctx.ledger.record(PodPlaced(pod=b.pod, node=b.node, devices=b.devices, generation=gen))
            ctx.console.line(f"pod {b.pod} placed on {b.node} (devices {list(b.devices)})")
            self.start_agent(b.pod, b.node, b.devices, gen)
        return []

    def retry_placement(self, now: float, terms: Terms) -> list[Outcome]:
        """Pods the scheduler could not place are tried again (a device may have returned to
        the pool, autoStowing); once placed, the other pods restart into their generation."""
        if self.unplaced is None or now < self._next_placement_at:
            return []
        self._next_placement_at = now + 1.0
        pods = self.unplaced
        result = self.pool.place(pods)
        if self.pending is not None and not terms.pod_level:
            self.pending = None  # the policy has left pod-level rescheduling
        if isinstance(result, Unschedulable):
            if self.pending is not None:
                return self._pend(pods, f"cannot place pod {result.pod}: {result.reason}", now)
            return []
        return self.start_then_restart_others(pods, {}, terms)

    def _pend(self, pods: tuple[str, ...], reason: str, now: float) -> list[Outcome]:
        """Pods of pod-level rescheduling found no room in a scheduler session: counted, and
        after the policy's number of sessions reported unschedulable, so that the policy
        reschedules the whole job (the reference's 12 sessions of Volcano)."""
        ctx, esc = self.ctx, self.escalation
        if self.pending is None or self.pending.pods != pods:
            self.pending = start_pending(pods, now)
            self.unplaced = pods
            ctx.ledger.record_raw(
                "PodsPending",
                {
                    "pods": list(pods),
                    "sessions": esc.sessions,
                    "session_s": esc.session_s,
                    "reason": reason,
                },
            )
            ctx.console.line(
                f"{', '.join(pods)} pending: placement tried once per scheduler session "
                f"({esc.session_s:g} s); after {esc.sessions} failed "
                "sessions the whole job is rescheduled"
            )
        self.pending = attempt_failed(self.pending, now, esc)
        self.pending_reason = f"{reason}; {pending_line(self.pending, esc, now)}"
        if not should_escalate(self.pending, esc):
            return []
        pending, self.pending, self.unplaced = self.pending, None, None
        why = escalation_reason(pending, now)
        ctx.ledger.record_raw(
            "PodsEscalated",
            {
                "pods": list(pending.pods),
                "sessions": pending.attempts,
                "pending_s": now - pending.since_at,
                "reason": why,
            },
        )
        ctx.console.line(why)
        return [NoRoom(pods[0], now)]

    def reschedule(self, cmd: ReschedulePods | RescheduleJob, terms: Terms) -> list[Outcome]:
        """Pod- or job-level rescheduling, read and ordered by the code the operator uses on
        Kubernetes (:mod:`unbroken.scheduler.backend`), carried out by the local engine."""
        r = pod_backend.replacement([cmd], tuple(p.name for p in self.ctx.job.pods), ())
        assert isinstance(r, pod_backend.Replacement)
        local = LocalPods(self, terms)
        pod_backend.carry_out(local, r)
        return local.outcomes

    # ---- starting -----------------------------------------------------------------------
    def start_agent(self, pod: str, node: str, devices: tuple[int, ...], gen: int) -> None:
        """Start ``pod``'s agent on ``node`` for generation ``gen``: a warm spare there takes
        it when one waits, else a new agent (forked from the node image where there is one),
        or on the node's joined host."""
        ctx = self.ctx
        if self.pod_starter is not None:
            self.pods[pod] = self.pod_starter(pod, node, devices, gen)
            return
        job, fh, opt = ctx.job, ctx.fh, ctx.options
        layout = next(p for p in job.pods if p.name == pod)
        env = dict(os.environ)
        env.update(layout.env)
        plane = self.start_plane(gen)
        if plane:
            env[START_PLANE_VAR] = plane
        env.update(
            {
                "UNBROKEN_CONTROL": self.control_address,
                "UNBROKEN_SECRET": self.secret,
                "UNBROKEN_POD": pod,
                "UNBROKEN_NODE": node,
                "UNBROKEN_DEVICES": ",".join(map(str, devices)),
                "UNBROKEN_RUN_DIR": str(ctx.run_dir),
                "UNBROKEN_JOB_ID": job.job_id,
                "UNBROKEN_HANG_FLOOR_S": str(opt.hang_floor_s),
                "UNBROKEN_HANG_FACTOR": str(opt.hang_factor),
                "UNBROKEN_HANG_STARTUP_S": str(opt.hang_startup_s),
                # MINDIO_WAIT_MINDX_TIME: how long a stopped rank waits for a decision.
                "UNBROKEN_DECISION_WAIT_S": f"{fh.decision_wait_s:g}",
                "UNBROKEN_CHAOS": json.dumps(
                    [
                        c.to_json()
                        for c in ctx.chaos
                        if c.in_rank and job.pod_of_rank(c.rank or 0) == pod
                    ]
                ),
                "UNBROKEN_CHAOS_DIR": str(ctx.run_dir / "chaos"),
                "OMP_NUM_THREADS": env.get("OMP_NUM_THREADS", "1"),
            }
        )
        if self.mindspore:
            env[FRAMEWORK] = MINDSPORE
        env.update(pod_gpu_env(ctx.cluster, node, devices))
        if Strategy.ELASTIC_TRAINING in fh.strategies:
            # Stopped ranks wait for their world as long as the elastic rung may take: the
            # pending pod's wait-reschedule-timeout and the decision wait.
            wait_s = fh.decision_wait_s + STOP_TIMEOUT_S
            if Strategy.RECOVER in fh.strategies:
                wait_s += fh.wait_reschedule_s
            env.setdefault("UNBROKEN_COMMAND_TIMEOUT_S", f"{max(120.0, wait_s):g}")
        argv = agent_argv(
            nproc_per_node=layout.nproc,
            nnodes=len(job.pods),
            node_rank=layout.node_rank,
            master_addr=self.store_host,
            master_port=self.master_port,
            max_restarts=fh.max_restarts,
            monitor_interval_s=fh.monitor_interval_s,
            run_id=job.job_id,
            script=job.script,
            script_args=job.script_args,
        )
        log_path = ctx.run_dir / "pods" / pod / "agent.log"
        if self.remote_nodes is not None:  # the pod's agent starts on its node's host
            # Its planned environment and what its agent needs: not this host's environment,
            # nor the secret (the host has its own credentials).
            remote_env = order_env(layout.env, env)
            child = RemoteChild(
                self.remote_nodes, node, pod, argv, remote_env, job.workdir, log_path
            )
            self.pods[pod] = PodProcess(pod, node, gen, child, started_at=time.time())
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
                cwd=job.workdir,
            )
            if taken is not None:
                self.pods[pod] = taken
                ctx.ledger.record_raw("SpareTaken", {"node": node, "pod": pod, "pid": taken.pid})
                return
            let_go(spare, timeout_s=0.0)
        self.pods[pod] = start_pod(
            pod=pod,
            node=node,
            generation=gen,
            argv=argv,
            env=env,
            log_path=log_path,
            cwd=job.workdir,
            image=self.image,
        )

    def start_placed(self, bindings: tuple[Binding, ...], gen: int, what: str = "pod") -> None:
        """Start the agents of pods already bound (a replacement, a backup), recorded."""
        for b in bindings:
            self.ctx.ledger.record(
                PodPlaced(pod=b.pod, node=b.node, devices=b.devices, generation=gen)
            )
            self.ctx.console.line(f"{what} {b.pod} placed on {b.node}")
            self.start_agent(b.pod, b.node, b.devices, gen)

    # ---- warm spares --------------------------------------------------------------------
    def keep_spares(self, now: float, quiet: bool) -> None:
        """One warm spare agent per free node while no incident is being handled
        (``quiet``), from the job's start: its zygote imports torch once, beside the pods' own
        zygotes (one each), so that it is warm before the first fault it is kept for. A spare
        on a node that is no longer free is let go."""
        if not self.use_spares or now < self._spares_checked_at:
            return
        self._spares_checked_at = now + 1.0
        free = self.pool.free_nodes()
        # A node bound to a pod whose agent is not started yet keeps its spare: that pod
        # takes it over.
        running = {p.node for p in self.pods.values()}
        for node, spare in list(self.spares.items()):
            if (node not in free and node in running) or self.pool.unfit(node) or not spare.alive:
                del self.spares[node]
                let_go(spare, timeout_s=0.0 if not spare.alive else 5.0)
        if not quiet:
            return
        for node in free:
            if node not in self.spares:
                self.start_spare(node)

    def start_spare(self, node: str) -> None:
        env = dict(os.environ)
        env.setdefault("OMP_NUM_THREADS", "1")
        spare = start_spare(
            node=node,
            nproc=self.ctx.job.nproc_per_node,
            env=env,
            log_dir=self.ctx.run_dir / "spares" / node,
            cwd=self.ctx.job.workdir,
            image=self.image,
        )
        self.spares[node] = spare
        self.ctx.ledger.record_raw("SpareStarted", {"node": node, "pid": spare.proc.pid})

    def warm(self, node: str) -> bool:
        """Whether a live warm spare agent waits on ``node``."""
        spare = self.spares.get(node)
        return spare is not None and spare.alive

    def warm_nodes(self, pods: Sequence[str]) -> dict[str, str]:
        """Where to place ``pods`` first: free nodes with a warm spare agent, whose ranks
        start without importing torch (the scheduler falls back to any node that fits)."""
        free = self.pool.free_nodes()
        warm = [n for n, s in sorted(self.spares.items()) if s.alive and n in free]
        return dict(zip(pods, warm, strict=False))

    def end_spare(self, node: str) -> None:
        """The spare on ``node`` dies with it (a node taken down)."""
        spare = self.spares.pop(node, None)
        if spare is not None and spare.alive:
            spare.proc.kill()
            spare.proc.wait()


class LocalPods:
    """The local engine's side of :class:`unbroken.scheduler.backend.PodBackend`: pods are agent
    processes on the embedded cluster's nodes. What the starts could not do is kept in
    ``outcomes``."""

    def __init__(self, engine: Engine, terms: Terms) -> None:
        self.engine = engine
        self.terms = terms
        self.outcomes: list[Outcome] = []

    def stop_pods(self, pods: tuple[str, ...], grace_s: float | None) -> None:
        """Ask each pod's agent to stop (``grace_s`` after SIGTERM for its ranks), kill what
        is left, free its devices."""
        self.engine.stop(pods, grace_s)

    def start_pods(self, pods: tuple[str, ...], avoid_nodes: tuple[str, ...]) -> None:
        """Place the pods (a warm spare agent's node first) and start their agents; the other
        pods' ranks restart in place into the new generation. The isolated nodes are in the
        cluster state the placement reads, so ``avoid_nodes`` adds nothing here."""
        e = self.engine
        e.unplaced = None
        self.outcomes += e.start_then_restart_others(pods, e.warm_nodes(pods), self.terms)


def pod_gpu_env(cluster: ClusterLayout, node: str, devices: tuple[int, ...]) -> dict[str, str]:
    """What a device plugin exports to a pod whose device slots are ``devices`` of ``node``: the
    GPUs they run on as ``CUDA_VISIBLE_DEVICES`` (each once, PCI bus order, as NVML counts
    them), and, per local rank, its GPU's index among those (``UNBROKEN_CUDA_DEVICES``: local
    rank ``i`` has device slot ``devices[i]``); nothing on a machine without GPUs."""
    if not cluster.gpus or node not in cluster.nodes:
        return {}
    index = cluster.nodes.index(node)
    per_rank = [gpu_of_slot(index, d, cluster.devices_per_node, cluster.gpus) for d in devices]
    visible = list(dict.fromkeys(per_rank))
    return {
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "CUDA_VISIBLE_DEVICES": ",".join(map(str, visible)),
        CUDA_DEVICES: ",".join(str(visible.index(g)) for g in per_rank),
    }
