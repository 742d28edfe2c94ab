"""Agent reports and manager orders: every message survives its codec, the wire keeps the
shapes agents and managers exchange, and a malformed message is refused with its field named."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from unbroken.protocol.heartbeat import HeartbeatRecord, Phase
from unbroken.protocol.kinds import FaultKind, StepFailure
from unbroken.protocol.messages import (
    HEARTBEAT,
    HELLO,
    REPORT,
    AgentHeartbeat,
    AgentHello,
    DeviceWait,
    EndRanks,
    HelloAnswer,
    JoinFrom,
    Order,
    PauseRanks,
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
    decode_report,
    encode_answer,
    encode_order,
    encode_report,
    method_of,
)

pytestmark = pytest.mark.unit

SENDER = Sender(pod="job-worker-1", agent_pid=4242, generation=3, at=1767225600.5)
RECORD = HeartbeatRecord(
    pid=77,
    rank=2,
    generation=3,
    phase=Phase.STOPPING,
    tick=12,
    tick_at=1767225600.25,
    step=40,
    committed=40,
    committed_at=1767225600.0,
    failed_step=40,
    failure=int(StepFailure.DEVICE_MEMORY),
    recoverable=1,
)

REPORTS: list[Report] = [
    AgentHello(pid=4242, node_rank=1, nproc=2),
    AgentHeartbeat(
        ranks=(
            RankProgress(rank=2, pid=77, alive=True, record=RECORD),
            RankProgress(rank=3, pid=78, alive=False),
        )
    ),
    RanksStarted(pids={2: 77, 3: 78}, started_at=1767225590.0),
    RanksRejoined(pids={2: 77, 3: 79}, joined=(3,), started_at=1767225601.0),
    RanksRejoined(
        pids={2: 77, 3: 80},
        joined=(3,),
        started_at=1767225602.0,
        device_wait=DeviceWait(gpus=(1,), freed_at=1767225601.9, waited_s=0.35),
    ),
    RankExited(
        rank=3,
        pid=78,
        returncode=-9,
        exited_at=1767225600.1,
        signal="SIGKILL",
        committed=40,
    ),
    RankExited(
        rank=2,
        pid=77,
        returncode=1,
        exited_at=1767225600.1,
        ended_after_failure=True,
        traceback="Traceback (most recent call last):\nValueError: bad batch",
        peer_failure=True,
    ),
    RankExited(
        rank=1,
        pid=76,
        returncode=1,
        exited_at=1767225600.1,
        ended_after_failure=True,
        exception="AcceleratorError",
        device_code="CUDA-710",
    ),
    RankFailed(
        rank=2,
        pid=77,
        failure=StepFailure.DEVICE_MEMORY,
        failed_step=40,
        failed_at=1767225600.0,
        device=0,
        traceback="",
    ),
    RankHung(rank=3, pid=78, silent_s=0.9, timeout_s=0.6, last_tick_at=1767225599.6),
    PodFinished(without_session=(3,)),
    PodStopped(),
    AgentHello(
        pid=4242,
        node_rank=1,
        nproc=2,
        switched_off=(("retry", "PROCESS_RECOVER=off"), ("recover", "PROCESS_RECOVER=off")),
    ),
]


@pytest.mark.parametrize("report", REPORTS, ids=lambda r: type(r).__name__)
def test_every_report_survives_json_and_its_codec(report: Report) -> None:
    wire = json.loads(json.dumps(encode_report(SENDER, report)))
    assert decode_report(method_of(report), wire) == (SENDER, report)


def test_a_renumbered_rank_keeps_its_job_rank_and_its_world_rank() -> None:
    """An elastic job's smaller world numbers its ranks anew: the process of job rank 4 is
    rank 2 of its world, and its record says so. The row stays the job's rank 4 (how the
    manager finds the rank); the record's rank arrives as it was written."""
    record = dataclasses.replace(RECORD, rank=2, pid=91)
    beat = AgentHeartbeat(ranks=(RankProgress(rank=4, pid=91, alive=True, record=record),))
    wire = json.loads(json.dumps(encode_report(SENDER, beat)))
    assert wire["ranks"][0]["rank"] == 4 and wire["ranks"][0]["world_rank"] == 2
    _, decoded = decode_report(method_of(beat), wire)
    assert isinstance(decoded, AgentHeartbeat)
    (row,) = decoded.ranks
    assert (row.rank, row.pid) == (4, 91)
    assert row.record is not None and row.record.rank == 2


def test_reports_travel_by_their_method() -> None:
    assert method_of(REPORTS[0]) == HELLO
    assert method_of(REPORTS[1]) == HEARTBEAT
    assert {method_of(r) for r in REPORTS[2:-1]} == {REPORT}
    assert method_of(REPORTS[-1]) == HELLO


