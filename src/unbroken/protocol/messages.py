"""What agents and the job manager say to each other: typed messages and their one codec.

Agents send *reports* (past facts: :class:`RankExited`, :class:`RanksStarted`, ...) over the
control plane's unary calls and receive *orders* (imperatives: :class:`RestartRanks`,
:class:`PauseRanks`, ...) on their command stream. On the wire both are JSON objects; this
module is the only place that builds or reads those objects, so a field is named once and a
receiver matches on types (``match report: case RankExited(): ...``), never on strings.

Wire shapes (unchanged from the dicts sent before this module existed):

- every report carries its :class:`Sender` (``pod``, ``agent_pid``, ``generation``, ``at``);
- ``AgentHello`` adds ``pid``, ``node_rank``, ``nproc`` and, when the pod's environment turns
  rungs off, ``switched_off`` (rung -> the setting that does); its answer is a
  :class:`HelloAnswer`;
- ``AgentHeartbeat`` adds ``ranks``: one row per rank, ``rank``/``pid``/``alive`` and, once
  the rank wrote a heartbeat record, the record's fields (:class:`RankProgress`);
- ``AgentReport`` adds ``event`` (``ranks-started``, ``ranks-rejoined``, ``rank-exited``,
  ``rank-failed``, ``rank-hung``, ``pod-finished``, ``pod-stopped``) and that event's fields;
- an order is an object with ``op`` (``restart``, ``end``, ``pause``, ``rejoin``, ``dump``,
  ``stress``, ``stop``) and its fields.

A malformed message raises :class:`ProtocolError` (a ``ValueError``) naming the message and
the field: the receiver refuses it and goes on. Every field is read with its type and range
(:mod:`unbroken.protocol.wire`): a pid is a process, a rank, a step or a port is in range, a
number is finite, nothing is coerced from another type. Standard library only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from unbroken.protocol.heartbeat import HeartbeatRecord, Phase
from unbroken.protocol.kinds import StepFailure
from unbroken.protocol.wire import (
    DEVICE_MAX,
    GENERATION_MAX,
    ITEMS_MAX,
    PID_MAX,
    PORT_MAX,
    RANK_MAX,
    STEP_MAX,
    TEXT_MAX,
    TIME_MAX,
    JsonObj,
    ProtocolError,
    field,
    flag,
    integer,
    integers,
    listed,
    number,
    obj,
    optional_integer,
    optional_text,
    show,
    text,
    texts,
)

#: The unary methods agents call on the control plane, and the agents' command stream.
HELLO = "AgentHello"
SWITCHED_MAX = 8  # rungs a hello may name as switched off
HEARTBEAT = "AgentHeartbeat"
#: The stream an agent sends its heartbeats over, each answered as the unary call would be.
HEARTBEATS = "AgentHeartbeats"
REPORT = "AgentReport"
COMMANDS = "AgentCommands"


# ---- reports (agent -> manager) ----------------------------------------------------------
@dataclass(frozen=True)
class Sender:
    """Who sent a report: the agent of ``pod`` (process ``agent_pid``) running ``generation``
    (-1 before its ranks started), at wall time ``at``."""

    pod: str
    agent_pid: int
    generation: int = -1
    at: float = 0.0


@dataclass(frozen=True)
class AgentHello:
    """An agent started and asks which generation to run (answered by :class:`HelloAnswer`)."""

    pid: int
    node_rank: int
    nproc: int
    #: Rungs the pod's own environment turns off (``PROCESS_RECOVER``, ...), with the setting
    #: that does: (rung, setting) pairs (:func:`unbroken.spec.injected_env.switched_off`).
    switched_off: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class JoinFrom:
    """A replacement pod's ranks take their state from rank ``source`` at step ``step``."""

    source: int
    step: int


