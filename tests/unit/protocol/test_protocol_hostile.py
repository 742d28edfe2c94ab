"""Every message type of the protocol against a hostile or broken peer (hypothesis): a body
mutated in any way (non-finite numbers, huge integers, deep nesting, wrong types, missing
fields) is either decoded to a value that is what its type says, or refused with a
``ValueError``; nothing else escapes. The wire's reader refuses the JSON no sender writes."""

from __future__ import annotations

import json
import math
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from tests.support.hostile import BAD_TEXTS, json_text, mutated, nested, well_formed

from unbroken.protocol import wire
from unbroken.protocol.calls import (
    InjectRequest,
    check_call,
    decode_inject,
    decode_link,
    decode_release,
)
from unbroken.protocol.exitreport import read_exit_report
from unbroken.protocol.heartbeat import (
    RECORD_SIZE,
    HeartbeatFormatError,
    HeartbeatRecord,
    Phase,
    decode,
    encode,
)
from unbroken.protocol.kinds import StepFailure
from unbroken.protocol.mailbox import Dump, Pause, Rejoin, Stress, encode_command, parse_command
from unbroken.protocol.messages import (
    HEARTBEAT,
    HELLO,
    REPORT,
    AgentHeartbeat,
    AgentHello,
    CutPlane,
    EndRanks,
    HelloAnswer,
    JoinFrom,
    PauseRanks,
    PlaneCarrierChanged,
    PodFinished,
    PodStopped,
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
    decode_subscription,
    encode_answer,
    encode_order,
    encode_report,
    method_of,
)
from unbroken.protocol.stress import (
    LinkMeasure,
    RankStressResult,
    StressCode,
    decode_result,
    encode_result,
)

pytestmark = pytest.mark.unit

T = 1767225600.0
SENDER = Sender(pod="job-worker-1", agent_pid=4242, generation=3, at=T)
RECORD = HeartbeatRecord(
    pid=77,
    rank=2,
    generation=3,
    phase=Phase.STOPPING,
    tick=12,
    tick_at=T,
    step=40,
    committed=40,
    committed_at=T,
    step_time_s=0.25,
    failed_step=40,
    failure=int(StepFailure.DEVICE_MEMORY),
)
REPORTS: list[Report] = [
    AgentHello(pid=4242, node_rank=1, nproc=2),
    AgentHeartbeat(
        ranks=(
            RankProgress(rank=2, pid=77, alive=True, record=RECORD),
            RankProgress(rank=3, pid=0, alive=False),
        )
    ),
    RanksStarted(pids={2: 77, 3: 78}, started_at=T),
    RanksRejoined(pids={2: 77, 3: 79}, joined=(3,), started_at=T),
    RankExited(rank=3, pid=78, returncode=-9, exited_at=T, signal="SIGKILL", committed=40),
    RankFailed(
        rank=2, pid=77, failure=StepFailure.COLLECTIVE, failed_step=40, failed_at=T, device=0
    ),
    RankHung(rank=3, pid=78, silent_s=0.9, timeout_s=0.6, last_tick_at=T),
    PlaneCarrierChanged(plane="a", up=False, changed_at=T, planes=("a", "b")),
    PodFinished(without_session=(3,)),
    PodStopped(),
]
ORDERS = [
    RestartRanks(generation=4, master_port=29501),
    EndRanks(ranks=(2, 3)),
    PauseRanks(),
    RejoinRanks(generation=6, master_port=29503, source=0, step=41, replace=(2,), world=(0, 1)),
    CutPlane(plane="a"),
    WriteLastWords(rank=1),
    StressRanks(round=2, master_port=29503),
    StopPod(grace_s=5.0, success=True),
]
ANSWERS = [
    HelloAnswer(ok=True, generation=2, join=JoinFrom(source=0, step=40), heartbeat_s=0.1),
    HelloAnswer(ok=False, error="unknown or replaced pod"),
]
COMMANDS = [
    Pause(seq=1),
    Dump(seq=2),
    Rejoin(3, 1, "127.0.0.1", 29500, 1, 4, 0, 40, ifname="lo"),
    Stress(4, 1, "127.0.0.1", 29500, 1, 4),
]
RESULT = RankStressResult(
    rank=1,
    device_code=StressCode.OK,
    checksum="0x1",
    expected="0x1",
    device_s=0.5,
    links=(LinkMeasure(peer=0, gbps=1.5, seconds=0.01),),
)
INJECTS = [
    {"kind": "kill", "rank": 3, "pod": None, "node": None, "device": None, "code": None},
    {"kind": "device", "node": "node-1", "device": 0, "code": "80E3A201", "clear": False},
    {"kind": "throttle", "node": "node-1", "cpu": 0.5, "rank": None, "peer": None},
]


