"""The job manager: the loop that turns what arrives into facts and decisions.

It runs in the control plane process, never in a training pod, so the death of rank 0's node
takes neither the rendezvous store nor the manager with it. One thread (the loop in
:meth:`JobManager.run`) owns all state; RPC handlers, the device watcher and timers only post
messages to its inbox. The loop hands each message to the part it is for and turns what the
parts return into ledger events and the policy's events:

- agents' messages arrive as typed reports (:mod:`unbroken.protocol.messages`), matched on type;
- :mod:`unbroken.manager.detector` turns reports into faults (DESIGN section 3); agent silence
  is watched by :mod:`unbroken.manager.liveness`, device health by
  :mod:`unbroken.manager.pool`; :mod:`unbroken.manager.incident` records each fault and keeps
  the incident;
- :mod:`unbroken.manager.executor` asks the policy (:func:`unbroken.policy.decide`) with what is
  feasible (:mod:`unbroken.manager.feasible`) and carries its commands out through the engine
  (:mod:`unbroken.manager.engine`: pods, placements, stores), the pool, the in-process rungs
  (:mod:`unbroken.manager.inprocess`), hot switching and elastic training;
- :mod:`unbroken.chaos.injector` injects the faults of ``--chaos`` and ``unbroken inject``.

``docs/recovery-route.md`` follows one fault through these parts, hop by hop. Reports of an
older generation are echoes of a fault already handled. The clock is an argument (``clock``).
"""

from __future__ import annotations

import contextlib
import logging
import queue
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from unbroken.chaos import ChaosFault, InjectKind
from unbroken.chaos.injector import Injector, due
from unbroken.faults import CodeTable, Fault
from unbroken.ledger import (
    CommunicationReady,
    DeviceMemoryFreed,
    FirstStepCommitted,
    JobFailed,
    JobStopped,
    JobSubmitted,
    JobSucceeded,
    Ledger,
    LedgerError,
    ProcessesStarted,
    StateLoaded,
    StepProgress,
)
from unbroken.manager.collector import Collector
from unbroken.manager.console import Console
from unbroken.manager.context import Context
from unbroken.manager.detector import Detector, Where, diverged
from unbroken.manager.endpoints import Endpoints
from unbroken.manager.engine import Engine, ManagerError, PodStarter, StoreOpener
from unbroken.manager.executor import Executor
from unbroken.manager.feasible import feasibility
from unbroken.manager.generations import Generations
from unbroken.manager.hotswitch import HotSwitcher
from unbroken.manager.incident import Incidents
from unbroken.manager.inprocess import InProcess
from unbroken.manager.layout import ClusterLayout, JobLayout, ManagerOptions
from unbroken.manager.liveness import AgentWatch
from unbroken.manager.milestones import CommReady, FirstCommit, Loaded, Milestones, Progress
from unbroken.manager.pods import PodProcess
from unbroken.manager.pool import Pool
from unbroken.manager.progress import RankView, last_words_of_ended, rank_recovered_alone
from unbroken.manager.scaling import Elastic
from unbroken.manager.service import (
    HEARTBEAT_FLOOR_S,
    STREAM_CLOSED,
    STREAM_OPENED,
    CommandQueues,
    Inbound,
    answer,
    heartbeat_interval_s,
    refused,
    silence_timeout_s,
)
from unbroken.manager.sessionless import Sessionless
from unbroken.manager.snapshot import RunOutcome, StatusText, StopRequested, job_status
from unbroken.manager.straggler import StragglerWatch
from unbroken.manager.stress import ManagerStressHost, StressTester
from unbroken.manager.switches import Switches
from unbroken.manager.targets import JobTarget
from unbroken.policy import FaultReported, ReplacementReady, RungSucceeded
from unbroken.policy import Tick as PolicyTick
from unbroken.policy.straggler import StragglerKnobs
from unbroken.protocol.heartbeat import unpack_op_retry
from unbroken.protocol.messages import (
    HEARTBEAT,
    HELLO,
    REPORT,
    AgentHeartbeat,
    AgentHello,
    Event,
    HelloAnswer,
    PlaneCarrierChanged,
    PodFinished,
    PodStopped,
    RankExited,
    RankFailed,
    RankHung,
    RanksRejoined,
    RanksStarted,
    Sender,
    decode_report,
    encode_answer,
)
from unbroken.rpc import ControlServer

