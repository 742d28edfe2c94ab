"""What agents and the job manager say to each other: typed messages and their one codec.

Agents send *reports* (past facts: :class:`RankExited`, :class:`RanksStarted`, ...) over the
control plane's unary calls and receive *orders* (imperatives: :class:`RestartRanks`,
:class:`PauseRanks`, ...) on their command stream. On the wire both are JSON objects; this
module is the only place that builds or reads those objects, so a field is named once and a
receiver matches on types (``match report: case RankExited(): ...``), never on strings.

Wire shapes (unchanged from the dicts sent before this module existed):

- every report carries its :class:`Sender` (``pod``, ``agent_pid``, ``generation``, ``at``);
- ``AgentHello`` adds ``pid``, ``node_rank``, ``nproc``; its answer is a :class:`HelloAnswer`;
- ``AgentHeartbeat`` adds ``ranks``: one row per rank, ``rank``/``pid``/``alive`` and, once
  the rank wrote a heartbeat record, the record's fields (:class:`RankProgress`);
- ``AgentReport`` adds ``event`` (``ranks-started``, ``ranks-rejoined``, ``rank-exited``,
  ``rank-failed``, ``rank-hung``, ``pod-finished``, ``pod-stopped``) and that event's fields;
- an order is an object with ``op`` (``restart``, ``end``, ``pause``, ``rejoin``, ``dump``,
  ``stress``, ``stop``) and its fields.

A malformed message raises :class:`ProtocolError` (a ``ValueError``): the receiver refuses it
and goes on. Standard library only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from unbroken.protocol.heartbeat import HeartbeatRecord, Phase
from unbroken.protocol.kinds import StepFailure

JsonObj = dict[str, Any]

#: The unary methods agents call on the control plane, and the agents' command stream.
HELLO = "AgentHello"
HEARTBEAT = "AgentHeartbeat"
REPORT = "AgentReport"
COMMANDS = "AgentCommands"


class ProtocolError(ValueError):
    """A message that is not what this protocol says it must be."""


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


@dataclass(frozen=True)
class RanksRejoined:
    """The pod's ranks joined the sender's generation in process; ``joined``: the ranks that
    got a new process (replacements), the others kept theirs."""

    pids: Mapping[int, int]
    joined: tuple[int, ...]
    started_at: float


@dataclass(frozen=True)
class RankExited:
    """A rank's process ended without the agent asking it to. ``signal``: the signal name when
    a signal ended it (None when the agent ended it after a failure it saw: then
    ``ended_after_failure``); ``peer_failure``: it failed because a collective did (a peer went
    away: an echo); ``exception``: the class of the exception that ended it, as the rank
    reported it (:mod:`unbroken.protocol.exitreport`; "" when it reported none);
    ``committed``: the steps its last heartbeat record counted."""

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
    at 10k nodes the control plane reads 8 records a heartbeat, and most fields stay unset."""
    row: JsonObj = {}
    for name, default in _RECORD_DEFAULTS:
        value = getattr(record, name)
        if value != default:
            row[name] = value
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
        case AgentHello(pid=pid, node_rank=node_rank, nproc=nproc):
            body.update(pid=pid, node_rank=node_rank, nproc=nproc)
        case AgentHeartbeat(ranks=ranks):
            rows = []
            for r in ranks:
                row: JsonObj = {"rank": r.rank, "pid": r.pid, "alive": r.alive}
                if r.record is not None:
                    row.update(_record_row(r.record))
                rows.append(row)
            body["ranks"] = rows
        case RanksStarted() | RanksRejoined():
            body["pids"] = {str(r): p for r, p in report.pids.items()}
            body["joined"] = list(report.joined) if isinstance(report, RanksRejoined) else []
            body["started_at"] = report.started_at
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


def _get(body: Mapping[str, Any], key: str) -> Any:
    if key not in body:
        raise ProtocolError(f"message {body.get('event', '')!r} has no field {key!r}")
    return body[key]