def test_the_wire_keeps_its_shape() -> None:
    """The JSON objects are the ones agents and managers exchanged before the types: events
    by name, the sender's fields beside the event's, a step failure by its kebab name."""
    failed = encode_report(SENDER, next(r for r in REPORTS if isinstance(r, RankFailed)))
    assert failed["event"] == "rank-failed" and failed["failure"] == "device-memory"
    assert failed["pod"] == "job-worker-1" and failed["agent_pid"] == 4242
    assert failed["generation"] == 3
    started = encode_report(SENDER, REPORTS[2])
    assert started["pids"] == {"2": 77, "3": 78} and started["joined"] == []
    beat = encode_report(SENDER, REPORTS[1])
    assert beat["ranks"][0]["phase"] == "stopping" and beat["ranks"][0]["committed"] == 40
    assert beat["ranks"][1] == {"rank": 3, "pid": 78, "alive": False}
    assert encode_order(RejoinRanks(5, 29500, 1, 40, (3,))) == {
        "op": "rejoin",
        "generation": 5,
        "master_port": 29500,
        "source": 1,
        "step": 40,
        "replace": [3],
    }


ORDERS: list[Order] = [
    RestartRanks(generation=4, master_port=29501),
    RestartRanks(generation=5, master_port=29502, last_words=True),
    EndRanks(ranks=(2, 3)),
    PauseRanks(),
    RejoinRanks(generation=5, master_port=29502, source=0, step=40, replace=(2,)),
    RejoinRanks(generation=6, master_port=29503, source=0, step=41, world=(0, 1)),
    WriteLastWords(rank=1),
    StressRanks(round=2, master_port=29503),
    StopPod(grace_s=5.0, success=True),
    StopPod(),
]


@pytest.mark.parametrize("order", ORDERS, ids=lambda o: type(o).__name__)
def test_every_order_survives_json_and_its_codec(order: Order) -> None:
    assert decode_order(json.loads(json.dumps(encode_order(order)))) == order


@pytest.mark.parametrize(
    "answer",
    [
        HelloAnswer(ok=True, generation=2),
        HelloAnswer(ok=True, generation=2, join=JoinFrom(source=0, step=40)),
        HelloAnswer(ok=False, error="unknown or replaced pod"),
    ],
)
def test_the_hello_answer_survives_its_codec(answer: HelloAnswer) -> None:
    assert decode_answer(json.loads(json.dumps(encode_answer(answer)))) == answer


@pytest.mark.parametrize(
    ("method", "body", "named"),
    [
        (REPORT, {"pod": "p", "agent_pid": 1, "event": "rank-lost"}, "rank-lost"),
        (REPORT, {"pod": "p", "agent_pid": 1, "event": "rank-hung", "rank": 1}, "pid"),
        (
            REPORT,
            {
                "pod": "p",
                "agent_pid": 1,
                "event": "rank-failed",
                "rank": 1,
                "pid": 2,
                "failure": "cosmic-ray",
                "failed_step": 1,
                "failed_at": 1.0,
            },
            "cosmic-ray",
        ),
        (HEARTBEAT, {"pod": "p", "agent_pid": 1, "ranks": [{"rank": 1}]}, "pid"),
        (
            HELLO,
            {"pod": "p", "agent_pid": 1, "pid": 1, "node_rank": 0, "nproc": 1, "switched_off": 1},
            "switched_off",
        ),
        (
            HELLO,
            {
                "pod": "p",
                "agent_pid": 1,
                "pid": 1,
                "node_rank": 0,
                "nproc": 1,
                "switched_off": {str(i): "x" for i in range(9)},
            },
            "more than 8",
        ),
        (REPORT, {"agent_pid": 1, "event": "pod-stopped"}, "pod"),
        ("AgentGossip", {"pod": "p", "agent_pid": 1}, "AgentGossip"),
    ],
)
def test_a_malformed_report_is_refused_naming_what_is_wrong(
    method: str, body: dict[str, Any], named: str
) -> None:
    with pytest.raises(ProtocolError, match=named):
        decode_report(method, body)


def test_an_unknown_order_is_refused() -> None:
    with pytest.raises(ProtocolError, match="'reboot'"):
        decode_order({"op": "reboot"})


def test_each_step_failure_names_one_fault_kind() -> None:
    assert StepFailure.NONE.kind is None
    assert StepFailure.COLLECTIVE.kind is FaultKind.LINK
    assert StepFailure.UPDATE.kind is FaultKind.EXCEPTION
    assert StepFailure.DEVICE_MEMORY.kind is FaultKind.DEVICE_MEMORY
    assert all(f.kind is None or f.kind.seen_by_training for f in StepFailure)