@dataclass(frozen=True)
class HelloAnswer:
    """The manager's answer to a hello: the generation to start, or why the agent is refused;
    ``join``: the pod replaces a lost one and its ranks join a running generation;
    ``heartbeat_s``: the interval of the agent's periodic heartbeat, set from the job's size
    (0: the agent's own)."""

    ok: bool
    generation: int = -1
    join: JoinFrom | None = None
    error: str = ""
    heartbeat_s: float = 0.0


@dataclass(frozen=True)
class RankProgress:
    """One rank as its agent sees it: its process and, once written, its heartbeat record."""

    rank: int
    pid: int
    alive: bool
    record: HeartbeatRecord | None = None


@dataclass(frozen=True)
class AgentHeartbeat:
    """The agent is alive; every rank's progress."""

    ranks: tuple[RankProgress, ...] = ()


@dataclass(frozen=True)
class RanksStarted:
    """The pod's ranks started (all of them) for the sender's generation."""

    pids: Mapping[int, int]
    started_at: float
    device_wait: DeviceWait | None = None


@dataclass(frozen=True)
class DeviceWait:
    """The agent waited for the device memory of the processes it replaced to be freed before
    starting their successors (:mod:`unbroken.agent.gpumem`): until ``freed_at``, ``waited_s``
    in all; ``freed`` False when it gave up at its bound."""

    gpus: tuple[int, ...]
    freed_at: float
    waited_s: float
    freed: bool = True


@dataclass(frozen=True)
class RanksRejoined:
    """The pod's ranks joined the sender's generation in process; ``joined``: the ranks that
    got a new process (replacements), the others kept theirs. Sent only when ``joined`` is
    not empty: a rejoin that starts no process is not announced (the manager moves the pod's
    ranks into the generation as it sends the order, and their heartbeats follow)."""

    pids: Mapping[int, int]
    joined: tuple[int, ...]
    started_at: float
    device_wait: DeviceWait | None = None


@dataclass(frozen=True)
class RankExited:
    """A rank's process ended without the agent asking it to. ``signal``: the signal name when
    a signal ended it (None when the agent ended it after a failure it saw: then
    ``ended_after_failure``); ``peer_failure``: it failed because a collective did (a peer went
    away: an echo); ``exception``: the class of the exception that ended it, as the rank
    reported it (:mod:`unbroken.protocol.exitreport`; "" when it reported none);
    ``committed``: the steps its last heartbeat record counted; ``device_code``: the device
    error code the exception carried (``CUDA-710``: :func:`unbroken.worker.failure.device_code`),
    "" when none."""

    rank: int
    pid: int
    returncode: int
    exited_at: float
    signal: str | None = None
    ended_after_failure: bool = False
    traceback: str = ""
    peer_failure: bool = False
    committed: int | None = None
    exception: str = ""
    device_code: str = ""


@dataclass(frozen=True)
class RankFailed:
    """A live rank failed a step of its own and waits for a command (its heartbeat said so)."""

    rank: int
    pid: int
    failure: StepFailure
    failed_step: int
    failed_at: float
    device: int | None = None
    traceback: str = ""


@dataclass(frozen=True)
class RankHung:
    """Neither a rank's liveness tick nor its steps moved for longer than its hang timeout."""

    rank: int
    pid: int
    silent_s: float
    timeout_s: float
    last_tick_at: float


@dataclass(frozen=True)
class PlaneCarrierChanged:
    """The host's network plane ``plane`` went down (its interface lost carrier) or came up;
    ``planes``: the host's planes in its order of preference."""

    plane: str
    up: bool
    changed_at: float
    planes: tuple[str, ...] = ()


@dataclass(frozen=True)
class PodFinished:
    """Every rank exited 0; ``without_session``: ranks that never started an Unbroken session."""

    without_session: tuple[int, ...] = ()


@dataclass(frozen=True)
class PodStopped:
    """The agent stopped its ranks on the manager's order and exits."""


Event = (
    RanksStarted
    | RanksRejoined
    | RankExited
    | RankFailed
    | RankHung
    | PlaneCarrierChanged
    | PodFinished
    | PodStopped
)
Report = AgentHello | AgentHeartbeat | Event