__all__ = ["JobManager", "ManagerError", "RunOutcome"]

log = logging.getLogger(__name__)

#: The manager's clock period: timeouts, settling and deadlines are checked this often (no more).
TICK_S = 0.05
#: A heartbeat that changes a rank's phase ticks this soon after the last tick.
PHASE_TICK_S = 0.005
#: How long a lost node is held while other agents are silent, so that a rack that went at once
#: is one incident (:meth:`Detector.settle`): a small job finds its nodes lost a heartbeat
#: interval apart (0.1 s); a busy server sees a large one's streams break up to ~1 s apart.
GATHER_S = 1.0

# Messages that come from the network (agents, ``unbroken inject``), not from this process.
_PEER_METHODS = frozenset({HELLO, HEARTBEAT, REPORT, "Inject", "StressTest", "Release", "Link"})
#: Messages that wait for the next tick (see ``run``); any other is acted on at once.
_ROUTINE = frozenset({HEARTBEAT, STREAM_OPENED, STREAM_CLOSED})


class JobManager:
    """Runs one job on the embedded cluster until it succeeds or fails.

    Args:
        job, cluster: the job and the cluster as laid out from their YAML.
        run_dir: the run's directory (ledger, logs, control file).
        ledger: where every fact is recorded.
        chaos: the faults to inject (``--chaos``).
        options: the manager's timeouts and intervals.
        console: what a user watching sees.
        clock: the wall clock (``time.time``; a component test passes a fake one).
        pod_starter: starts a placed pod's agent (default: ``unbroken launch``).
        store_opener: hosts a generation's rendezvous store (default: torch's TCPStore).
        engine_type: the pod engine (a component test passes one whose pods are edges).
    """

    def __init__(
        self,
        job: JobLayout,
        cluster: ClusterLayout,
        run_dir: Path,
        ledger: Ledger,
        chaos: tuple[ChaosFault, ...] = (),
        options: ManagerOptions | None = None,
        console: Console | None = None,
        clock: Callable[[], float] = time.time,
        pod_starter: PodStarter | None = None,
        store_opener: StoreOpener | None = None,
        engine_type: type[Engine] = Engine,
    ) -> None:
        self.clock = clock
        self.job = job
        self.cl = cluster
        self.run_dir = run_dir
        self.ledger = ledger
        self.opt = options or ManagerOptions()
        self.console = console or Console(quiet=True)
        self.secret = secrets.token_hex(16)
        self.inbox: queue.Queue[Inbound] = queue.Queue()
        self.commands = CommandQueues(streams=len(cluster.nodes))
        ctx = Context(
            job=job,
            cluster=cluster,
            options=self.opt,
            codes=CodeTable.load(cluster.code_table),
            ledger=ledger,
            console=self.console,
            commands=self.commands,
            run_dir=run_dir,
            chaos=chaos,
            clock=clock,
        )
        self.ctx = ctx
        #: The agents' heartbeat interval and the silence that loses a node whose agent's order
        #: stream is still open (unbroken.manager.service: the protocol at scale).
        self.heartbeat_s = heartbeat_interval_s(len(job.pods))
        #: What scans every rank (stragglers, progress, the status) runs once per half interval
        #: at most (it grows with N; bench/scale.py); a small job scans every tick.
        self.scan_s = max(TICK_S, self.heartbeat_s / 2)
        self.next_scan_at = 0.0
        self.next_status_at = 0.0
        self.status_text = StatusText()  # the snapshot's pod rows, each encoded once
        # The parts, each the one owner of its state (see the module doc).
        self.gens = Generations()
        self.incidents = Incidents(ctx)
        self.pool = Pool(ctx, self.incidents)
        self.engine = engine_type(ctx, self.pool, self.gens, self.secret, pod_starter, store_opener)
        self.inprocess = InProcess(ctx, self.engine, self.pool, self.gens, self.incidents)
        self.hotswitch = HotSwitcher(ctx, self.engine, self.pool)
        self.elastic = Elastic(ctx, self.engine, self.pool, self.inprocess)
        self.executor = Executor(
            ctx,
            engine=self.engine,
            pool=self.pool,
            generations=self.gens,
            incidents=self.incidents,
            inprocess=self.inprocess,
            hotswitch=self.hotswitch,
            elastic=self.elastic,
            finish=self.finish,
            finished=lambda: self.outcome is not None,
        )
        self.agents = AgentWatch(
            ctx,
            self.engine,
            self.heartbeat_s,
            silence_timeout_s(self.heartbeat_s, self.opt.agent_timeout_s),
        )
        self.collector = Collector(active=not self.agents.small)
        self.detector = Detector(ctx.codes, self.opt.settle_s, self.opt.agent_timeout_s)
        #: Nodes slower than their peers (unbroken.policy.straggler).
        fh = job.fault_handling
        self.stragglers = StragglerWatch(
            StragglerKnobs(
                threshold=fh.straggler_threshold_percent / 100,
                window=fh.straggler_window,
                hold_s=fh.straggler_hold_s,
            )
        )
        self.started_at = self.clock()
        self.fired_chaos: set[int] = set()
        self.milestones = Milestones(job.world_size, self.opt.progress_every)
        self._phase_changed = False  # a heartbeat changed a rank's phase since the last tick
        self.sessionless = Sessionless(ctx, self.gens, self.milestones, self.incidents)
        self.switches = Switches(ctx)  # and rungs a pod's environment turns off
        self.outcome: RunOutcome | None = None
        self.endpoints = Endpoints(ctx, self.inbox)
        self.injector = Injector(JobTarget(ctx, self.engine, self.pool, self.gens))
        #: Online stress tests (``unbroken stress-test``).
        self.stress = StressTester(
            ManagerStressHost(
                ctx,
                self.gens,
                self.engine,
                self.pool,
                self.inprocess,
                busy=self.executor.busy,
                finished=lambda: self.outcome is not None,
                rejoin=self.executor.rejoin_in_place,
                report=self.fault_detected,
            ),
            job,
            ledger,
            self.console,
        )

    def use_secret(self, secret: str) -> None:
        """Take ``secret`` as the run's token instead of the one made at construction: the
        token the hosts were given (``unbroken serve --secret-file``). Before :meth:`run`."""
        self.secret = secret
        self.engine.secret = secret

    # ---- life cycle -------------------------------------------------------------------
    def start(self) -> None:
        engine = self.engine
        # First: the node image imports torch while the rest of the start goes on.
        engine.start_image()
        engine.open_store(self.job.master_port or 0)
        engine.control_address = self.endpoints.open(self.secret, engine)
        self.pool.reset_gpu = self.endpoints.reset_gpu
        self.ledger.record(
            JobSubmitted(
                job=self.job.job_id,
                pods=tuple(p.name for p in self.job.pods),
                world_size=self.job.world_size,
                total_steps=self.job.total_steps,
                strategies=self.job.fault_handling.strategies,
            )
        )
        self.console.line(
            f"job {self.job.job_id}: {len(self.job.pods)} pods x {self.job.nproc_per_node} ranks "
            f"on {len(self.cl.nodes)} nodes; control plane {engine.control_address}, "
            f"{engine.rendezvous}"
        )
        self.executor.start(tuple(p.name for p in self.job.pods))
        if self.outcome is None and not engine.pods:
            raise ManagerError("no pod could be placed")

    @property
    def server(self) -> ControlServer | None:
        """The control server, once the run started."""
        return self.endpoints.server

    def run(self) -> RunOutcome:
        stop: KeyboardInterrupt | None = None
        try:
            self.start()
            next_tick = 0.0
            while self.outcome is None:
                urgent = False
                try:
                    msg = self.inbox.get(timeout=PHASE_TICK_S if self._phase_changed else TICK_S)
                    self._handle_one(msg)
                    urgent = msg.method not in _ROUTINE
                    while self.outcome is None:
                        msg = self.inbox.get_nowait()
                        self._handle_one(msg)
                        urgent = urgent or msg.method not in _ROUTINE
                except queue.Empty:
                    pass
                # Heartbeats tick at most once per TICK_S: a tick scans every pod and rank, and
                # ticking after every heartbeat made the scans grow with N x the rate, N^2. Any
                # other message (a report, a command) is acted on at once, so a rank's exit is
                # decided before its peers' exits are read as faults of their own; so is, a
                # PHASE_TICK_S after the last tick, a heartbeat changing a rank's phase.
                now = self.clock()
                if self._phase_changed and now >= next_tick - TICK_S + PHASE_TICK_S:
                    urgent = True
                if self.outcome is None and (urgent or now >= next_tick):
                    next_tick = now + TICK_S
                    self._phase_changed = False
                    self._tick(now)
        except KeyboardInterrupt as exc:  # SIGINT, SIGTERM: the run stops, and says so below
            stop = exc
            raise
        except LedgerError as exc:
            # Nothing can be recorded (a full disk): stop every process, say so once.
            raise ManagerError(
                f"cannot write the run's ledger, so the run was stopped: {exc}"
            ) from None
        finally:
            self.shutdown()
            if stop is not None:
                self._stopped(stop)
        assert self.outcome is not None
        return self.outcome

    def shutdown(self) -> None:
        success = self.outcome is not None and self.outcome.succeeded
        self.engine.stop_all(grace_s=None if not success else 5.0, success=success)
        self.pool.reset_idle(self.clock(), job_over=True)
        self.injector.release_throttles()
        self.commands.close()
        self.endpoints.close()
        # The store's keeper ends before the image it was forked from: no process of the run
        # outlives the run.
        self.engine.close_stores()
        self.engine.close_image()
        self.collector.close()

    def finish(self, succeeded: bool, reason: str) -> None:
        if self.outcome is not None:
            return
        step = self.gens.committed(self.progress_step)
        if succeeded:
            self.ledger.record(JobSucceeded(step=step))
        else:
            self.ledger.record(JobFailed(reason=reason, step=step))
        self.outcome = self._outcome(succeeded, reason, step)
        self._write_status(self.clock(), force=True)
        self.console.line(("succeeded: " if succeeded else "FAILED: ") + reason)

    def _outcome(self, succeeded: bool, reason: str, step: int, stopped_by: str = "") -> RunOutcome:
        n = self.incidents
        elapsed_s = self.clock() - self.started_at
        return RunOutcome(
            succeeded, reason, step, n.n_faults, n.n_recoveries, elapsed_s, stopped_by
        )

    def _stopped(self, stop: KeyboardInterrupt) -> None:
        """The user stopped the run and every process of it has ended: its terminal record and
        status, unless it had ended already; what it says goes back on ``stop``."""
        if self.outcome is not None:
            return
        signal = stop.signal if isinstance(stop, StopRequested) else "SIGINT"
        step = self.gens.committed(self.progress_step)
        # The status says the step the stop record says (progress is read only at scans).
        self.milestones.progress_step = max(self.milestones.progress_step, step)
        reason = f"stopped by {signal} at step {step}"
        if isinstance(stop, StopRequested):
            stop.reason = reason
        self.outcome = self._outcome(False, reason, step, stopped_by=signal)
        with contextlib.suppress(LedgerError):
            self.ledger.record(JobStopped(signal=signal, step=step))
            self._write_status(self.clock(), force=True)

    # ---- inbox ------------------------------------------------------------------------
    def _handle_one(self, msg: Inbound) -> None:
        """Handle one message; a malformed one (a field missing or of the wrong type) from an
        authenticated peer is refused and logged, and the control plane goes on."""
        if msg.method not in _PEER_METHODS:
            self._handle(msg)
            return
        try:
            self._handle(msg)
        except (
            KeyError,
            TypeError,
            ValueError,
            AttributeError,
            OverflowError,
            RecursionError,
        ) as exc:
            log.error("malformed %s message refused: %s: %s", msg.method, type(exc).__name__, exc)
            if msg.reply is not None and msg.reply.empty():
                msg.reply.put({"ok": False, "error": f"malformed {msg.method}: {exc!r}"})

    def _handle(self, msg: Inbound) -> None:
        body = msg.body
        match msg.method:
            case "Device":
                fault = self.pool.device_event(body["event"], self.clock())
                if fault is not None:
                    self.fault_detected(fault, self.clock())
            case "Inject":
                answer(msg, lambda: {"detail": self._inject(body)})
            case "Release":
                node, device = str(body["node"]), int(body["device"])
                answer(msg, lambda: {"detail": self.pool.release_device(node, device)})
            case "StressTest":
                answer(
                    msg,
                    lambda: dict(
                        zip(("round", "detail"), self.stress.request(self.clock()), strict=True)
                    ),
                )
            case "Link":  # unbroken link switchback / failover --plane NAME
                d = self.executor.planes.command(str(body.get("to") or ""), self.clock())
                answer(msg, lambda: refused(d.reason) if d.refused else {"detail": d.reason})
            case method if method == STREAM_OPENED:
                self.agents.stream_opened(str(body["pod"]), int(body["pid"]))
            case method if method == STREAM_CLOSED:
                at = msg.at or self.clock()
                self.agents.stream_closed(str(body["pod"]), int(body["pid"]), at)
            case method if method in (HELLO, HEARTBEAT, REPORT):
                sender, report = decode_report(method, body)
                heard = msg.at or self.clock()
                match report:
                    case AgentHello():
                        assert msg.reply is not None
                        msg.reply.put(encode_answer(self._hello(sender, report, heard)))
                    case AgentHeartbeat():
                        self._heartbeat(sender, report, heard)
                    case _:
                        self._report(sender, report, heard)
            case _:
                log.error("unknown message %s", msg.method)

    def _pod_of(self, sender: Sender) -> PodProcess | None:
        """The pod of the agent that sent a report; None for an agent of a replaced pod."""
        pod = self.engine.pods.get(sender.pod)
        if pod is None or sender.agent_pid != pod.pid:
            return None
        return pod

    def _all_finished(self) -> None:
        """Every rank exited 0. A job whose every rank ran without an Unbroken session (a plain
        torchrun script) succeeded, as under torchrun, with no step seen. Some ranks without
        one, beside ranks with one (a rank that exited before ``unbroken.worker.init``), trained
        nothing under supervision: the job fails with that reason."""
        idle = sorted(r for p in self.engine.pods.values() for r in p.without_session)
        world = self.elastic.world_size  # smaller while an elastic job is scaled in
        if not idle or (len(idle) == world and self.sessionless.known(world)):
            if idle:  # a plain torchrun script
                self.sessionless.say(idle)
            self.finish(True, f"all {world} ranks " + ("exited 0" if idle else "finished"))
            return
        which = f"rank {idle[0]}" if len(idle) == 1 else f"ranks {', '.join(map(str, idle))}"
        self.finish(
            False,
            f"{which} exited 0 without starting an Unbroken session (the training script never "
            "called unbroken.worker.init); nothing was trained",
        )

    def _hello(self, sender: Sender, hello: AgentHello, heard_at: float) -> HelloAnswer:
        pod = self._pod_of(sender)
        if pod is None or pod.stopped:
            log.warning("refused the hello of %s (agent pid %s)", sender.pod, sender.agent_pid)
            return HelloAnswer(ok=False, error="unknown or replaced pod")
        pod.hello_at, pod.last_heartbeat_at = self.clock(), heard_at
        self.switches.heard(pod, hello.switched_off)
        return HelloAnswer(
            ok=True, generation=pod.generation, join=pod.join, heartbeat_s=self.heartbeat_s
        )

    def _heartbeat(self, sender: Sender, beat: AgentHeartbeat, heard_at: float) -> None:
        pod, gens = self._pod_of(sender), self.gens
        if sender.generation >= 0 and (pod is None or sender.generation != gens.current):
            since = gens.began_at(sender.generation)  # its ranks stopped: their last words count
            last_words_of_ended(beat.ranks, since, gens.heard, self.ledger, self.console)
        if pod is None or sender.generation < 0:
            return
        pod.last_heartbeat_at = max(pod.last_heartbeat_at, heard_at)
        if sender.generation != gens.current:
            return
        for row in beat.ranks:
            view = gens.ranks.get(row.rank)
            if view is not None and view.pid == row.pid:
                seen, phase, was = view.op_retries, view.phase, (view.recoveries, view.dumped_at)
                view.update(row)
                if not view.recoverable:  # a MindSpore rank's own retry and last words
                    rank_recovered_alone(view, was, gens.heard, self.ledger, self.console)
                if view.phase != phase:
                    self._phase_changed = True  # a rung may wait for it: tick now
                self.milestones.touch(row.rank)
                if view.op_retries > seen and view.op_retry_at > gens.began_at(gens.current):
                    # a collective re-executed in the rank: no fault for the policy
                    step, attempt, level = unpack_op_retry(view.op_retry_last)
                    retry = f"op retry {attempt}/{self.ctx.fh.op_retry.max_count}, L{level}"
                    self.ledger.record_raw(
                        "OpRetry",
                        {"rank": view.rank, "step": step, "attempt": attempt, "level": level},
                        at=view.op_retry_at,
                    )
                    self.console.line(
                        f"rank {view.rank}: the collectives of step {step} re-executed "
                        f"({retry}); no recovery needed"
                    )

    def _report(self, sender: Sender, event: Event, heard_at: float) -> None:
        pod = self._pod_of(sender)
        if pod is None:
            return
        now = self.clock()
        pod.last_heartbeat_at = max(pod.last_heartbeat_at, heard_at)
        gen = sender.generation
        match event:
            case PodFinished(without_session=idle):
                if gen == self.gens.current:
                    pod.finished = True
                    pod.without_session = idle
                    if all(p.finished for p in self.engine.pods.values()):
                        self._all_finished()
                return
            case PodStopped():
                pod.stopped = True
                return
            case PlaneCarrierChanged():  # a fact of the host, whatever generation its agent is in
                self.executor.planes.reported(
                    pod.node, event.plane, event.up, event.changed_at, event.planes
                )
                return
        if gen != self.gens.current:
            log.info(
                "ignoring %s from %s of generation %d (now %d)",
                type(event).__name__,
                pod.pod,
                gen,
                self.gens.current,
            )
            return
        where = Where(pod=pod.pod, node=pod.node)
        match event:
            case RanksStarted() | RanksRejoined():
                self._ranks_started(pod, gen, event)
            case RankExited():
                view = self.gens.ranks.get(event.rank)
                if view is not None:
                    view.alive = False
                    if event.committed is not None:
                        view.committed = max(view.committed, event.committed)
                self.detector, fault = self.detector.rank_exited(event, where, now)
                if diverged(fault):
                    # The agreement check found the replicas apart: no rank's state is a
                    # replica to repair from; every rank resumes from the newest checkpoint.
                    self.gens.mark_diverged()
            case RankFailed():
                self.detector = self.detector.rank_failed(
                    event,
                    where,
                    now,
                    # A pause under way (an elastic scale-out, a stress test) fails the
                    # collectives of ranks still in a step with a peer that stopped at the
                    # boundary: no fault.
                    recovering=self.incidents.open is not None
                    or self.inprocess.pending_rejoin is not None
                    or self.stress.under_way,
                    generation_began_at=self.gens.began_at(self.gens.current),
                )
            case RankHung():
                self.detector = self.detector.rank_hung(event, where, now)

    def _ranks_started(
        self, pod: PodProcess, gen: int, event: RanksStarted | RanksRejoined
    ) -> None:
        pids = dict(event.pids)
        pod.rank_pids = pids
        for rank, pid in pids.items():
            self.gens.ranks[rank] = RankView(rank=rank, pid=pid, generation=gen)
            self.milestones.touch(rank)
        # A rejoin keeps the healthy processes: only replacements are started processes.
        started = sorted(pids) if isinstance(event, RanksStarted) else sorted(event.joined)
        if started and (wait := event.device_wait) is not None:  # the ended ones' GPU memory
            freed = DeviceMemoryFreed(pod.pod, tuple(started), wait.gpus, wait.waited_s, wait.freed)
            self.ledger.record(freed, at=wait.freed_at)
        if started:
            ranks = tuple(started)
            began = ProcessesStarted(pod.pod, pod.node, ranks, tuple(pids[r] for r in ranks), gen)
            self.ledger.record(began, at=event.started_at)
        if self.incidents.replacement_started(pod.pod):
            at = self.clock()
            ready = ReplacementReady(pod=pod.pod, at=at, generation=self.gens.rung_of(gen))
            self.executor.policy(ready, at)
        if done := self.sessionless.restarted(self.elastic.world_size, self.executor.stale):
            self.executor.policy(done, done.at)

    # ---- the clock --------------------------------------------------------------------
    def _tick(self, now: float) -> None:
        scan = self.heartbeat_s <= HEARTBEAT_FLOOR_S or now >= self.next_scan_at
        if scan:
            self.next_scan_at = now + self.scan_s
        for pod, why in self.agents.lost(now):
            self._node_lost(pod, now, why)
        self.detector, faults = self.detector.settle(
            now, agent_silent=self.agents.any_silent(now), gather_s=GATHER_S
        )
        self.faults_detected(faults, now)
        if scan:
            self._stragglers(now)
        self._phases(now, scan)
        ex = self.executor
        ex.poll_rejoin(now)
        ex.planes.tick(now)
        self.stress.poll(now)
        ex.poll_dump(now)
        ex.poll_held(now)
        ex.keep_spares(now)
        ex.retry_placement(now)
        ex.poll_room(now)
        ex.poll_spare(now)
        ex.scale_out(now)
        self._chaos(now)
        if self.outcome is None:
            ex.policy(PolicyTick(now=now), now)
        self._write_status(now)
        self.collector.tick(now, quiet=self.incidents.open is None)

    def _node_lost(self, pod: PodProcess, now: float, why: str) -> None:
        # Whatever is left of the pod's processes is unsupervised now: end it.
        pod.kill_all()
        self.detector = self.detector.node_lost(
            Where(pod=pod.pod, node=pod.node),
            self.job.ranks_of(pod.pod),
            pod.last_heartbeat_at,
            why,
            now,
        )

    def _stragglers(self, now: float) -> None:
        """Not watched while an incident is handled (its steps are not compared)."""
        if self.incidents.open is None and self.outcome is None:
            pods = [p for p in self.engine.pods.values() if not (p.finished or p.stopped or p.lost)]
            for fault in self.stragglers.poll_pods(now, self.gens.ranks, pods):
                self.fault_detected(fault, now)

    def fault_detected(self, fault: Fault, now: float) -> None:
        self.faults_detected((fault,), now)

    def faults_detected(self, found: Sequence[Fault], now: float) -> None:
        """Faults found in one check, in the order they came. Each is recorded; those that
        stop training are one incident, decided once (a rack's nodes lost at once: were they
        decided one by one, each would escalate the one before)."""
        if not found:
            return
        # The newest commit heard of, once for all (80k ranks at 10k nodes).
        newest = max((v.committed for v in self.gens.ranks.values()), default=self.progress_step)
        faults = [self.incidents.record(f, now, newest) for f in found]
        stopping = [f for f in faults if f.level.stops_training]
        together = len(stopping) > 1
        for fault in faults:
            if together and fault.level.stops_training:
                if fault is stopping[0]:
                    self._decide(stopping, now, newest)
                continue
            self._decide([fault], now, newest)

    def _decide(self, faults: Sequence[Fault], now: float, newest: int) -> None:
        first = faults[0]
        step = first.step if first.step is not None else newest
        # A job without a session shows no step: rounds that ran long enough are progress.
        rounds = self.sessionless.at_fault(self.elastic.world_size, self.started_at, now)
        found = feasibility(
            self.job,
            faults,
            now,
            generations=self.gens,
            inprocess=self.inprocess,
            elastic=self.elastic,
            pool=self.pool,
        )
        self.executor.policy(
            FaultReported(
                fault=first,
                feasibility=found,
                progress_step=max(step, self.progress_step) if rounds is None else rounds,
                together=tuple(faults[1:]),
            ),
            now,
        )

    def _phases(self, now: float, scan: bool = True) -> None:
        """Record what the generation reached; its first commit ends what it carried out."""
        world_size = self.elastic.world_size  # smaller while an elastic job is scaled in
        ledger, console, inc = self.ledger, self.console, self.incidents
        for m in self.milestones.reached(self.gens, world_size, scan):
            match m:
                case CommReady(generation=gen, at=at):
                    ledger.record(CommunicationReady(generation=gen, world_size=world_size), at=at)
                case Loaded(generation=gen, step=start, source=source, at=at):
                    ledger.record(StateLoaded(generation=gen, step=start, source=source), at=at)
                    if inc.open is not None:
                        console.line(f"generation {gen}: state loaded at step {start} ({source})")
                case FirstCommit(generation=gen, step=first, resumed=resumed, at=at):
                    ledger.record(FirstStepCommitted(generation=gen, step=first), at=at)
                    self._first_commit(gen, first, resumed, at, now)
                case Progress(generation=gen, step=step, step_time_s=step_s):
                    ledger.record(
                        StepProgress(
                            generation=gen,
                            step=step,
                            step_time_s=step_s,
                            rank_step_times_s=m.rank_step_times_s,
                        )
                    )
                    total = f"/{self.job.total_steps}" if self.job.total_steps else ""
                    console.line(
                        f"step {step}{total} (generation {gen}, {step_s * 1000:.0f} ms/step)"
                    )

    def _first_commit(self, gen: int, first: int, resumed: int, at: float, now: float) -> None:
        self.stress.resumed(gen, at, first)
        self.executor.committed(gen, at, first)
        rung = self.gens.rung_of(gen)
        if self.incidents.open is None:
            return
        if self.executor.stale(rung):
            # A rung given up began this generation; the rung now carried out will begin its
            # own, whose first commit ends the incident.
            log.info("generation %d committed, but its rung %s was given up", gen, rung)
            return
        self.incidents.recovered(gen, first, resumed, at)
        self.hotswitch.done(gen, at, first)
        self.executor.policy(RungSucceeded(at=at, generation=rung), now)

    @property
    def progress_step(self) -> int:
        """The highest step every rank has committed, over the whole run."""
        return self.milestones.progress_step

    # ---- status -----------------------------------------------------------------------
    def _write_status(self, now: float, force: bool = False) -> None:
        if not force and now < self.next_status_at:
            return
        self.next_status_at = now + max(0.5, self.scan_s)
        out, pods, bindings = self.outcome, self.engine.pods, self.pool.cluster.bindings
        status = job_status(
            self.job,
            ended=None if out is None else (out.phase, out.reason),
            incident=self.incidents.open,
            pending_reason=self.engine.pending_reason,
            scaled_in=self.elastic.scaled_in_message(),
            world_size=self.elastic.world_size,
            generations=self.gens,
            step=self.progress_step,
            pods={},
            bindings={},
            started_at=self.started_at,
            now=now,
            faults=self.incidents.n_faults,
            recoveries=self.incidents.n_recoveries,
            with_pods=False,
        )
        self.ledger.set_status_text(self.status_text.text(status, self.job, pods, bindings))

    # ---- fault injection (unbroken.chaos.injector) ------------------------------------
    def _chaos(self, now: float) -> None:
        for c in due(self.ctx.chaos, self.fired_chaos, now - self.started_at, self.progress_step):
            self.fired_chaos.add(c.index)
            at = self.clock()
            try:
                if c.kind is InjectKind.STRESS_TEST:  # no fault: the tester says what it does
                    self.stress.request(at)
                    continue
                detail = self.injector.fire(c)
                self._record_injected(at, str(c.kind), detail)
                self.console.line(f"chaos: {detail}")
            except ValueError as exc:
                self.console.line(f"chaos: faults[{c.index}] not injected: {exc}")

    def _inject(self, body: Mapping[str, Any]) -> str:
        """``unbroken inject``: the fault is injected and recorded; returns what was done."""
        at = self.clock()
        detail = self.injector.request(body)
        self._record_injected(at, str(body["kind"]), detail)
        return detail

    def _record_injected(self, at: float, kind: str, detail: str) -> None:
        self.ledger.record_raw("FaultInjected", {"fault": kind, "detail": detail}, at=at)
