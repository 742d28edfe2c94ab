"""The job manager: owns the rendezvous store, feeds faults to the policy, executes decisions.

It runs in the control plane process, never in a training pod, so the death of rank 0's node
takes neither the store nor the manager with it. One thread (the loop in :meth:`JobManager.run`)
owns all state; RPC handlers, the device watcher and timers only post messages to its inbox.

This module keeps the I/O and the loop; the parts it feeds are pure or narrow:

- agents' messages arrive as typed reports (:mod:`unbroken.protocol.messages`), matched on type;
- :mod:`unbroken.manager.detector` turns reports into faults (DESIGN section 3): a rank exit,
  a failed step, a hang (its tick and its steps stopped for three step times), a lost node (its
  agent silent for ``agent_timeout_s``) and a device fault; echoes of a peer's death are held
  back so that the first fault, not its echo, is the one handled;
- :mod:`unbroken.manager.executor` carries out the policy's decisions through a narrow
  interface to this manager (:class:`~unbroken.manager.executor.ExecutorHost`);
- :mod:`unbroken.chaos.injector` injects the faults of ``--chaos`` and ``unbroken inject``.

Reports from an older generation than the current one are echoes of a fault already handled.
Decisions come from :func:`unbroken.policy.decide`; every fact is recorded in the ledger. The
wall clock is an argument (``clock``), so a component test drives the loop with a fake one.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from unbroken.agent.image import StoreKeeper
from unbroken.chaos import ChaosFault, InjectKind
from unbroken.chaos.injector import Injector, RankTarget, due
from unbroken.devices import (
    DeviceWatcher,
    SimProvider,
)
from unbroken.faults import CodeTable, Fault, FaultKind, escalate
from unbroken.ledger import (
    CommunicationReady,
    FaultDetected,
    FirstStepCommitted,
    JobFailed,
    JobPhase,
    JobStatus,
    JobSubmitted,
    JobSucceeded,
    Ledger,
    LedgerError,
    PodStatus,
    ProcessesStarted,
    RecoveryCompleted,
    StateLoaded,
    StateSource,
    StepProgress,
)
from unbroken.manager.console import Console
from unbroken.manager.detector import Detector, Where, diverged
from unbroken.manager.executor import Executor, PodStarter
from unbroken.manager.incident import Incident
from unbroken.manager.layout import ClusterLayout, JobLayout, ManagerOptions
from unbroken.manager.metrics import LedgerCollector, registry_for
from unbroken.manager.pods import PodProcess
from unbroken.manager.progress import (
    PhaseWatch,
    RankView,
    committed_step,
    median_step_time,
)
from unbroken.manager.service import (
    HEARTBEAT_FLOOR_S,
    STREAM_CLOSED,
    STREAM_OPENED,
    CommandQueues,
    Inbound,
    build_server,
    heartbeat_interval_s,
    silence_timeout_s,
)
from unbroken.manager.straggler import StragglerWatch
from unbroken.manager.stress import ManagerStressHost, StressTester
from unbroken.manager.web import WebEndpoint, WebError
from unbroken.policy import FaultDetected as PolicyFault
from unbroken.policy import Feasibility
from unbroken.policy import RecoveryCompleted as PolicyRecovered
from unbroken.policy import ReplacementReady as PolicyReplacementReady
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
    PlaneChanged,
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
from unbroken.report import render
from unbroken.rpc.store import host_store

log = logging.getLogger(__name__)


def let_store_go(store: Any, wait_s: float = 0.0) -> None:
    """A store of :meth:`JobManager.host_store` ends: a keeper is told to (and waited for up
    to ``wait_s``), torch's store closes with its last reference."""
    if isinstance(store, StoreKeeper):
        store.close(wait_s)


#: The manager's clock period: timeouts, settling and the policy's deadlines are checked this
#: often (and no more often, however many messages arrive).
TICK_S = 0.05
#: How long a lost node is held while other agents are silent, so that the nodes of a rack
#: that went at once are one incident (:meth:`Detector.settle`): in a small job they are found
#: lost one heartbeat interval apart (0.1 s); in a large one their order streams break
#: together, and the server sees the breaks up to about a second apart when it is busy
#: (bench/scale.py, 10k nodes).
GATHER_S = 1.0
#: How often a large job's manager looks at every agent's silence (a node that hangs with its
#: order stream open is lost after three heartbeat intervals, 60 s at 10k nodes).
AGENTS_SCAN_S = 1.0

# Messages that come from the network (agents, ``unbroken inject``), not from this process.
_PEER_METHODS = frozenset({HELLO, HEARTBEAT, REPORT, "Inject", "StressTest", "Release", "Link"})
#: Messages that wait for the next tick (see ``run``); any other is acted on at once.
_ROUTINE = frozenset({HEARTBEAT, STREAM_OPENED, STREAM_CLOSED})


class ManagerError(RuntimeError):
    """The job could not be started or run; the message says why."""


@dataclass
class RunOutcome:
    succeeded: bool
    reason: str
    step: int
    faults: int
    recoveries: int
    elapsed_s: float