_EVENT_NAMES: dict[type[Any], str] = {
    RanksStarted: "ranks-started",
    RanksRejoined: "ranks-rejoined",
    RankExited: "rank-exited",
    RankFailed: "rank-failed",
    RankHung: "rank-hung",
    PlaneCarrierChanged: "plane-changed",
    PodFinished: "pod-finished",
    PodStopped: "pod-stopped",
}


def _failure_name(failure: StepFailure) -> str:
    return failure.name.lower().replace("_", "-")


_FAILURES = {_failure_name(f): f for f in StepFailure}


def _device_wait(body: Mapping[str, Any], what: str) -> DeviceWait | None:
    raw = body.get("device_wait")
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ProtocolError(f"{what}: field device_wait={show(raw)} is not an object")
    inner = f"{what}.device_wait"
    return DeviceWait(
        gpus=integers(raw, "gpus", inner, 0, 1 << 16),
        freed_at=number(raw, "freed_at", inner),
        waited_s=number(raw, "waited_s", inner),
        freed=flag(raw, "freed", inner, default=True),
    )


def method_of(report: Report) -> str:
    """The unary method a report travels by."""
    match report:
        case AgentHello():
            return HELLO
        case AgentHeartbeat():
            return HEARTBEAT
        case _:
            return REPORT


def _record_row(record: HeartbeatRecord) -> JsonObj:
    """The record's fields that differ from their defaults (the reader fills in the others):
    at 10k nodes the control plane reads 8 records a heartbeat, and most fields stay unset.
    A value the reader would refuse (a stamp that is not a number) is left unset; a record
    whose pid is such a value is not sent."""
    if not _sendable("pid", record.pid):
        return {}
    row: JsonObj = {}
    for name, default in _RECORD_DEFAULTS:
        value = getattr(record, name)
        if value != default and _sendable(name, value):
            row[name] = value
    if "rank" in row:  # its rank in its world (an elastic job's smaller world renumbers)
        row["world_rank"] = row.pop("rank")
    row["phase"] = str(record.phase)
    return row


def encode_report(sender: Sender, report: Report) -> JsonObj:
    """The JSON object of ``report`` from ``sender`` (send it by :func:`method_of`)."""
    body: JsonObj = {
        "pod": sender.pod,
        "agent_pid": sender.agent_pid,
        "at": sender.at,
        "generation": sender.generation,
    }
    match report:
        case AgentHello(pid=pid, node_rank=node_rank, nproc=nproc, switched_off=off):
            body.update(pid=pid, node_rank=node_rank, nproc=nproc)
            if off:
                body["switched_off"] = dict(off)
        case AgentHeartbeat(ranks=ranks):
            rows = []
            for r in ranks:
                row: JsonObj = {"rank": r.rank, "pid": r.pid, "alive": r.alive}
                if r.record is not None:
                    row.update(_record_row(r.record))
                    row["rank"] = r.rank  # the job's rank; the record's own: world_rank
                rows.append(row)
            body["ranks"] = rows
        case RanksStarted() | RanksRejoined():
            body["pids"] = {str(r): p for r, p in report.pids.items()}
            body["joined"] = list(report.joined) if isinstance(report, RanksRejoined) else []
            body["started_at"] = report.started_at
            if report.device_wait is not None:
                body["device_wait"] = dataclasses.asdict(report.device_wait)
        case RankFailed():
            body.update(dataclasses.asdict(report))
            body["failure"] = _failure_name(report.failure)
        case PodFinished(without_session=idle):
            body["without_session"] = list(idle)
        case PlaneCarrierChanged():
            body.update(dataclasses.asdict(report))
            body["planes"] = list(report.planes)
        case RankExited() | RankHung() | PodStopped():
            body.update(dataclasses.asdict(report))
    if not isinstance(report, AgentHello | AgentHeartbeat):
        body["event"] = _EVENT_NAMES[type(report)]
    return body