def _int(body: Mapping[str, Any], key: str) -> int:
    value = _get(body, key)
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ProtocolError(f"message field {key}={value!r} is not an integer")
    return int(value)


def _opt_int(body: Mapping[str, Any], key: str) -> int | None:
    return None if body.get(key) is None else _int(body, key)


def _float(body: Mapping[str, Any], key: str) -> float:
    value = _get(body, key)
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ProtocolError(f"message field {key}={value!r} is not a number")
    return float(value)


def _ints(body: Mapping[str, Any], key: str) -> tuple[int, ...]:
    values = body.get(key) or ()
    if not isinstance(values, list | tuple):
        raise ProtocolError(f"message field {key}={values!r} is not a list")
    return tuple(int(v) for v in values)


def _pids(body: Mapping[str, Any]) -> dict[int, int]:
    pids = _get(body, "pids")
    if not isinstance(pids, Mapping):
        raise ProtocolError(f"message field pids={pids!r} is not an object")
    return {int(r): int(p) for r, p in pids.items()}


_RECORD_FIELDS = tuple(f for f in dataclasses.fields(HeartbeatRecord) if f.name != "phase")
_RECORD_DEFAULTS = tuple(
    (f.name, f.default) for f in _RECORD_FIELDS if f.default is not dataclasses.MISSING
) + tuple((f.name, None) for f in _RECORD_FIELDS if f.default is dataclasses.MISSING)
_RECORD_TYPES: dict[str, type[float] | type[int]] = {
    f.name: float if f.type in ("float", float) else int for f in _RECORD_FIELDS
}


def _record(row: Mapping[str, Any]) -> HeartbeatRecord | None:
    if "phase" not in row:
        return None
    values: dict[str, Any] = {}
    for name, value in row.items():
        kind = _RECORD_TYPES.get(name)
        if kind is not None:
            values[name] = kind(value)
    try:
        phase = Phase(row["phase"])
    except ValueError:
        raise ProtocolError(f"heartbeat row has unknown phase {row['phase']!r}") from None
    return HeartbeatRecord(phase=phase, **values)


def _progress(row: Mapping[str, Any]) -> RankProgress:
    return RankProgress(
        rank=_int(row, "rank"),
        pid=_int(row, "pid"),
        alive=bool(row.get("alive", True)),
        record=_record(row),
    )


def decode_report(method: str, body: Mapping[str, Any]) -> tuple[Sender, Report]:
    """The sender and the typed report of a JSON object received by ``method``."""
    sender = Sender(
        pod=str(_get(body, "pod")),
        agent_pid=_int(body, "agent_pid"),
        generation=int(body.get("generation", -1)),
        at=float(body.get("at", 0.0)),
    )
    if method == HELLO:
        return sender, AgentHello(
            pid=_int(body, "pid"), node_rank=_int(body, "node_rank"), nproc=_int(body, "nproc")
        )
    if method == HEARTBEAT:
        rows = body.get("ranks") or []
        if not isinstance(rows, list):
            raise ProtocolError(f"heartbeat field ranks={rows!r} is not a list")
        return sender, AgentHeartbeat(ranks=tuple(_progress(r) for r in rows))
    if method != REPORT:
        raise ProtocolError(f"{method!r} is not a method agents call")
    return sender, _event(body)


