"""The node agent under a job manager: start ranks, watch them, report, obey commands.

One agent runs per pod. It says hello to the control plane, starts its ranks for the generation
it is given, and then, every tick:

- reports each rank exit at once (``rank-exited``: signal, exit code, traceback), except exits
  it caused itself (restart or stop commands);
- checks each rank's heartbeat record: a rank whose liveness tick and progress both stopped
  for three of its step times, measured online (:mod:`unbroken.agent.hang`), is reported
  ``rank-hung``;
- sends a heartbeat with every rank's progress (phase, step, last committed step);
- once every rank exited 0, reports ``pod-finished`` with the ranks that never started an
  Unbroken session (no heartbeat record of their own process): the job manager fails such a
  job ("rank N exited 0 without starting an Unbroken session; nothing was trained") rather
  than call a script that forgot ``unbroken.worker.init`` a success;
- carries out orders from the manager's stream: ``restart`` (kill the ranks, start them again
  under a new generation), ``stop`` (SIGTERM, SIGKILL after the grace period or as soon as a
  rank is seen blocked, since a rank stuck inside a collective never runs its handler; or SIGKILL
  at once for force), then exit.

Reports and orders are the typed messages of :mod:`unbroken.protocol.messages`.

The agent imports no torch: it starts in a fraction of a second, which matters when a pod is
rescheduled. When the control plane stops answering for ``control_timeout_s`` the agent kills
its ranks and exits non-zero with a message naming the address: it never trains on unsupervised.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import queue
import signal
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, assert_never

from unbroken.agent.children import reap_orphans
from unbroken.agent.env import CONTROL_VARS, rank_env
from unbroken.agent.gpumem import GpuMemory, pod_gpus
from unbroken.agent.hang import HangSettings, StepClock, blocked, hang_timeout_s, hung
from unbroken.agent.launcher import LaunchArgs
from unbroken.agent.mindspore import (
    SchedulerSlot,
    is_mindspore,
    last_words_grace_s,
    last_words_hold_s,
    worker_env,
)
from unbroken.agent.planes import PLANES_VAR, START_PLANE_VAR, PlaneWatch, cut_plane, decode_planes
from unbroken.agent.ranks import RankExit, RankProcess, Zygote, rank_argv, start_zygote
from unbroken.protocol.exitreport import read_exit_report
from unbroken.protocol.heartbeat import HeartbeatReader, HeartbeatRecord, Phase
from unbroken.protocol.kinds import StepFailure
from unbroken.protocol.mailbox import Dump, MailboxWriter, Pause, Rejoin, Stress
from unbroken.protocol.messages import (
    COMMANDS,
    HEARTBEAT,
    HEARTBEATS,
    AgentHeartbeat,
    AgentHello,
    CutPlane,
    EndRanks,
    HelloAnswer,
    Order,
    PauseRanks,
    PlaneCarrierChanged,
    PodFinished,
    PodStopped,
    ProtocolError,
    RankExited,
    RankFailed,
    RankHung,
    RankProgress,
    RanksRejoined,
    RanksStarted,
    RejoinRanks,
    Report,
    RestartRanks,
    Sender,
    StopPod,
    StressRanks,
    WriteLastWords,
    decode_answer,
    decode_order,
    encode_report,
    method_of,
)
from unbroken.rpc import ControlClient, RpcError
from unbroken.rpc.tls import CredentialsError, read_credentials
from unbroken.spec.injected_env import switched_off
from unbroken.worker.env import WARM_DIR
from unbroken.worker.linkfault import LinkFaultError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AgentSettings:
    pod: str
    control: str
    secret: str
    run_dir: Path
    heartbeat_interval_s: float = 0.1
    hang: HangSettings = dataclasses.field(default_factory=HangSettings)
    control_timeout_s: float = 10.0
    standby: bool = True  # keep a zygote that forks ranks warm (UNBROKEN_STANDBY=0: off)
    #: The host's credentials (a pod on a joined host): the token and mutual TLS from there.
    credentials: Path | None = None

    @staticmethod
    def from_env(env: Mapping[str, str]) -> AgentSettings | None:
        control = env.get("UNBROKEN_CONTROL")
        if not control:
            return None
        return AgentSettings(
            pod=env["UNBROKEN_POD"],
            control=control,
            secret=env.get("UNBROKEN_SECRET", ""),
            run_dir=Path(env["UNBROKEN_RUN_DIR"]),
            hang=HangSettings(
                factor=float(env.get("UNBROKEN_HANG_FACTOR", str(HangSettings.factor))),
                floor_s=float(env.get("UNBROKEN_HANG_FLOOR_S", str(HangSettings.floor_s))),
                startup_s=float(env.get("UNBROKEN_HANG_STARTUP_S", str(HangSettings.startup_s))),
            ),
            standby=env.get("UNBROKEN_STANDBY", "1") != "0",
            credentials=Path(env["UNBROKEN_CREDENTIALS"])
            if env.get("UNBROKEN_CREDENTIALS")
            else None,
        )


def _client(settings: AgentSettings) -> ControlClient:
    """The agent's client of the control plane: with its host's credentials (mutual TLS, the
    token from there) on a joined host, else with the secret it was given."""
    if settings.credentials is None:
        return ControlClient(settings.control, settings.secret, timeout_s=3.0)
    try:
        creds = read_credentials(settings.credentials, "UNBROKEN_CREDENTIALS")
    except CredentialsError as exc:
        raise AgentExit(2, str(exc)) from None
    return ControlClient(settings.control, creds.token, timeout_s=3.0, tls=creds)


class AgentExit(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


class ManagedAgent:
    def __init__(self, args: LaunchArgs, settings: AgentSettings) -> None:
        self.args = args
        self.s = settings
        self.client = _client(settings)
        self._beats = self.client.pipe(HEARTBEATS, HEARTBEAT)
        self.generation = -1
        self.ranks: dict[int, RankProcess] = {}
        self.done: set[int] = set()
        self.hung_reported: set[tuple[int, int]] = set()
        self._exits: queue.Queue[RankExit] = queue.Queue()
        self._commands: queue.Queue[Order] = queue.Queue()
        # Set when an order or a rank's exit arrives: the loop acts on it at once instead of
        # at its next tick.
        self._wake = threading.Event()
        self._milestones: tuple[tuple[Any, ...], ...] = ()  # what the last heartbeat showed
        self.heartbeat_s = settings.heartbeat_interval_s
        self._expected_exit: set[int] = set()  # pids we are stopping on purpose
        self._last_contact = time.monotonic()
        self._readers: dict[int, HeartbeatReader] = {}
        self._mailboxes: dict[int, MailboxWriter] = {}
        self._failed_seen: dict[int, float] = {}
        self._clocks: dict[int, StepClock] = {}  # rank -> its process's step time
        self._failures_reported: set[tuple[int, float]] = set()
        self._ended_after_failure: set[int] = set()
        self.pod_dir = settings.run_dir / "pods" / settings.pod
        self.mindspore = is_mindspore(os.environ)  # ranks not forked from a torch zygote
        self._scheduler = SchedulerSlot()
        self.use_standby = settings.standby and not args.no_python and not self.mindspore
        # One zygote (unbroken.agent.standby) forks every rank this agent starts, once it is
        # warm; a spare agent's comes with it (unbroken.agent.spare).
        self._zygote: Zygote | None = None
        self._zygote_at: float | None = None  # start one once the ranks train, or then
        self._unannounced: Callable[[dict[int, int]], Report] | None = None
        self._reap_at = 0.0
        # The host's network planes (unbroken.agent.planes): watched each tick; the ranks'
        # collectives run over ``self.plane``'s interface.
        planes = decode_planes(os.environ.get(PLANES_VAR, ""))
        self._ifnames = {p.name: p.ifname for p in planes}
        self._plane_watch = PlaneWatch(planes) if planes else None
        start = os.environ.get(START_PLANE_VAR, "")
        self.plane = start if start in self._ifnames else planes[0].name if planes else ""
        # The pod's GPUs: a replacement waits there for its predecessor's device memory.
        self._gpu_memory = GpuMemory(pod_gpus(os.environ))

    # ---- control plane ----------------------------------------------------------------
    def _send(self, report: Report) -> dict[str, Any]:
        sender = Sender(
            pod=self.s.pod, agent_pid=os.getpid(), generation=self.generation, at=time.time()
        )
        method, body = method_of(report), encode_report(sender, report)
        try:
            if method == HEARTBEAT:
                reply = self._heartbeat_call(body)
            else:
                reply = self.client.call(method, body)
        except RpcError as exc:
            if time.monotonic() - self._last_contact > self.s.control_timeout_s:
                raise AgentExit(3, f"giving up: {exc}") from None
            log.warning("%s", exc)
            return {}
        self._last_contact = time.monotonic()
        return reply

    def _heartbeat_call(self, body: dict[str, Any]) -> dict[str, Any]:
        """A heartbeat over the agent's heartbeat stream, answered before anything else is
        sent (a report that follows it is handled after it); over a unary call when the stream
        failed (a heartbeat told twice changes nothing)."""
        try:
            return self._beats.call(body)
        except RpcError as exc:
            log.debug("heartbeat stream: %s", exc)
            return self.client.call(HEARTBEAT, body)

    def _watch_commands(self) -> None:
        while True:
            try:
                for body in self.client.stream(COMMANDS, {"pod": self.s.pod, "pid": os.getpid()}):
                    try:
                        self._commands.put(decode_order(body))
                        self._wake.set()
                    except ProtocolError as exc:
                        log.error("order from the manager refused: %s", exc)
                return  # the server closed the stream: the run is over
            except RpcError as exc:
                log.debug("command stream interrupted: %s", exc)
                time.sleep(0.2)

    # ---- ranks ----------------------------------------------------------------------
    def _heartbeat_path(self, local_rank: int, generation: int) -> Path:
        return self.pod_dir / "hb" / f"rank{self.args.global_rank(local_rank)}-g{generation}"

    def _mailbox_path(self, local_rank: int, generation: int) -> Path:
        return self.pod_dir / "mb" / f"rank{self.args.global_rank(local_rank)}-g{generation}"

    def _start_rank(
        self, local: int, generation: int, join: bool, world: tuple[int, ...] = ()
    ) -> RankProcess:
        """Start one rank; ``join``: it replaces a lost rank and takes its state from a
        replica of the running generation instead of a checkpoint; ``world``: the job's ranks
        of a scaled-in world, in order (empty: all of them), which numbers it."""
        rank = self.args.global_rank(local)
        hb = self._heartbeat_path(local, generation)
        mb = self._mailbox_path(local, generation)
        hb.parent.mkdir(parents=True, exist_ok=True)
        mb.parent.mkdir(parents=True, exist_ok=True)
        env = rank_env(os.environ, self.args, local, generation, hb)
        if world and rank in world:
            env["RANK"] = env["ROLE_RANK"] = str(world.index(rank))
            env["WORLD_SIZE"] = env["ROLE_WORLD_SIZE"] = str(len(world))
        env["UNBROKEN_MAILBOX"] = str(mb)
        env[WARM_DIR] = str(self.pod_dir / "warm")  # unbroken.worker.warmstart
        if self.plane:
            env["GLOO_SOCKET_IFNAME"] = self._ifnames[self.plane]
        if join:
            env["UNBROKEN_JOIN"] = "1"
        if self.mindspore:
            env.update(worker_env(self.args, int(env["RANK"]), local))
        proc = RankProcess(
            rank=rank,
            local_rank=local,
            generation=generation,
            argv=rank_argv(
                self.args.script, self.args.script_args, self.args.module, self.args.no_python
            ),
            env=env,
            log_path=self.pod_dir / "logs" / f"rank{rank}.log",
            on_exit=self._rank_exited,
            zygote=self._live_zygote(),
        )
        self.ranks[rank] = proc
        self._readers[rank] = HeartbeatReader(hb)
        self._mailboxes[rank] = MailboxWriter(mb)
        return proc

    def _start_ranks(self, generation: int) -> None:
        waited = self._gpu_memory.wait_freed(p.pid for p in self.ranks.values())
        self.generation = generation
        self.done.clear()
        self.ranks.clear()
        self._readers.clear()
        self._mailboxes.clear()
        if self.mindspore and self.args.node_rank == 0:  # this pod's agent runs the Scheduler
            self._scheduler.restart(self.args, self.pod_dir)
        if self.use_standby and self._live_zygote() is None:
            # Every rank forked from one zygote: torch is imported once for the pod, not once
            # per rank, and the zygote is warm for the next restart from the start.
            self._start_zygote()
        for local in range(self.args.nproc_per_node):
            self._start_rank(local, generation, join=False)
        self._zygote_at = time.monotonic() + 30.0  # a zygote that died is replaced then
        self._announce(
            lambda pids: RanksStarted(pids=pids, started_at=self._started_at(), device_wait=waited)
        )

    def _started_at(self) -> float:
        return max(p.started_at for p in self.ranks.values())

    def _post_rejoin(self, rank: int, order: RejoinRanks) -> None:
        # An elastic job's smaller world numbers its ranks anew (``order.world``); the source
        # is named by the job's rank, so it is numbered the same way.
        world = order.world or tuple(range(self.args.world_size))
        if rank not in world or order.source not in world:
            log.error("rejoin: rank %d or source %d is not in world %s", rank, order.source, world)
            return
        mailbox = self._mailboxes[rank]
        mailbox.send(
            Rejoin(
                seq=mailbox.next_seq,
                generation=order.generation,
                master_addr=self.args.master_addr,
                master_port=self.args.master_port,
                rank=world.index(rank),
                world_size=len(world),
                source=world.index(order.source),
                step=order.step,
                ifname=self._ifnames.get(order.plane, ""),
            )
        )

    def _rejoin(self, order: RejoinRanks) -> None:
        """Process-level recovery: the healthy ranks of this pod leave the broken group and
        join generation ``order.generation`` without restarting; ranks in ``order.replace``
        (lost or not trusted) get a new process that takes its state from the replica
        ``order.source``."""
        replace = order.replace
        self.generation = order.generation
        if order.plane in self._ifnames:
            self.plane = order.plane  # the replacements below start on it too
        self.args = dataclasses.replace(self.args, master_port=order.master_port)
        ended = [old.pid for r in replace if (old := self.ranks.get(r)) is not None]
        for rank in replace:
            old = self.ranks.get(rank)
            if old is not None and old.alive:
                self._expected_exit.add(old.pid)
                old.kill()
        waited = self._gpu_memory.wait_freed(ended)  # the GPUs' memory of the ended ones
        for rank in replace:
            self._start_rank(
                rank - self.args.global_rank(0), self.generation, join=True, world=order.world
            )
        for rank, proc in self.ranks.items():
            if rank not in replace and proc.alive:
                proc.generation = self.generation  # the same process, now in the new generation
                self._post_rejoin(rank, order)
        for rank in replace:
            self._post_rejoin(rank, order)
        self._zygote_at = time.monotonic() + 30.0
        if not replace:
            # A rejoin that starts no process is not announced: the manager moved the ranks
            # into the generation as it sent the order (a start not yet announced is moot).
            self._unannounced = None
            return
        self._announce(
            lambda pids: RanksRejoined(
                pids=pids, joined=replace, started_at=self._started_at(), device_wait=waited
            )
        )

    def _announce(self, report: Callable[[dict[int, int]], Report]) -> None:
        """Send the report of ranks just started once every rank has its pid: a rank forked
        by the zygote gets it a moment after the order, or once the zygote's imports are done
        (a replacement started meanwhile supersedes the report not sent yet)."""
        self._unannounced = report
        self._announce_ranks()

    def _announce_ranks(self) -> None:
        if self._unannounced is None or any(p.pending for p in self.ranks.values()):
            return
        report, self._unannounced = self._unannounced, None
        self._send(report({r: p.pid for r, p in self.ranks.items()}))

    def _keep_zygote(self) -> None:
        """Start a zygote when there is none (or it died) once the ranks train."""
        if not self.use_standby or self._zygote_at is None:
            return
        training = all(
            (snap := self._readers[r].read()) is not None and snap.first_commit_at > 0
            for r in self.ranks
        )
        if not training and time.monotonic() < self._zygote_at:
            return
        self._zygote_at = None
        if self._live_zygote() is None:
            self._start_zygote()

    def _start_zygote(self) -> None:
        env = {k: v for k, v in os.environ.items() if k not in CONTROL_VARS}
        env.setdefault("OMP_NUM_THREADS", "1")
        self._zygote = start_zygote(env, self.pod_dir / "logs" / "standby.log")

    def _live_zygote(self) -> Zygote | None:
        if self._zygote is not None and not self._zygote.alive:
            self._drop_zygote()
        return self._zygote

    def adopt_zygote(self, zygote: Zygote | None) -> None:
        """Take a zygote started before this agent existed (a spare pod's:
        :mod:`unbroken.agent.spare`)."""
        if zygote is None:
            return
        if self.use_standby and zygote.alive:
            self._drop_zygote()
            self._zygote = zygote
        else:
            zygote.close()

    def _drop_zygote(self) -> None:
        if self._zygote is not None:
            self._zygote.close()
            self._zygote = None

    def _stop_ranks(self, grace_s: float | None, *, hold: bool = True) -> None:
        live = [p for p in self.ranks.values() if p.alive]
        self._expected_exit.update(p.pid for p in live)
        if grace_s is None:
            for p in live:
                p.kill()
        else:
            for p in live:
                p.signal(signal.SIGTERM)
            began, deadline = time.time(), time.monotonic() + grace_s
            hold_until = time.monotonic() + (last_words_hold_s(os.environ) if hold else 0.0)
            while time.monotonic() < deadline and any(p.alive for p in live):
                # A rank that stopped ticking or stopped making progress cannot act on
                # SIGTERM (blocked in a collective or stopped): do not wait the grace out,
                # unless it may yet write last words and none of this pod's ranks did.
                held = time.monotonic() < hold_until and not self._dumped_since(began)
                for p in live:
                    if p.alive and not held and self._blocked(p.rank):
                        p.kill()
                self._send(AgentHeartbeat(ranks=self._progress()))  # alive; last words heard
                time.sleep(0.05)
            for p in live:
                p.kill()
        for p in live:
            p.wait(5.0)
        self._scheduler.stop()

    def _dumped_since(self, at: float) -> bool:
        snaps = (reader.read() for reader in self._readers.values())
        return any(snap is not None and snap.dumped_at > at for snap in snaps)

    def _blocked(self, rank: int) -> bool:
        snap = self._readers[rank].read()
        return snap is not None and blocked(snap, time.time())

    # ---- the loop -------------------------------------------------------------------
    def run(self) -> int:
        # The reference's agent-side switches, as this pod runs with them: the rungs they turn
        # off are off for the job (the manager says so once).
        off = tuple((str(rung), why) for rung, why in switched_off(os.environ).items())
        reply = self._send(
            AgentHello(
                pid=os.getpid(),
                node_rank=self.args.node_rank,
                nproc=self.args.nproc_per_node,
                switched_off=off,
            )
        )
        if not reply:
            raise AgentExit(3, f"control plane at {self.s.control} did not answer the hello")
        try:
            hello: HelloAnswer = decode_answer(reply)
        except ProtocolError as exc:
            raise AgentExit(3, f"the job manager's answer to the hello: {exc}") from None
        if not hello.ok:
            raise AgentExit(3, f"the job manager refused this agent: {hello.error}")
        if hello.heartbeat_s > 0:  # the control plane sets it from the job's size
            self.heartbeat_s = hello.heartbeat_s
        threading.Thread(target=self._watch_commands, name="commands", daemon=True).start()
        if hello.join is not None:
            # A replacement pod: its ranks take their state from a replica (``recover``).
            self.generation = hello.generation
            replace = tuple(self.args.global_rank(i) for i in range(self.args.nproc_per_node))
            self._rejoin(
                RejoinRanks(
                    generation=hello.generation,
                    master_port=self.args.master_port,
                    source=hello.join.source,
                    step=hello.join.step,
                    replace=replace,
                )
            )
        else:
            self._start_ranks(hello.generation)
        # Orders and exits wake the loop at once; the tick bounds how late a change in a
        # rank's heartbeat record (a failed step, a recovery's phase) is seen. Reading the
        # records is a few memory reads, so a short tick costs little.
        tick_s = min(self.args.monitor_interval_s, 0.02)
        next_hb = 0.0
        try:
            return self._loop(tick_s, next_hb)
        finally:
            self._drop_zygote()
            self._scheduler.stop()

    def _loop(self, tick_s: float, next_hb: float) -> int:
        try:
            while True:
                self._announce_ranks()
                self._drain_exits()
                if self.done and len(self.done) == self.args.nproc_per_node:
                    self._send(PodFinished(without_session=tuple(self._without_session())))
                    return 0
                code = self._drain_commands()
                if code is not None:
                    return code
                self._check_hangs()
                self._watch_planes()
                self._keep_zygote()
                if time.monotonic() >= self._reap_at:
                    reap_orphans()  # descendants of ranks, come to this subreaper
                    self._reap_at = time.monotonic() + 1.0
                progress = self._progress()
                milestones = _milestones(progress)
                # A recovery's phases reach the manager as they happen, not up to a heartbeat
                # interval later: each is a step of a rung it waits for.
                if time.monotonic() >= next_hb or milestones != self._milestones:
                    self._send(AgentHeartbeat(ranks=progress))
                    self._milestones = milestones
                    next_hb = time.monotonic() + self.heartbeat_s
                self._wake.wait(tick_s)
                self._wake.clear()
        except AgentExit:
            self._stop_ranks(None)
            raise

    def _watch_planes(self) -> None:
        """Report each change of a plane's carrier at once (every plane on the first look)."""
        if self._plane_watch is None:
            return
        for plane, up in self._plane_watch.changes():
            log.warning("network plane %s is %s", plane, "up" if up else "down")
            names = tuple(self._ifnames)
            self._send(
                PlaneCarrierChanged(plane=plane, up=up, changed_at=time.time(), planes=names)
            )

    def _cut_plane(self, plane: str) -> None:
        ifname = self._ifnames.get(plane)
        if ifname is None:
            log.error("cut-plane: this host has no plane %r", plane)
            return
        pids = [p.pid for p in self.ranks.values() if p.alive]
        try:
            cut = cut_plane(pids, ifname)
        except LinkFaultError as exc:
            log.error("cut-plane %s: %s", plane, exc)
            return
        log.warning("plane %s: %d connection(s) of the ranks on %s reset", plane, len(cut), ifname)

    def _rank_exited(self, ex: RankExit) -> None:
        self._exits.put(ex)
        self._wake.set()

    def _drain_exits(self) -> None:
        while True:
            try:
                ex = self._exits.get_nowait()
            except queue.Empty:
                return
            if ex.pid in self._expected_exit:
                self._expected_exit.discard(ex.pid)
                continue
            if ex.generation != self.generation:
                continue
            if ex.succeeded:
                self.done.add(ex.rank)
                continue
            snap = self._readers[ex.rank].read() if ex.rank in self._readers else None
            if snap is not None and snap.pid == ex.pid and snap.phase is Phase.DONE:
                # Training finished and the session closed; the exit status came from the
                # interpreter's teardown afterwards. The rank's work is complete.
                log.warning("rank %d finished training, then %s", ex.rank, ex.describe())
                self.done.add(ex.rank)
                continue
            if ex.pid in self._ended_after_failure:
                ex = dataclasses.replace(ex, ended_after_failure=True)
            log.warning("rank %d (pid %d) %s", ex.rank, ex.pid, ex.describe())
            snap = self._readers[ex.rank].read() if ex.rank in self._readers else None
            ex = self._as_reported(ex, snap)
            self._send(
                RankExited(
                    rank=ex.rank,
                    pid=ex.pid,
                    returncode=ex.returncode,
                    exited_at=ex.at,
                    signal=None if ex.ended_after_failure else ex.signal_name,
                    ended_after_failure=ex.ended_after_failure,
                    traceback=ex.traceback[-8000:],
                    peer_failure=ex.peer_failure,
                    committed=snap.committed if snap is not None and snap.pid == ex.pid else None,
                    exception=ex.exception,
                    device_code=ex.device_code,
                )
            )

    def _as_reported(self, ex: RankExit, snap: HeartbeatRecord | None) -> RankExit:
        """``ex`` with what the rank itself said of its end: the exit report its exception hook
        wrote, else the failure of the step it was stopped in (its heartbeat)."""
        if ex.rank not in self._readers:
            return ex
        report = read_exit_report(self._readers[ex.rank].path, ex.pid)
        if report is not None:
            return dataclasses.replace(
                ex,
                reported_failure=report.failure,
                exception=report.exception,
                device_code=report.device_code,
            )
        stopped = snap is not None and snap.pid == ex.pid and snap.failed_step >= 0
        if ex.ended_after_failure and snap is not None and stopped:
            return dataclasses.replace(ex, reported_failure=StepFailure(snap.failure))
        return ex

    def _drain_commands(self) -> int | None:
        while True:
            try:
                order = self._commands.get_nowait()
            except queue.Empty:
                return None
            code = self._obey(order)
            if code is not None:
                return code

    def _obey(self, order: Order) -> int | None:
        """Carry out one order; the agent's exit status when the order ends it."""
        match order:
            case RestartRanks(generation=generation, master_port=port, last_words=written):
                self._stop_ranks(last_words_grace_s(os.environ), hold=not written)  # TTP
                if port:
                    self.args = dataclasses.replace(self.args, master_port=port)
                self._start_ranks(generation)
            case EndRanks(
                ranks=ranks
            ):  # to be replaced: a hung one holds its peers in a collective
                for rank in ranks:
                    proc = self.ranks.get(rank)
                    if proc is not None and proc.alive:
                        self._expected_exit.add(proc.pid)
                        proc.kill()
            case PauseRanks():
                for rank, proc in self.ranks.items():
                    if proc.alive and rank in self._mailboxes:
                        mailbox = self._mailboxes[rank]
                        mailbox.send(Pause(seq=mailbox.next_seq))
            case RejoinRanks():
                self._rejoin(order)
            case CutPlane(plane=plane):
                self._cut_plane(plane)
            case StressRanks(round=round_, master_port=port):  # ranks stopped at a boundary
                for rank, proc in self.ranks.items():
                    if proc.alive and rank in self._mailboxes:
                        mailbox = self._mailboxes[rank]
                        mailbox.send(
                            Stress(
                                seq=mailbox.next_seq,
                                round=round_,
                                master_addr=self.args.master_addr,
                                master_port=port,
                                rank=rank,
                                world_size=self.args.world_size,
                            )
                        )
            case WriteLastWords(rank=rank):  # last words from one stopped rank of this pod
                proc = self.ranks.get(rank)
                if proc is not None and proc.alive and rank in self._mailboxes:
                    mailbox = self._mailboxes[rank]
                    mailbox.send(Dump(seq=mailbox.next_seq))
                else:
                    log.error("dump: rank %d of this pod is not running", rank)
            case StopPod(grace_s=grace_s, success=success):
                self._stop_ranks(grace_s)
                self._send(PodStopped())
                return 0 if success else 143
            case _:
                assert_never(order)
        return None

    def _report_step_failure(self, rank: int, proc: RankProcess, snap: HeartbeatRecord) -> None:
        """A rank that survived a failed step: its state is suspect (the update raised) or
        corrupt (device memory error), or a collective failed. A failed collective is most
        often the echo of a peer's death, which that peer's agent reports; the manager holds
        it back for the first fault and takes it for a link fault only when none comes."""
        if snap.failure not in (
            StepFailure.UPDATE,
            StepFailure.DEVICE_MEMORY,
            StepFailure.OUT_OF_MEMORY,
            StepFailure.COLLECTIVE,
        ):
            return
        key = (rank, snap.failed_at)
        if key in self._failures_reported:
            return
        self._failures_reported.add(key)
        local = rank - self.args.global_rank(0)
        devices = [int(d) for d in os.environ.get("UNBROKEN_DEVICES", "").split(",") if d]
        self._send(
            RankFailed(
                rank=rank,
                pid=proc.pid,
                failure=StepFailure(snap.failure),
                failed_step=snap.failed_step,
                failed_at=snap.failed_at,
                device=devices[local] if local < len(devices) else None,
                traceback=proc.traceback()[-4000:],
            )
        )

    def _end_failed(self, proc: RankProcess, now: float) -> None:
        """A rank whose training loop raised can take seconds to exit (thread joins, group
        teardown). Once its traceback is in the log, or after 5 s, the agent ends it so the
        fault is reported at once."""
        seen = self._failed_seen.setdefault(proc.pid, now)
        if proc.traceback() or now - seen > 5.0:
            self._ended_after_failure.add(proc.pid)
            proc.kill()

    def _check_hangs(self) -> None:
        now = time.time()
        for rank, proc in self.ranks.items():
            if not proc.alive or (rank, self.generation) in self.hung_reported:
                continue
            snap = self._readers[rank].read()
            if snap is not None and snap.pid == proc.pid and snap.phase is Phase.FAILED:
                self._end_failed(proc, now)
                continue
            if snap is not None and snap.pid == proc.pid and snap.phase is Phase.STOPPING:
                self._report_step_failure(rank, proc, snap)
            if snap is None or snap.pid != proc.pid or snap.phase is Phase.DONE:
                continue  # finished ranks wait for their peers at exit without ticking
            clock = self._clocks.get(rank)
            clock = StepClock.of(snap) if clock is None else clock.observe(snap)
            self._clocks[rank] = clock
            silence = hung(snap, hang_timeout_s(clock, self.s.hang), now)
            if silence is not None:
                self.hung_reported.add((rank, self.generation))
                log.warning(
                    "rank %d (pid %d) silent for %.2f s: hung", rank, proc.pid, silence.silent_s
                )
                self._send(
                    RankHung(
                        rank=rank,
                        pid=proc.pid,
                        silent_s=silence.silent_s,
                        timeout_s=silence.timeout_s,
                        last_tick_at=snap.tick_at,
                    )
                )

    def _without_session(self) -> list[int]:
        """Ranks whose process never started an Unbroken session (no heartbeat of its own)."""
        out = []
        for rank, proc in sorted(self.ranks.items()):
            reader = self._readers.get(rank)
            snap = reader.read() if reader is not None else None
            if snap is None or snap.pid != proc.pid:
                out.append(rank)
        return out

    def _progress(self) -> tuple[RankProgress, ...]:
        out = []
        for rank, proc in self.ranks.items():
            snap = self._readers[rank].read()
            record = snap if snap is not None and snap.pid == proc.pid else None
            out.append(RankProgress(rank=rank, pid=proc.pid, alive=proc.alive, record=record))
        return tuple(out)


def _milestones(progress: tuple[RankProgress, ...]) -> tuple[tuple[Any, ...], ...]:
    """What in the ranks' progress the manager acts on (phases, a recovery's stamps, a failed
    step, last words), not the step counters that move every step."""
    out: list[tuple[Any, ...]] = []
    for p in progress:
        r = p.record
        if r is None:
            out.append((p.rank, p.pid, p.alive))
            continue
        marks = (r.phase, r.generation, r.failed_step, r.command_seq, r.dump_failed_at)
        stamps = (r.comm_ready_at, r.state_loaded_at, r.first_commit_at, r.dumped_at)
        out.append((p.rank, p.pid, p.alive, *marks, *stamps))
    return tuple(out)