_RECORD_FIELDS = tuple(f for f in dataclasses.fields(HeartbeatRecord) if f.name != "phase")
_RECORD_DEFAULTS = tuple(
    (f.name, f.default) for f in _RECORD_FIELDS if f.default is not dataclasses.MISSING
) + tuple((f.name, None) for f in _RECORD_FIELDS if f.default is dataclasses.MISSING)
_RECORD_TYPES: dict[str, type[float] | type[int]] = {
    f.name: float if f.type in ("float", float) else int for f in _RECORD_FIELDS
}
#: A heartbeat record's integers (steps, counters, ids) and stamps on the wire: exact as JSON
#: numbers, and wall stamps or durations.
_RECORD_INT = 1 << 53
#: A record's fields that share their key with the row's own (the record's pid is the row's;
#: its rank, in its world, travels as ``world_rank``).
_ROW_RANGES = {"rank": (0, RANK_MAX), "pid": (0, PID_MAX)}
_PHASES = {str(p) for p in Phase}


def _sendable(name: str, value: Any) -> bool:
    """Whether a record's field is one the reader accepts (a rank's file may hold anything:
    a stamp it never set right is sent as unset rather than have the whole heartbeat
    refused)."""
    if _RECORD_TYPES[name] is float:
        return isinstance(value, int | float) and 0 <= value <= TIME_MAX  # not NaN nor inf
    low, high = _ROW_RANGES.get(name, (-_RECORD_INT, _RECORD_INT))
    return isinstance(value, int) and low <= value <= high


def _record(row: Mapping[str, Any], what: str) -> HeartbeatRecord | None:
    if "phase" not in row:
        return None
    phase = row["phase"]
    if not isinstance(phase, str) or phase not in _PHASES:
        raise ProtocolError(f"{what}: field phase={show(phase)} is not one of {sorted(_PHASES)}")
    values: dict[str, Any] = {}
    for name, kind in _RECORD_TYPES.items():
        key = "world_rank" if name == "rank" else name  # the row's rank is the job's
        if key not in row:
            continue
        if kind is float:
            values[name] = number(row, key, what)
        else:
            values[name] = integer(row, key, what, -_RECORD_INT, _RECORD_INT)
    if "pid" not in values:
        raise ProtocolError(f"{what} has a record without field 'pid'")
    return HeartbeatRecord(phase=Phase(phase), **values)


def _progress(value: Any, what: str) -> RankProgress:
    row = obj(value, f"{what} row")
    return RankProgress(
        rank=integer(row, "rank", what, 0, RANK_MAX),
        pid=integer(row, "pid", what, 0, PID_MAX),
        alive=flag(row, "alive", what, default=True),
        record=_record(row, what),
    )


def _rank_pids(body: Mapping[str, Any], what: str) -> dict[int, int]:
    """Field ``pids``: rank (a decimal string, JSON's object keys) -> the pid of its process."""
    pids = obj(field(body, "pids", what), f"{what} field pids")
    if len(pids) > ITEMS_MAX:
        raise ProtocolError(f"{what}: field pids has more than {ITEMS_MAX} ranks")
    out: dict[int, int] = {}
    for key in pids:
        if not (isinstance(key, str) and key.isdecimal() and len(key) <= 8):
            raise ProtocolError(f"{what}: field pids has key {show(key)}, not a rank")
        rank = int(key)
        if rank > RANK_MAX:
            raise ProtocolError(f"{what}: field pids has rank {rank}, more than {RANK_MAX}")
        # A started rank has a process: pid 0 or -1 would be a process group to kill.
        out[rank] = integer(pids, key, f"{what} pids", 1, PID_MAX)
    return out