def _decoded(decode: Callable[[], Any]) -> Any:
    """What ``decode`` returns, or None when it refused with a ``ValueError``; anything else
    it raises fails the test."""
    try:
        return decode()
    except ValueError:
        return None


def _as_received(body: Any) -> Any:
    """``body`` as the control channel hands it to a receiver: its JSON text read back by the
    wire's reader (a body that cannot be written is as good as refused)."""
    text = json_text(body)
    assume(text is not None)
    assert text is not None
    return wire.loads(text)


@pytest.mark.parametrize("report", REPORTS, ids=lambda r: type(r).__name__)
@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_a_mutated_report_is_decoded_well_formed_or_refused(
    report: Report, data: st.DataObject
) -> None:
    method = method_of(report)
    body = data.draw(mutated(encode_report(SENDER, report)))
    result = _decoded(lambda: decode_report(method, body))
    if result is not None:
        sender, typed = result
        well_formed(sender)
        well_formed(typed)
    received = _decoded(lambda: decode_report(method, _as_received(body)))
    if received is not None:
        well_formed(received[1])


@pytest.mark.parametrize("order", ORDERS, ids=lambda o: type(o).__name__)
@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_a_mutated_order_is_decoded_well_formed_or_refused(order: Any, data: st.DataObject) -> None:
    body = data.draw(mutated(encode_order(order)))
    if (typed := _decoded(lambda: decode_order(body))) is not None:
        well_formed(typed)


@pytest.mark.parametrize("answer", ANSWERS, ids=("ok", "refused"))
@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_a_mutated_hello_answer_is_decoded_well_formed_or_refused(
    answer: HelloAnswer, data: st.DataObject
) -> None:
    body = data.draw(mutated(encode_answer(answer)))
    if (typed := _decoded(lambda: decode_answer(body))) is not None:
        well_formed(typed)


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: type(c).__name__)
@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_a_mutated_mailbox_command_is_parsed_well_formed_or_refused(
    command: Any, data: st.DataObject
) -> None:
    body = data.draw(mutated(encode_command(command)))
    if not isinstance(body, dict):
        return  # the mailbox's reader refuses anything but an object before parsing
    if (typed := _decoded(lambda: parse_command(body))) is not None:
        well_formed(typed)


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_a_mutated_stress_result_is_decoded_well_formed_or_refused(data: st.DataObject) -> None:
    body = data.draw(mutated(json.loads(encode_result(RESULT))))
    text = json_text(body)
    assume(text is not None)
    assert text is not None
    if (typed := _decoded(lambda: decode_result(text))) is not None:
        well_formed(typed)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_a_mutated_exit_report_is_read_well_formed_or_not_at_all(data: st.DataObject) -> None:
    body = data.draw(mutated({"pid": 77, "exception": "ValueError", "message": "m", "failure": 2}))
    text = json_text(body)
    assume(text is not None)
    assert text is not None
    with tempfile.TemporaryDirectory() as tmp:
        heartbeat = Path(tmp) / "rank-2.hb"
        heartbeat.with_name("rank-2.hb.exit").write_bytes(text)
        report = read_exit_report(heartbeat, 77)
    if report is not None:
        well_formed(report)


@pytest.mark.parametrize(
    ("decode", "body"),
    [
        *((decode_inject, b) for b in INJECTS),
        (decode_release, {"node": "node-1", "device": 1}),
        (decode_link, {"to": "b"}),
    ],
    ids=("inject-kill", "inject-device", "inject-throttle", "release", "link"),
)
@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_a_mutated_call_of_a_command_is_decoded_well_formed_or_refused(
    decode: Callable[[Any], Any], body: dict[str, Any], data: st.DataObject
) -> None:
    mutant = data.draw(mutated(body))
    if (typed := _decoded(lambda: decode(mutant))) is not None:
        well_formed(typed)


@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_a_mutated_order_stream_request_is_decoded_or_refused(data: st.DataObject) -> None:
    body = data.draw(mutated({"pod": "job-worker-0", "pid": 4242}))
    if (typed := _decoded(lambda: decode_subscription(body))) is not None:
        pod, pid = typed
        assert isinstance(pod, str) and type(pid) is int and 1 <= pid <= wire.PID_MAX