def _event(body: Mapping[str, Any]) -> Event:
    name = _get(body, "event")
    match name:
        case "ranks-started":
            return RanksStarted(pids=_pids(body), started_at=_float(body, "started_at"))
        case "ranks-rejoined":
            return RanksRejoined(
                pids=_pids(body),
                joined=_ints(body, "joined"),
                started_at=_float(body, "started_at"),
            )
        case "rank-exited":
            return RankExited(
                rank=_int(body, "rank"),
                pid=_int(body, "pid"),
                returncode=_int(body, "returncode"),
                exited_at=_float(body, "exited_at"),
                signal=None if not body.get("signal") else str(body["signal"]),
                ended_after_failure=bool(body.get("ended_after_failure")),
                traceback=str(body.get("traceback") or ""),
                peer_failure=bool(body.get("peer_failure")),
                committed=_opt_int(body, "committed"),
                exception=str(body.get("exception") or ""),
            )
        case "rank-failed":
            failure = _FAILURES.get(str(_get(body, "failure")))
            if failure is None:
                raise ProtocolError(
                    f"rank-failed failure {body['failure']!r} is not one of {', '.join(_FAILURES)}"
                )
            return RankFailed(
                rank=_int(body, "rank"),
                pid=_int(body, "pid"),
                failure=failure,
                failed_step=_int(body, "failed_step"),
                failed_at=_float(body, "failed_at"),
                device=_opt_int(body, "device"),
                traceback=str(body.get("traceback") or ""),
            )
        case "rank-hung":
            return RankHung(
                rank=_int(body, "rank"),
                pid=_int(body, "pid"),
                silent_s=_float(body, "silent_s"),
                timeout_s=_float(body, "timeout_s"),
                last_tick_at=_float(body, "last_tick_at"),
            )
        case "plane-changed":
            return PlaneCarrierChanged(
                plane=str(_get(body, "plane")),
                up=bool(_get(body, "up")),
                changed_at=_float(body, "changed_at"),
                planes=tuple(str(p) for p in body.get("planes") or ()),
            )
        case "pod-finished":
            return PodFinished(without_session=_ints(body, "without_session"))
        case "pod-stopped":
            return PodStopped()
        case _:
            raise ProtocolError(
                f"report event {name!r} is not one of {', '.join(_EVENT_NAMES.values())}"
            )


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
    if not body.get("ok"):
        return HelloAnswer(ok=False, error=str(body.get("error", "")))
    join = body.get("join")
    return HelloAnswer(
        ok=True,
        generation=_int(body, "generation"),
        join=None if not join else JoinFrom(source=_int(join, "source"), step=_int(join, "step")),
        heartbeat_s=_float(body, "heartbeat_s") if "heartbeat_s" in body else 0.0,
    )


# ---- orders (manager -> agent) -----------------------------------------------------------
@dataclass(frozen=True)
class RestartRanks:
    """Kill the pod's ranks and start them again under ``generation`` (its rendezvous store at
    ``master_port``; 0: the port the agent has)."""

    generation: int
    master_port: int = 0


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
    """The typed order of a JSON object from the command stream."""
    op = body.get("op")
    match op:
        case "restart":
            return RestartRanks(
                generation=_int(body, "generation"), master_port=int(body.get("master_port") or 0)
            )
        case "end":
            return EndRanks(ranks=_ints(body, "ranks"))
        case "pause":
            return PauseRanks()
        case "rejoin":
            return RejoinRanks(
                generation=_int(body, "generation"),
                master_port=_int(body, "master_port"),
                source=_int(body, "source"),
                step=_int(body, "step"),
                replace=_ints(body, "replace"),
                world=_ints(body, "world") if "world" in body else (),
                plane=str(body.get("plane") or ""),
            )
        case "cut-plane":
            return CutPlane(plane=str(_get(body, "plane")))
        case "dump":
            return WriteLastWords(rank=_int(body, "rank"))
        case "stress":
            return StressRanks(round=_int(body, "round"), master_port=_int(body, "master_port"))
        case "stop":
            grace = body.get("grace_s")
            return StopPod(
                grace_s=None if grace is None else float(grace), success=bool(body.get("success"))
            )
        case _:
            raise ProtocolError(f"order op {op!r} is not one of {', '.join(_OPS.values())}")


__all__ = [
    "COMMANDS",
    "HEARTBEAT",
    "HELLO",
    "REPORT",
    "AgentHeartbeat",
    "AgentHello",
    "CutPlane",
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