def decode_report(method: str, body: Mapping[str, Any]) -> tuple[Sender, Report]:
    """The sender and the typed report of a JSON object received by ``method``; raises
    :class:`ProtocolError` naming the message and the field that is not well formed."""
    body = obj(body, method)
    what = method if method != REPORT else f"{REPORT} {show(body.get('event'))}"
    sender = Sender(
        pod=text(body, "pod", what),
        agent_pid=integer(body, "agent_pid", what, 1, PID_MAX),
        generation=integer(body, "generation", what, -1, GENERATION_MAX, default=-1),
        at=number(body, "at", what, default=0.0),
    )
    if method == HELLO:
        return sender, AgentHello(
            pid=integer(body, "pid", what, 1, PID_MAX),
            node_rank=integer(body, "node_rank", what, 0, RANK_MAX),
            nproc=integer(body, "nproc", what, 1, RANK_MAX),
            switched_off=_switched_off(body, what),
        )
    if method == HEARTBEAT:
        rows = listed(body, "ranks", what)
        return sender, AgentHeartbeat(ranks=tuple(_progress(r, what) for r in rows))
    if method != REPORT:
        raise ProtocolError(f"{show(method)} is not a method agents call")
    return sender, _event(body, what)


def _switched_off(body: Mapping[str, Any], what: str) -> tuple[tuple[str, str], ...]:
    """A hello's ``switched_off``: at most :data:`SWITCHED_MAX` rung names, each with a text."""
    value = obj(body.get("switched_off", {}), f"{what} switched_off")
    if len(value) > SWITCHED_MAX:
        raise ProtocolError(f"{what}: switched_off names more than {SWITCHED_MAX} rungs")
    return tuple((text({"k": k}, "k", what), text(value, k, what)) for k in value)


def _rank(body: Mapping[str, Any], what: str, key: str = "rank") -> int:
    return integer(body, key, what, 0, RANK_MAX)


def _event(body: Mapping[str, Any], what: str) -> Event:
    name = field(body, "event", what)
    match name:
        case "ranks-started":
            return RanksStarted(
                pids=_rank_pids(body, what),
                started_at=number(body, "started_at", what),
                device_wait=_device_wait(body, what),
            )
        case "ranks-rejoined":
            return RanksRejoined(
                pids=_rank_pids(body, what),
                joined=integers(body, "joined", what, 0, RANK_MAX),
                started_at=number(body, "started_at", what),
                device_wait=_device_wait(body, what),
            )
        case "rank-exited":
            return RankExited(
                rank=_rank(body, what),
                pid=integer(body, "pid", what, 0, PID_MAX),
                returncode=integer(body, "returncode", what, -(1 << 31), (1 << 31) - 1),
                exited_at=number(body, "exited_at", what),
                signal=optional_text(body, "signal", what) or None,
                ended_after_failure=flag(body, "ended_after_failure", what, default=False),
                traceback=optional_text(body, "traceback", what, TEXT_MAX),
                peer_failure=flag(body, "peer_failure", what, default=False),
                committed=optional_integer(body, "committed", what, 0, STEP_MAX),
                exception=optional_text(body, "exception", what),
                device_code=optional_text(body, "device_code", what),
            )
        case "rank-failed":
            failure = _FAILURES.get(text(body, "failure", what))
            if failure is None:
                raise ProtocolError(
                    f"{what}: field failure={show(body['failure'])} is not one of "
                    + ", ".join(_FAILURES)
                )
            return RankFailed(
                rank=_rank(body, what),
                pid=integer(body, "pid", what, 0, PID_MAX),
                failure=failure,
                failed_step=integer(body, "failed_step", what, -1, STEP_MAX),
                failed_at=number(body, "failed_at", what),
                device=optional_integer(body, "device", what, 0, DEVICE_MAX),
                traceback=optional_text(body, "traceback", what, TEXT_MAX),
            )
        case "rank-hung":
            return RankHung(
                rank=_rank(body, what),
                pid=integer(body, "pid", what, 0, PID_MAX),
                silent_s=number(body, "silent_s", what),
                timeout_s=number(body, "timeout_s", what),
                last_tick_at=number(body, "last_tick_at", what),
            )
        case "plane-changed":
            return PlaneCarrierChanged(
                plane=text(body, "plane", what),
                up=flag(body, "up", what),
                changed_at=number(body, "changed_at", what),
                planes=texts(body, "planes", what),
            )
        case "pod-finished":
            return PodFinished(without_session=integers(body, "without_session", what, 0, RANK_MAX))
        case "pod-stopped":
            return PodStopped()
        case _:
            raise ProtocolError(
                f"report event {show(name)} is not one of {', '.join(_EVENT_NAMES.values())}"
            )