@settings(max_examples=300, deadline=None)
@given(
    flips=st.lists(st.tuples(st.integers(0, RECORD_SIZE - 1), st.integers(0, 255)), max_size=8),
    tail=st.binary(max_size=16),
)
def test_any_heartbeat_file_is_read_or_refused_and_what_is_read_is_sent_and_accepted(
    flips: list[tuple[int, int]], tail: bytes
) -> None:
    """A rank's heartbeat file may hold anything (it is the rank's memory): the agent reads a
    record or refuses the file, and what it sends of a record the manager accepts (a value it
    would refuse, a NaN stamp, is sent as unset)."""
    buf = bytearray(encode(RECORD, seq=4))
    for at, byte in flips:
        buf[at] = byte
    try:
        record = decode(bytes(buf) + tail)
    except HeartbeatFormatError:
        return
    body = encode_report(SENDER, AgentHeartbeat(ranks=(RankProgress(2, 77, True, record),)))
    _, beat = decode_report(HEARTBEAT, wire.loads(json.dumps(body).encode()))
    well_formed(beat)


def test_a_record_with_stamps_that_are_not_numbers_is_sent_with_them_unset() -> None:
    record = HeartbeatRecord(pid=77, phase=Phase.TRAINING, step_time_s=math.nan, tick_at=math.inf)
    body = encode_report(SENDER, AgentHeartbeat(ranks=(RankProgress(2, 77, True, record),)))
    assert "step_time_s" not in body["ranks"][0] and "tick_at" not in body["ranks"][0]
    _, beat = decode_report(HEARTBEAT, wire.loads(json.dumps(body, allow_nan=False).encode()))
    assert isinstance(beat, AgentHeartbeat) and beat.ranks[0].record is not None
    assert beat.ranks[0].record.step_time_s == 0.0


@pytest.mark.parametrize("text", BAD_TEXTS, ids=range(len(BAD_TEXTS)))
def test_the_wire_refuses_json_no_sender_writes(text: bytes) -> None:
    with pytest.raises(wire.ProtocolError):
        wire.loads(text)


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ({"pod": "p", "agent_pid": 1, "generation": math.inf, "ranks": []}, "generation"),
        ({"pod": "p", "agent_pid": math.nan, "ranks": []}, "agent_pid"),
        ({"pod": "p", "agent_pid": 1, "at": 1e308, "ranks": []}, "at"),
        ({"pod": "p", "agent_pid": 1 << 64, "ranks": []}, "agent_pid"),
        ({"pod": "p", "agent_pid": "12", "ranks": []}, "agent_pid"),
        ({"pod": "p", "agent_pid": True, "ranks": []}, "agent_pid"),
        ({"pod": nested(5000), "agent_pid": 1, "ranks": []}, "pod"),
        ({"pod": "p", "agent_pid": 1, "ranks": [{"rank": 1, "pid": -1}]}, "pid"),
        ({"pod": "p", "agent_pid": 1, "ranks": [{"rank": 1, "pid": 2, "alive": "no"}]}, "alive"),
        ({"pod": "p", "agent_pid": 1, "ranks": {"rank": 1}}, "ranks"),
        ({"pod": "p", "agent_pid": 1, "ranks": [7]}, "row"),
        (
            {
                "pod": "p",
                "agent_pid": 1,
                "ranks": [{"rank": 1, "pid": 2, "phase": "training", "step_time_s": math.nan}],
            },
            "step_time_s",
        ),
    ],
)
def test_a_heartbeat_is_refused_naming_the_message_and_the_field(
    body: dict[str, Any], named: str
) -> None:
    with pytest.raises(ValueError, match=f"{HEARTBEAT}.*{named}"):
        decode_report(HEARTBEAT, body)


def test_started_ranks_never_carry_a_process_group_as_their_pid() -> None:
    """``kill(0)`` is the sender's own group and ``kill(-1)`` every process of the user: a
    started rank's pid is a process."""
    for pid in (0, -1, -2, wire.PID_MAX + 1):
        body = encode_report(SENDER, RanksStarted(pids={2: 77}, started_at=T))
        body["pids"] = {"2": pid}
        with pytest.raises(ValueError, match="pids"):
            decode_report(REPORT, body)
    with pytest.raises(ValueError, match="pids"):
        decode_report(REPORT, {**body, "pids": {"-1": 5}})


def test_a_hello_and_a_call_of_a_command_are_refused_naming_the_field() -> None:
    with pytest.raises(ValueError, match=f"{HELLO}: field nproc"):
        decode_report(HELLO, {"pod": "p", "agent_pid": 1, "pid": 1, "node_rank": 0, "nproc": 0})
    with pytest.raises(ValueError, match="Inject: field rank"):
        decode_inject({"kind": "kill", "rank": math.inf})
    with pytest.raises(ValueError, match="Release: field device"):
        decode_release({"node": "node-1", "device": 1e999})
    with pytest.raises(ValueError, match="not a call"):
        check_call("Gossip", {})
    assert decode_inject({"kind": "kill", "rank": 1}) == InjectRequest(kind="kill", rank=1)