class JobManager:
    """Runs one job on the embedded cluster until it succeeds or fails."""

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
    ) -> None:
        #: The wall clock (``time.time``; a component test passes a fake one).
        self.clock = clock
        self.job = job
        self.cl = cluster
        self.run_dir = run_dir
        self.ledger = ledger
        self.chaos = chaos
        self.opt = options or ManagerOptions()
        self.console = console or Console(quiet=True)
        self.fh = job.fault_handling
        self.codes = CodeTable.load(cluster.code_table)
        self.secret = secrets.token_hex(16)
        self.inbox: queue.Queue[Inbound] = queue.Queue()
        self.commands = CommandQueues(streams=len(cluster.nodes))
        #: The agents' heartbeat interval and the silence that loses a node whose agent's order
        #: stream is still open (unbroken.manager.service: the protocol at scale).
        self.heartbeat_s = heartbeat_interval_s(len(job.pods))
        self.silence_s = silence_timeout_s(self.heartbeat_s, self.opt.agent_timeout_s)
        #: Agents (pod, pid) whose order stream ended while their pod ran, and when.
        self.streams_broken: dict[tuple[str, int], float] = {}
        #: What scans every rank (stragglers, steady progress) and the status run once per half
        #: heartbeat interval at most, not on every tick: they grow with N, and at 1000 nodes
        #: the status alone took 60 ms every 0.5 s (bench/scale.py). A small job scans every
        #: tick.
        self.scan_s = max(TICK_S, self.heartbeat_s / 2)
        self.next_scan_at = 0.0
        self.next_agents_at = 0.0
        #: An agent silent beyond :meth:`_quiet_s` at the last full check of the agents.
        self.long_silent = False
        self.pods: dict[str, PodProcess] = {}
        self.ranks: dict[int, RankView] = {}
        self.generation = 0
        #: The generation whose replicas were found diverged (unbroken.worker.agreement).
        self.diverged_generation: int | None = None
        self.detector = Detector(self.codes, self.opt.settle_s, self.opt.agent_timeout_s)
        #: Nodes slower than their peers (unbroken.policy.straggler).
        self.stragglers = StragglerWatch(
            StragglerKnobs(
                threshold=self.fh.straggler_threshold_percent / 100,
                window=self.fh.straggler_window,
                hold_s=self.fh.straggler_hold_s,
            )
        )
        self.history: list[Fault] = []
        self.incident: Incident | None = None
        self.n_faults = 0
        self.n_recoveries = 0
        self.started_at = self.clock()
        self.progress_step = 0
        self.fired_chaos: set[int] = set()
        self.phases_done: dict[str, int] = {}
        self.phase_watch = PhaseWatch()
        self.outcome: RunOutcome | None = None
        self.store: Any = None
        self.server: Any = None
        self.web: WebEndpoint | None = None
        self.watcher: DeviceWatcher | None = None
        self.sim_dir = run_dir / "devices"
        self.control_file = run_dir / "control.json"
        #: Where the control plane and the rendezvous stores listen (``unbroken serve``).
        self.listen: tuple[str, int] = ("127.0.0.1", 0)
        self.next_status_at = 0.0
        self.master_port = 0
        self.replica_step: dict[int, int] = {}  # generation -> step repaired from a replica
        self.generation_began: dict[int, float] = {}
        self.pending_reason = ""  # why pods wait to be placed, for the status
        self.injector = Injector(self)
        self.executor = Executor(
            self,
            job=job,
            cluster_layout=cluster,
            options=self.opt,
            codes=self.codes,
            chaos=chaos,
            run_dir=run_dir,
            secret=self.secret,
            ledger=ledger,
            console=self.console,
            commands=self.commands,
            clock=clock,
            pod_starter=pod_starter,
        )
        #: Online stress tests (``unbroken stress-test``).
        self.stress = StressTester(ManagerStressHost(self), job, ledger, self.console)

    # ---- what the executor needs (ExecutorHost) -----------------------------------------
    @property
    def control_address(self) -> str:
        return str(self.server.address)

    @property
    def finished(self) -> bool:
        return self.outcome is not None

    def begin_generation(self, replica_step: int | None) -> int:
        self.generation += 1
        self.generation_began[self.generation] = self.clock()
        if replica_step is not None:
            self.replica_step[self.generation] = replica_step
        self.ranks = {}
        self.open_store()
        return self.generation

    def use_secret(self, secret: str) -> None:
        """Take ``secret`` as the run's token instead of the one made at construction: the
        token the hosts were given (``unbroken serve --secret-file``). Before :meth:`run`."""
        self.secret = secret
        self.executor.secret = secret

    # ---- life cycle -------------------------------------------------------------------
    def start(self) -> None:
        # First: the node image imports torch while the rest of the start goes on.
        self.executor.start_image()
        self.open_store(self.job.master_port or 0)
        self.server = build_server(
            self.secret,
            self.inbox,
            self.commands,
            answer_timeout_s=10.0,
            nodes=self.executor.remote_nodes,
            host=self.listen[0],
            port=self.listen[1],
            clock=self.clock,
        )
        self.server.start()
        self._start_web()
        self._write_control_file()
        provider = SimProvider(self.sim_dir, {n: self.cl.devices_per_node for n in self.cl.nodes})
        self.watcher = DeviceWatcher(
            provider,
            self.cl.list_watch_period_s,
            lambda ev: self.inbox.put(Inbound("Device", {"event": ev})),
        )
        self.watcher.start()
        self.ledger.record(
            JobSubmitted(
                job=self.job.job_id,
                pods=tuple(p.name for p in self.job.pods),
                world_size=self.job.world_size,
                total_steps=self.job.total_steps,
                strategies=self.fh.strategies,
            )
        )
        self.console.line(
            f"job {self.job.job_id}: {len(self.job.pods)} pods x {self.job.nproc_per_node} ranks "
            f"on {len(self.cl.nodes)} nodes; control plane {self.server.address}, "
            f"store {self.listen[0]}:{self.master_port}"
        )
        self.executor.place_and_start(tuple(p.name for p in self.job.pods), prefer={})
        if self.outcome is None and not self.pods:
            raise ManagerError("no pod could be placed")

    def _start_web(self) -> None:
        """Prometheus metrics and the live dashboard, computed from the ledger per request."""
        collector = LedgerCollector(self.ledger)

        def page() -> str:
            st = self.ledger.status()
            live = st is None or not st.phase.finished
            return render(collector.records(), st, now=self.clock() if live else None, refresh_s=5)

        try:
            self.web = WebEndpoint(
                self.secret, registry_for(collector), page, self.opt.metrics_port
            )
        except WebError as exc:
            raise ManagerError(str(exc)) from None
        self.console.line(
            f"metrics http://{self.web.address}/metrics, dashboard http://{self.web.address}/ "
            f"(token: the secret in {self.control_file.name})"
        )

    def open_store(self, port: int = 0) -> None:
        """A fresh rendezvous store for the next generation.

        torch 2.13's env:// rendezvous under ``TORCHELASTIC_USE_AGENT_STORE`` puts no
        per-attempt prefix on its keys, so a store reused across restarts hands restarted
        ranks the addresses of dead ones (pytorch/pytorch#135712). Every generation gets its
        own store instead; only the first uses the job's ``--master_port`` when it gives one.
        """
        try:
            store = self.host_store(port)
        except Exception as exc:
            raise ManagerError(
                f"cannot open the rendezvous store on {self.listen[0]}:{port}"
                f"{' (--master_port of the job: is the port in use?)' if port else ''}: {exc}"
            ) from None
        let_store_go(self.store)
        self.store = store
        self.master_port = int(store.port)

    def host_store(self, port: int) -> Any:
        """A store on 127.0.0.1 alone (it has no authentication; see unbroken.rpc.store),
        hosted by a keeper forked from the node image where there is one (torch is imported
        there already, and this process then imports none), else in this process. Raises
        ``OSError`` when it cannot listen there."""
        image = self.executor.image
        host = self.listen[0]
        store = None if image is None else image.host_store(host, port)
        return host_store(host, port) if store is None else store

    def _write_control_file(self) -> None:
        # A new file of ours, 0600 from its creation, never a path planted before us (O_EXCL,
        # O_NOFOLLOW); the rename replaces whatever stands at control.json, a link included.
        tmp = self.run_dir / f".control-{secrets.token_hex(8)}.tmp"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(tmp, flags, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(
                {
                    "address": self.server.address,
                    "metrics": self.web.address if self.web is not None else "",
                    "secret": self.secret,
                    "pid": os.getpid(),
                    "job": self.job.job_id,
                },
                f,
            )
        os.replace(tmp, self.control_file)

    def run(self) -> RunOutcome:
        try:
            self.start()
            next_tick = 0.0
            while self.outcome is None:
                urgent = False
                try:
                    msg = self.inbox.get(timeout=TICK_S)
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
                # decided before its peers' exits that follow it are read as faults of their own.
                now = self.clock()
                if self.outcome is None and (urgent or now >= next_tick):
                    next_tick = now + TICK_S
                    self._tick(now)
        except LedgerError as exc:
            # Nothing the run does can be recorded (a full disk): stop every process and say so
            # once, rather than train on unrecorded.
            raise ManagerError(
                f"cannot write the run's ledger, so the run was stopped: {exc}"
            ) from None
        finally:
            self.shutdown()
        assert self.outcome is not None
        return self.outcome

    def shutdown(self) -> None:
        success = self.outcome is not None and self.outcome.succeeded
        self.executor.stop_all(grace_s=None if not success else 5.0, success=success)
        self.injector.release_throttles()
        self.commands.close()
        if self.watcher is not None:
            self.watcher.stop()
        if self.server is not None:
            # Long enough for the hosts' order streams to see the run's end and close: cut,
            # a host's agent reads the stream's cancellation as a lost control plane.
            self.server.stop(2.0)
        if self.web is not None:
            self.web.stop()
        self.control_file.unlink(missing_ok=True)
        # The store's keeper ends before the image it was forked from: no process of the run
        # outlives the run.
        let_store_go(self.store, wait_s=5.0)
        self.store = None
        self.executor.close_image()

    def finish(self, succeeded: bool, reason: str) -> None:
        if self.outcome is not None:
            return
        step = committed_step(self.ranks.values()) if self.ranks else self.progress_step
        if succeeded:
            self.ledger.record(JobSucceeded(step=step))
        else:
            self.ledger.record(JobFailed(reason=reason, step=step))
        self.outcome = RunOutcome(
            succeeded=succeeded,
            reason=reason,
            step=step,
            faults=self.n_faults,
            recoveries=self.n_recoveries,
            elapsed_s=self.clock() - self.started_at,
        )
        self._write_status(self.clock(), force=True)
        self.console.line(("succeeded: " if succeeded else "FAILED: ") + reason)

    # ---- inbox ------------------------------------------------------------------------
    def _handle_one(self, msg: Inbound) -> None:
        """Handle one message; a malformed one (a field missing or of the wrong type) from an
        authenticated peer is refused and logged, and the control plane goes on."""
        if msg.method not in _PEER_METHODS:
            self._handle(msg)
            return
        try:
            self._handle(msg)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            log.error("malformed %s message refused: %s: %s", msg.method, type(exc).__name__, exc)
            if msg.reply is not None and msg.reply.empty():
                msg.reply.put({"ok": False, "error": f"malformed {msg.method}: {exc!r}"})

    def _handle(self, msg: Inbound) -> None:
        body = msg.body
        match msg.method:
            case "Device":
                self.executor.device_event(body["event"])
            case "Inject":
                assert msg.reply is not None
                try:
                    at = self.clock()
                    detail = self.injector.request(body)
                    self._record_injected(at, str(body["kind"]), detail)
                    msg.reply.put({"ok": True, "detail": detail})
                except ValueError as exc:
                    msg.reply.put({"ok": False, "error": str(exc)})
            case "Release":
                assert msg.reply is not None
                try:
                    detail = self.executor.release_device(str(body["node"]), int(body["device"]))
                    msg.reply.put({"ok": True, "detail": detail})
                except ValueError as exc:
                    msg.reply.put({"ok": False, "error": str(exc)})
            case "StressTest":
                assert msg.reply is not None
                try:
                    round_, detail = self.stress.request(self.clock())
                    msg.reply.put({"ok": True, "round": round_, "detail": detail})
                except ValueError as exc:
                    msg.reply.put({"ok": False, "error": str(exc)})
            case "Link":  # unbroken link switchback / failover --plane NAME
                assert msg.reply is not None
                d = self.executor.planes.command(str(body.get("to") or ""), self.clock())
                if d.refused:
                    msg.reply.put({"ok": False, "error": d.reason})
                else:
                    msg.reply.put({"ok": True, "detail": d.reason})
            case method if method == STREAM_OPENED:
                self.streams_broken.pop((str(body["pod"]), int(body["pid"])), None)
            case method if method == STREAM_CLOSED:
                self.streams_broken[(str(body["pod"]), int(body["pid"]))] = msg.at or self.clock()
            case method if method in (HELLO, HEARTBEAT, REPORT):
                sender, report = decode_report(method, body)
                heard = msg.at or self.clock()
                match report:
                    case AgentHello():
                        assert msg.reply is not None
                        msg.reply.put(encode_answer(self._hello(sender, heard)))
                    case AgentHeartbeat():
                        self._heartbeat(sender, report, heard)
                    case _:
                        self._report(sender, report, heard)
            case _:
                log.error("unknown message %s", msg.method)

    def _pod_of(self, sender: Sender) -> PodProcess | None:
        """The pod of the agent that sent a report; None for an agent of a replaced pod."""
        pod = self.pods.get(sender.pod)
        if pod is None or sender.agent_pid != pod.pid:
            return None
        return pod

    def _all_finished(self) -> None:
        """Every rank exited 0. A rank that never started an Unbroken session (its script did
        not call ``unbroken.worker.init``, or exited before it) trained nothing under
        supervision: no step was committed, checkpointed or protected. The job fails with
        that reason, so a misconfigured script is not mistaken for a finished training."""
        idle = sorted(r for p in self.pods.values() for r in p.without_session)
        if not idle:
            # A job scaled in finishes with the ranks of its smaller world.
            self.finish(True, f"all {self.executor.world_size()} ranks finished")
            return
        which = f"rank {idle[0]}" if len(idle) == 1 else f"ranks {', '.join(map(str, idle))}"
        self.finish(
            False,
            f"{which} exited 0 without starting an Unbroken session (the training script never "
            "called unbroken.worker.init); nothing was trained",
        )

    def _hello(self, sender: Sender, heard_at: float) -> HelloAnswer:
        pod = self._pod_of(sender)
        if pod is None or pod.stopped:
            log.warning("refused the hello of %s (agent pid %s)", sender.pod, sender.agent_pid)
            return HelloAnswer(ok=False, error="unknown or replaced pod")
        pod.hello_at = self.clock()
        pod.last_heartbeat_at = heard_at
        return HelloAnswer(
            ok=True, generation=pod.generation, join=pod.join, heartbeat_s=self.heartbeat_s
        )

    def _heartbeat(self, sender: Sender, beat: AgentHeartbeat, heard_at: float) -> None:
        pod = self._pod_of(sender)
        if pod is None or sender.generation < 0:
            return
        pod.last_heartbeat_at = max(pod.last_heartbeat_at, heard_at)
        if sender.generation != self.generation:
            return
        for row in beat.ranks:
            view = self.ranks.get(row.rank)
            if view is not None and view.pid == row.pid:
                seen = view.op_retries
                view.update(row)
                self.phase_watch.touch(row.rank)
                if view.op_retries > seen and view.op_retry_at > self.generation_began.get(
                    self.generation, 0.0
                ):  # a collective re-executed in the rank: no fault for the policy
                    step, attempt, level = unpack_op_retry(view.op_retry_last)
                    retry = f"op retry {attempt}/{self.fh.op_retry.max_count}, L{level}"
                    self.ledger.record_raw(
                        "OpRetry",
                        {"rank": view.rank, "step": step, "attempt": attempt, "level": level},
                        at=view.op_retry_at,
                    )
                    self.console.line(
                        f"rank {view.rank}: gradient all-reduce of step {step} re-executed "
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
                if gen == self.generation:
                    pod.finished = True
                    pod.without_session = idle
                    if all(p.finished for p in self.pods.values()):
                        self._all_finished()
                return
            case PodStopped():
                pod.stopped = True
                return
            case PlaneChanged():  # a fact of the host, whatever generation its agent is in
                self.executor.planes.reported(
                    pod.node, event.plane, event.up, event.changed_at, event.planes
                )
                return
        if gen != self.generation:
            log.info(
                "ignoring %s from %s of generation %d (now %d)",
                type(event).__name__,
                pod.pod,
                gen,
                self.generation,
            )
            return
        where = Where(pod=pod.pod, node=pod.node)
        match event:
            case RanksStarted() | RanksRejoined():
                self._ranks_started(pod, gen, event)
            case RankExited():
                view = self.ranks.get(event.rank)
                if view is not None:
                    view.alive = False
                    if event.committed is not None:
                        view.committed = max(view.committed, event.committed)
                self.detector, fault = self.detector.rank_exited(event, where, now)
                if diverged(fault):
                    # The agreement check found the replicas apart: no rank's state is a
                    # replica to repair from; every rank resumes from the newest checkpoint.
                    self.diverged_generation = self.generation
            case RankFailed():
                self.detector = self.detector.rank_failed(
                    event,
                    where,
                    now,
                    # A pause under way (an elastic scale-out, a stress test) fails the
                    # collectives of ranks still in a step with a peer that stopped at the
                    # boundary: no fault.
                    recovering=self.incident is not None
                    or self.executor.pending_rejoin is not None
                    or self.stress.under_way,
                    generation_began_at=self.generation_began.get(self.generation, 0.0),
                )
            case RankHung():
                self.detector = self.detector.rank_hung(event, where, now)

    def _ranks_started(
        self, pod: PodProcess, gen: int, event: RanksStarted | RanksRejoined
    ) -> None:
        pids = dict(event.pids)
        pod.rank_pids = pids
        for rank, pid in pids.items():
            self.ranks[rank] = RankView(rank=rank, pid=pid, generation=gen)
            self.phase_watch.touch(rank)
        # A rejoin keeps the healthy processes: only replacements are started processes.
        started = sorted(pids) if isinstance(event, RanksStarted) else sorted(event.joined)
        if started:
            self.ledger.record(
                ProcessesStarted(
                    pod=pod.pod,
                    node=pod.node,
                    ranks=tuple(started),
                    pids=tuple(pids[r] for r in started),
                    generation=gen,
                ),
                at=event.started_at,
            )
        awaiting = self.incident.awaiting_replacement if self.incident is not None else set()
        if pod.pod in awaiting:
            awaiting.discard(pod.pod)
            if awaiting:
                return
            ready = PolicyReplacementReady(
                pod=pod.pod, at=self.clock(), generation=self.executor.rung_of(gen)
            )
            self.executor.policy(ready, self.clock())

    # ---- the clock --------------------------------------------------------------------
    def _tick(self, now: float) -> None:
        scan = self.heartbeat_s <= HEARTBEAT_FLOOR_S or now >= self.next_scan_at
        if scan:
            self.next_scan_at = now + self.scan_s
        self._check_agents(now)
        self._settle(now)
        if scan:
            self._stragglers(now)
        self._phases(now, scan)
        self.executor.poll_rejoin(now)
        self.executor.planes.tick(now)
        self.stress.poll(now)
        self.executor.poll_dump(now)
        self.executor.poll_held(now)
        self.executor.keep_spares(now)
        self.executor.retry_placement(now)
        self.executor.poll_room(now)
        self.executor.scale_out(now)
        self._chaos(now)
        if self.outcome is None:
            self.executor.policy(PolicyTick(now=now), now)
        self._write_status(now)

    def _check_agents(self, now: float) -> None:
        """Nodes whose agents fell silent are lost. In a large job (a heartbeat interval
        above the floor) every agent is looked at once every ``AGENTS_SCAN_S`` and, in
        between, only those whose order stream broke (a scan of 10k pods every tick was a
        tenth of the manager's CPU); a small job looks at all every tick."""
        full = self.heartbeat_s <= HEARTBEAT_FLOOR_S or now >= self.next_agents_at
        if full:
            self.next_agents_at = now + AGENTS_SCAN_S
            pods = list(self.pods.values())
            self.long_silent = False
        else:
            pods = self._broken_stream_pods()
        quiet_s = self._quiet_s()
        silent_pods: list[tuple[PodProcess, str]] = []
        for pod in pods:
            if pod.finished or pod.stopped or pod.lost:
                continue
            if pod.hello_at is None:
                if now - pod.started_at > self.opt.agent_start_timeout_s:
                    pod.lost = True
                    self._node_lost(pod, now, "its agent never reported")
                continue
            silent = now - pod.last_heartbeat_at
            if full and silent > quiet_s:
                self.long_silent = True
            broken_at = self.streams_broken.get((pod.pod, pod.pid))
            # Silent for agent_timeout_s since its order stream broke, or for silence_s (the
            # same for a small job) at all: the node is lost. Counted from the break, the nodes
            # of a rack that goes at once are lost in the same tick, one incident, not spread
            # over a heartbeat interval (bench/scale.py's rack burst). In a large job an agent
            # that said hello but has not yet started its ranks, its stream open, has until
            # agent_start_timeout_s: a thousand agents start at once and their first reports
            # queue behind each other (bench/scale.py: 1000 nodes lost at start).
            limit = self.silence_s
            if not pod.rank_pids and self.heartbeat_s > HEARTBEAT_FLOOR_S:
                limit = max(limit, self.opt.agent_start_timeout_s)
            quiet = None if broken_at is None else now - max(broken_at, pod.last_heartbeat_at)
            over = silent > self.opt.agent_timeout_s and silent > limit
            broke = quiet is not None and quiet > self.opt.agent_timeout_s
            if over and (broke or self.heartbeat_s <= HEARTBEAT_FLOOR_S or silent > 2 * limit):
                pod.lost = True
                self._node_lost(pod, now, f"its agent missed heartbeats for {silent:.2f} s")
            elif broke:
                pod.lost = True
                why = f"its agent's order stream broke {quiet:.2f} s ago, nothing since"
                self._node_lost(pod, now, why)
            elif over and full:
                silent_pods.append((pod, f"its agent missed heartbeats for {silent:.2f} s"))
        # Many agents silent at once with their streams open says more of the control plane
        # (its host stalled, its own backlog) than of the nodes: in a large job, more than a
        # tenth of the pods silent in one check wait up to a second limit before they are
        # lost (Kubernetes stops evicting when most of a zone's nodes look down).
        storm = self.heartbeat_s > HEARTBEAT_FLOOR_S and len(silent_pods) > 0.1 * len(self.pods)
        if storm:
            log.warning(
                "%d agents silent at once with their streams open: held as a control-plane "
                "stall until twice their silence limit",
                len(silent_pods),
            )
            return
        for pod, why in silent_pods:
            pod.lost = True
            self._node_lost(pod, now, why)

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

    def _broken_stream_pods(self) -> list[PodProcess]:
        """The pods whose agent's order stream broke (and has not opened again)."""
        return [
            p for (name, pid) in self.streams_broken if (p := self.pods.get(name)) and p.pid == pid
        ]

    def _quiet_s(self) -> float:
        """An agent may be silent for a heartbeat interval: it looks lost after half as long
        again (or after 0.5 s once its order stream broke)."""
        return max(0.5, 1.5 * self.heartbeat_s)

    def _settle(self, now: float) -> None:
        quiet_s = self._quiet_s()
        if self.heartbeat_s <= HEARTBEAT_FLOOR_S:
            silent = any(
                not (p.finished or p.stopped or p.lost)
                and (s := now - p.last_heartbeat_at) > 0.5
                and (s > quiet_s or (p.pod, p.pid) in self.streams_broken)
                for p in self.pods.values()
            )
        else:  # the agents silent that long were counted by the last full check
            silent = self.long_silent or any(
                not (p.finished or p.stopped or p.lost) and now - p.last_heartbeat_at > 0.5
                for p in self._broken_stream_pods()
            )
        self.detector, faults = self.detector.settle(now, agent_silent=silent, gather_s=GATHER_S)
        self.faults_detected(faults, now)

    def _stragglers(self, now: float) -> None:
        """A node whose ranks compute slower than their peers' is a sub-health fault; not
        watched while an incident is handled (the steps of a recovery are not compared)."""
        if self.incident is not None or self.outcome is not None:
            return
        node_of: dict[int, str] = {}
        pod_of: dict[int, str] = {}
        for pod in self.pods.values():
            if not (pod.finished or pod.stopped or pod.lost):
                for rank in pod.rank_pids:
                    node_of[rank], pod_of[rank] = pod.node, pod.pod
        for fault in self.stragglers.poll(now, self.ranks, node_of, pod_of):
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
        newest = max((v.committed for v in self.ranks.values()), default=self.progress_step)
        faults = [self._record_fault(f, now, newest) for f in found]
        stopping = [f for f in faults if f.level.stops_training]
        together = len(stopping) > 1
        for fault in faults:
            if together and fault.level.stops_training:
                if fault is stopping[0]:
                    self._decide(stopping, now, newest)
                continue
            self._decide([fault], now, newest)

    def _record_fault(self, fault: Fault, now: float, newest: int) -> Fault:
        if fault.kind in (FaultKind.DEVICE, FaultKind.DEVICE_MEMORY, FaultKind.STRESS_TEST):
            fault = escalate(fault, self.history, now, self.codes)
        self.history.append(fault)
        self.n_faults += 1
        # The step a rank said it failed; else the newest commit heard of (reports of commits
        # may still be on their way when a fault is detected at once).
        step = fault.step if fault.step is not None else newest
        fault_id = f"f{self.n_faults}"
        self.ledger.record(
            FaultDetected(
                fault_id=fault_id,
                source=str(fault.kind),
                code=fault.code,
                level=str(fault.level),
                occurred_at=fault.at,
                step=step,
                pods=(fault.pod,) if fault.pod else (),
                nodes=(fault.node,) if fault.node else (),
                ranks=fault.ranks,
                detail=fault.detail[-2000:],
            ),
            at=now,
        )
        self.console.line(
            f"fault {fault_id}: {fault.describe()}"
            + (f": {fault.detail.splitlines()[0]}" if fault.detail else "")
        )
        if self.incident is None:
            self.incident = Incident(fault_id=fault_id, fault=fault, step_at_fault=step)
        return fault

    def _decide(self, faults: Sequence[Fault], now: float, newest: int) -> None:
        first = faults[0]
        step = first.step if first.step is not None else newest
        self.executor.policy(
            PolicyFault(
                fault=first,
                feasibility=self.feasibility(faults, now),
                progress_step=max(step, self.progress_step),
                together=tuple(faults[1:]),
            ),
            now,
        )

    def feasibility(self, faults: Sequence[Fault], now: float) -> Feasibility:
        """What is possible now, as the policy needs it (see :class:`Feasibility`).

        Unbroken assumes data parallelism: every rank holds a full replica of the model and
        optimizer (DDP). A replica of the lost state exists when a rank outside the fault is
        alive and every worker can recover in process (its heartbeat says so). Such workers
        never apply half a step: a failed collective skips the optimizer update, an update
        that raised marks the rank suspect, and the repair takes the most advanced replica and
        checks that every rank agrees (step and state digest) before training resumes; so
        "outside the optimizer update" holds whenever in-process recovery does.
        """
        rank0_pod = self.job.pod_of_rank(0)
        process_off = ""
        if self.diverged_generation == self.generation:
            process_off = "replicas diverged, so no replica can be trusted"
        elif not self.executor.in_process_recovery():
            off = sorted(r for r, v in self.ranks.items() if not v.recoverable)
            process_off = (
                f"rank(s) {_some(off)} cannot be repaired in process (their "
                "logs say why: no DDP model, one rank, or a DDP configuration it refuses)"
                if off
                else ""
            )
        in_process = (
            not process_off
            and self.executor.in_process_recovery()
            and self.executor.healthy_rank_left(faults)
        )
        elastic_off = self.executor.elastic_refusal(faults) or ""
        pods = {f.pod for f in faults if f.pod is not None}
        return Feasibility(
            process_off=process_off,
            replica_for_lost_state=in_process,
            outside_update=in_process,
            spare_node_free=self.executor.spare_node_free(max(1, len(pods))),
            fault_age_s=max(0.0, now - min(f.at for f in faults)),
            rank0_pod_faulty=rank0_pod in pods,
            pod_schedulable=self.executor.schedulable(faults),
            pod_may_pend=self.executor.may_pend(faults),
            elastic_possible=in_process and not elastic_off,
            elastic_off=elastic_off,
        )

    def _phases(self, now: float, scan: bool = True) -> None:
        gen = self.generation
        if not scan and all(self.phases_done.get(k) == gen for k in ("comm", "state", "first")):
            return  # the generation trains: its progress is read at the next scan
        world_size = self.executor.world_size()  # smaller while an elastic job is scaled in
        if len(self.ranks) < world_size:
            return
        ph = self.phase_watch.phases(
            self.ranks, world_size, gen, self.generation_began.get(gen, 0.0)
        )
        if ph.comm_ready_at and self.phases_done.get("comm") != gen:
            self.phases_done["comm"] = gen
            self.ledger.record(
                CommunicationReady(generation=gen, world_size=world_size),
                at=ph.comm_ready_at,
            )
        if ph.state_loaded_at and self.phases_done.get("state") != gen:
            self.phases_done["state"] = gen
            if gen in self.replica_step:  # in-process recovery: state from a replica
                start, source = self.replica_step[gen], StateSource.REPLICA
            else:
                start = ph.start_step if ph.start_step is not None else 0
                source = StateSource.CHECKPOINT if start > 0 else StateSource.INITIAL
            self.ledger.record(
                StateLoaded(generation=gen, step=start, source=source), at=ph.state_loaded_at
            )
            if self.incident is not None:
                self.console.line(f"generation {gen}: state loaded at step {start} ({source})")
        if ph.first_commit_at and self.phases_done.get("first") != gen:
            self.phases_done["first"] = gen
            resumed = self.replica_step.get(gen, ph.start_step or 0)
            first = resumed + 1
            self.ledger.record(
                FirstStepCommitted(generation=gen, step=first), at=ph.first_commit_at
            )
            self.stress.resumed(gen, ph.first_commit_at, first)
            self.executor.generation_committed(gen, ph.first_commit_at, first)
            rung = self.executor.rung_of(gen)
            if self.incident is not None and self.executor.stale(rung):
                # A rung given up began this generation; the rung now carried out will
                # begin its own, whose first commit ends the incident.
                log.info("generation %d committed, but its rung %s was given up", gen, rung)
            elif self.incident is not None:
                inc = self.incident
                self.incident = None
                self.n_recoveries += 1
                mttr = ph.first_commit_at - inc.fault.at
                self.ledger.record(
                    RecoveryCompleted(
                        fault_id=inc.fault_id,
                        strategy=inc.strategy,
                        generation=gen,
                        step=first,
                        phases_s={"mttr": mttr},
                    ),
                    at=ph.first_commit_at,
                )
                lost = max(0, inc.step_at_fault - resumed)
                self.console.line(
                    f"recovered from {inc.fault_id} by {inc.strategy}: MTTR {mttr:.2f} s, "
                    f"{lost} steps recomputed, generation {gen}"
                )
                self.executor.switch_done(gen, ph.first_commit_at, first)
                self.executor.policy(
                    PolicyRecovered(at=ph.first_commit_at, generation=rung),
                    now,
                )
        if not scan:
            return  # progress, a pass over every rank, is read at the scans of a large job
        step = committed_step(self.ranks.values())
        every = self.opt.progress_every
        if step // every > self.progress_step // every:
            self.ledger.record(
                StepProgress(
                    generation=gen,
                    step=step,
                    step_time_s=median_step_time(self.ranks.values()),
                    rank_step_times_s=tuple(
                        self.ranks[r].step_time_s if r in self.ranks else 0.0
                        for r in range(self.job.world_size)
                    ),
                )
            )
            total = f"/{self.job.total_steps}" if self.job.total_steps else ""
            self.console.line(
                f"step {step}{total} (generation {gen}, "
                f"{median_step_time(self.ranks.values()) * 1000:.0f} ms/step)"
            )
        self.progress_step = max(self.progress_step, step)

    # ---- status -----------------------------------------------------------------------
    def _write_status(self, now: float, force: bool = False) -> None:
        if not force and now < self.next_status_at:
            return
        self.next_status_at = now + max(0.5, self.scan_s)
        if self.outcome is not None:
            phase = JobPhase.SUCCEEDED if self.outcome.succeeded else JobPhase.FAILED
        elif self.incident is not None:
            phase = JobPhase.RECOVERING
        elif len(self.ranks) == self.executor.world_size():
            phase = JobPhase.RUNNING
        else:
            phase = JobPhase.PENDING
        pods = []
        for name in (p.name for p in self.job.pods):
            proc = self.pods.get(name)
            binding = self.executor.cluster.bindings.get(name)
            pids = proc.rank_pids if proc else {}
            pods.append(
                PodStatus(
                    name=name,
                    node=binding.node if binding else "",
                    devices=binding.devices if binding else (),
                    ranks=tuple(sorted(pids)),
                    pids=tuple(pids[r] for r in sorted(pids)),
                )
            )
        self.ledger.set_status(
            JobStatus(
                job=self.job.job_id,
                phase=phase,
                generation=self.generation,
                step=self.progress_step,
                total_steps=self.job.total_steps,
                pods=tuple(pods),
                started_at=self.started_at,
                updated_at=now,
                faults=self.n_faults,
                recoveries=self.n_recoveries,
                message=self.outcome.reason
                if self.outcome
                else self.pending_reason
                if self.pending_reason
                else (
                    f"recovering from {self.incident.fault_id} ({self.incident.strategy})"
                    if self.incident
                    else self._scaled_in_message()
                ),
            )
        )

    def _scaled_in_message(self) -> str:
        el = self.executor.elastic
        if not el.shrunk:
            return ""
        return (
            f"scaled in: world size {el.world_size} of {self.job.world_size} "
            f"({', '.join(el.dropped_pods)} dropped); scales out when a node is free"
        )

    # ---- fault injection (unbroken.chaos.injector) ------------------------------------
    def _chaos(self, now: float) -> None:
        for c in due(self.chaos, self.fired_chaos, now - self.started_at, self.progress_step):
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

    def _record_injected(self, at: float, kind: str, detail: str) -> None:
        self.ledger.record_raw("FaultInjected", {"fault": kind, "detail": detail}, at=at)

    @property
    def world_size(self) -> int:
        return self.job.world_size

    @property
    def nodes(self) -> Sequence[str]:
        return self.cl.nodes

    @property
    def devices_per_node(self) -> int:
        return self.cl.devices_per_node

    def rank_targets(self) -> Mapping[int, RankTarget]:
        return {
            r: RankTarget(rank=r, pid=v.pid, pod=self.job.pod_of_rank(r), alive=v.alive)
            for r, v in self.ranks.items()
        }

    def pod_names(self) -> Sequence[str]:
        return list(self.pods)

    def store_ports(self) -> tuple[int, ...]:
        return (self.master_port, self.job.master_port or 0)

    def return_node(self, node: str) -> str:
        return self.executor.return_node(node)

    def signal_rank(self, rank: int, pid: int, sig: int) -> None:
        """A rank of a pod on a joined host is signalled by that host's agent (its pid is that
        host's); any other here."""
        pod = self.pods.get(self.job.pod_of_rank(rank) or "")
        registry = self.executor.remote_nodes
        if registry is not None and pod is not None:
            registry.order(pod.node, {"kind": "signal", "pid": pid, "sig": int(sig)})
            return
        os.kill(pid, sig)

    def node_pids(self, node: str) -> list[int]:
        return [
            pid
            for p in self.pods.values()
            if p.node == node and p.alive
            for pid in (p.proc.pid, *p.rank_pids.values())
        ]

    def take_node_down(self, node: str) -> int:
        killed: list[int] = []
        for p in self.pods.values():
            if p.node == node and p.alive:
                killed += p.kill_all()
        self.executor.end_spare(node)
        return len(killed)


def _some(items: Sequence[int], shown: int = 16) -> str:
    """``items`` for a reason: the first ``shown`` and how many in all (a decision's reason at
    10k nodes listed 300 ranks)."""
    head = ", ".join(map(str, items[:shown]))
    return head if len(items) <= shown else f"{head}, ... ({len(items)} in all)"