def decode_subscription(body: Mapping[str, Any]) -> tuple[str, int]:
    """The pod and the agent's pid of a request for an agent's order stream (:data:`COMMANDS`)."""
    body = obj(body, COMMANDS)
    return text(body, "pod", COMMANDS), integer(body, "pid", COMMANDS, 1, PID_MAX)


def encode_answer(answer: HelloAnswer) -> JsonObj:
    out: JsonObj = {"ok": answer.ok}
    if answer.ok:
        out["generation"] = answer.generation
        out["join"] = (
            None
            if answer.join is None
            else {"source": answer.join.source, "step": answer.join.step}
        )
        if answer.heartbeat_s > 0:
            out["heartbeat_s"] = answer.heartbeat_s
    else:
        out["error"] = answer.error
    return out


def decode_answer(body: Mapping[str, Any]) -> HelloAnswer:
    """The typed answer to a hello; raises :class:`ProtocolError`."""
    what = f"{HELLO} answer"
    body = obj(body, what)
    if not flag(body, "ok", what, default=False):
        return HelloAnswer(ok=False, error=optional_text(body, "error", what, TEXT_MAX))
    join = body.get("join")
    return HelloAnswer(
        ok=True,
        generation=integer(body, "generation", what, 0, GENERATION_MAX),
        join=None if join is None else _join(obj(join, f"{what} field join"), what),
        heartbeat_s=number(body, "heartbeat_s", what, default=0.0),
    )


def _join(join: Mapping[str, Any], what: str) -> JoinFrom:
    return JoinFrom(
        source=_rank(join, what, "source"), step=integer(join, "step", what, 0, STEP_MAX)
    )


# ---- orders (manager -> agent) -----------------------------------------------------------
@dataclass(frozen=True)
class RestartRanks:
    """Kill the pod's ranks and start them again under ``generation`` (its rendezvous store at
    ``master_port``; 0: the port the agent has). ``last_words``: a rank already wrote the
    committed step's (MindSpore's TTP): no rank blocked in a collective is waited for."""

    generation: int
    master_port: int = 0
    last_words: bool = False


@dataclass(frozen=True)
class EndRanks:
    """Kill these ranks of the pod (they are to be replaced: a hung one holds its peers)."""

    ranks: tuple[int, ...]


@dataclass(frozen=True)
class PauseRanks:
    """Every live rank of the pod stops at its next step boundary and waits."""


@dataclass(frozen=True)
class RejoinRanks:
    """The pod's ranks join ``generation`` in process (its store at ``master_port``), taking
    their state from rank ``source`` at step ``step``; ranks in ``replace`` get new processes.
    ``world``: the job's ranks that make up the new world, in order (an elastic job scaled in:
    rank ``world[i]`` is rank ``i`` of ``len(world)`` in the new process group); empty: every
    rank of the job, each its own rank."""

    generation: int
    master_port: int
    source: int
    step: int
    replace: tuple[int, ...] = ()
    world: tuple[int, ...] = dataclasses.field(default=(), metadata={"omit_empty": True})
    #: The network plane the new group runs its collectives over ("": the one the ranks have).
    plane: str = dataclasses.field(default="", metadata={"omit_empty": True})


@dataclass(frozen=True)
class CutPlane:
    """Destroy the ranks' connections on network plane ``plane`` (its link is down: a
    collective waiting there fails at once instead of at its timeout)."""

    plane: str


@dataclass(frozen=True)
class WriteLastWords:
    """Rank ``rank`` of the pod, stopped at a step boundary, writes its last-words checkpoint."""

    rank: int


@dataclass(frozen=True)
class StressRanks:
    """Every rank of the pod, stopped at a step boundary, runs online stress test ``round``
    in a process group of its own whose store listens at ``master_port``."""

    round: int
    master_port: int


@dataclass(frozen=True)
class StopPod:
    """Stop every rank (SIGTERM and ``grace_s``; None: SIGKILL at once), then exit, 0 when the
    job ``success``-fully ended."""

    grace_s: float | None = None
    success: bool = False


Order = (
    RestartRanks
    | EndRanks
    | PauseRanks
    | RejoinRanks
    | CutPlane
    | WriteLastWords
    | StressRanks
    | StopPod
)

_OPS: dict[type[Any], str] = {
    RestartRanks: "restart",
    EndRanks: "end",
    PauseRanks: "pause",
    RejoinRanks: "rejoin",
    CutPlane: "cut-plane",
    WriteLastWords: "dump",
    StressRanks: "stress",
    StopPod: "stop",
}


def encode_order(order: Order) -> JsonObj:
    """The JSON object of ``order`` for an agent's command stream."""
    out: JsonObj = {"op": _OPS[type(order)]}
    for f in dataclasses.fields(order):
        value = getattr(order, f.name)
        if f.metadata.get("omit_empty") and not value:
            continue  # the wire of a job that never changes its size stays as it was
        out[f.name] = list(value) if isinstance(value, tuple) else value
    return out


def decode_order(body: Mapping[str, Any]) -> Order:
    """The typed order of a JSON object from the command stream; raises
    :class:`ProtocolError`."""
    body = obj(body, "order")
    op = body.get("op")
    what = f"order {show(op)}"
    match op:
        case "restart":
            return RestartRanks(
                generation=integer(body, "generation", what, 0, GENERATION_MAX),
                master_port=integer(body, "master_port", what, 0, PORT_MAX, default=0),
                last_words=flag(body, "last_words", what, default=False),
            )
        case "end":
            return EndRanks(ranks=integers(body, "ranks", what, 0, RANK_MAX))
        case "pause":
            return PauseRanks()
        case "rejoin":
            return RejoinRanks(
                generation=integer(body, "generation", what, 0, GENERATION_MAX),
                master_port=integer(body, "master_port", what, 1, PORT_MAX),
                source=_rank(body, what, "source"),
                step=integer(body, "step", what, 0, STEP_MAX),
                replace=integers(body, "replace", what, 0, RANK_MAX),
                world=integers(body, "world", what, 0, RANK_MAX),
                plane=optional_text(body, "plane", what),
            )
        case "cut-plane":
            return CutPlane(plane=text(body, "plane", what))
        case "dump":
            return WriteLastWords(rank=_rank(body, what))
        case "stress":
            return StressRanks(
                round=integer(body, "round", what, 0, GENERATION_MAX),
                master_port=integer(body, "master_port", what, 1, PORT_MAX),
            )
        case "stop":
            grace = body.get("grace_s")
            return StopPod(
                grace_s=None if grace is None else number(body, "grace_s", what),
                success=flag(body, "success", what, default=False),
            )
        case _:
            raise ProtocolError(f"order op {show(op)} is not one of {', '.join(_OPS.values())}")


__all__ = [
    "COMMANDS",
    "HEARTBEAT",
    "HELLO",
    "REPORT",
    "AgentHeartbeat",
    "AgentHello",
    "CutPlane",
    "DeviceWait",
    "EndRanks",
    "Event",
    "HelloAnswer",
    "JoinFrom",
    "Order",
    "PauseRanks",
    "PlaneCarrierChanged",
    "PodFinished",
    "PodStopped",
    "ProtocolError",
    "RankExited",
    "RankFailed",
    "RankHung",
    "RankProgress",
    "RanksRejoined",
    "RanksStarted",
    "RejoinRanks",
    "Report",
    "RestartRanks",
    "Sender",
    "StopPod",
    "StressRanks",
    "WriteLastWords",
    "decode_answer",
    "decode_order",
    "decode_report",
    "encode_answer",
    "encode_order",
    "encode_report",
    "method_of",
]
