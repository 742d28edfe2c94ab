"""The job manager against a peer that holds the run's secret and sends what it likes: JSON
``Infinity`` or ``1e999`` in a heartbeat, an ``Inject`` or a ``Release`` is refused by the
control channel and the run goes on; any mutation of any message the manager's loop takes
(non-finite numbers, huge integers, deep nesting, wrong types, missing fields), whether it
came through the channel or not, is handled or refused in one logged line, and the run goes
on (hypothesis)."""

from __future__ import annotations

import logging
import math
import os
import queue
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from tests.support.hostile import json_text, mutated, nested
from tests.support.manager_job import PODS, T0, Job, placement_as_edges, scripted_job

from unbroken.manager.service import Inbound, build_server
from unbroken.protocol import wire
from unbroken.protocol.calls import check_call
from unbroken.protocol.heartbeat import HeartbeatRecord, Phase
from unbroken.protocol.kinds import StepFailure
from unbroken.protocol.messages import (
    HEARTBEAT,
    HELLO,
    REPORT,
    AgentHeartbeat,
    PlaneCarrierChanged,
    PodFinished,
    PodStopped,
    RankExited,
    RankFailed,
    RankHung,
    RankProgress,
    RanksRejoined,
    RanksStarted,
    Report,
    Sender,
    encode_report,
)
from unbroken.spec.knobs import Strategy

pytestmark = pytest.mark.component

SECRET_KEY = "x-unbroken-secret"
#: The calls that wait for the manager's answer.
_ANSWERED = frozenset({HELLO, "Inject", "Release", "Link"})


def _raw_call(address: str, secret: str, method: str, body: bytes) -> grpc.StatusCode:
    """``method`` with ``body`` as its bytes and the run's secret, as any client can send it."""
    with grpc.insecure_channel(address) as channel:
        stub = channel.unary_unary(f"/unbroken.Control/{method}")
        try:
            stub(body, metadata=((SECRET_KEY, secret),), timeout=20.0)
        except grpc.RpcError as exc:
            code: grpc.StatusCode = exc.code()
            return code
    return grpc.StatusCode.OK


def _beat(committed: int) -> bytes:
    return (
        b'{"pod": "job-worker-0", "agent_pid": 1000, "generation": 0, "at": %d, "ranks": '
        b'[{"rank": 0, "pid": 2000, "alive": true, "phase": "training", "committed": %d}]}'
        % (int(T0), committed)
    )


ATTACKS = [
    (HEARTBEAT, _beat(10).replace(b'"generation": 0', b'"generation": Infinity')),
    (HEARTBEAT, _beat(10).replace(b'"committed": 10', b'"committed": 1e999')),
    (HEARTBEAT, _beat(10).replace(b'"agent_pid": 1000', b'"agent_pid": -Infinity')),
    (HELLO, b'{"pod": "job-worker-0", "agent_pid": 1000, "pid": NaN, "node_rank": 0, "nproc": 2}'),
    ("Inject", b'{"kind": "kill", "rank": Infinity}'),
    ("Inject", b'{"kind": "throttle", "node": "node-0", "cpu": 1e999}'),
    ("Release", b'{"node": "node-0", "device": 1e999}'),
    ("Release", b'{"node": "node-0", "device": Infinity}'),
]


def test_infinity_in_a_heartbeat_an_inject_or_a_release_is_refused_and_the_run_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = scripted_job(tmp_path, monkeypatch, Strategy.RECOVER)
    m = job.m
    server = build_server(m.secret, m.inbox, m.commands, answer_timeout_s=10.0)
    server.start()
    try:
        with ThreadPoolExecutor(1) as pool:
            for method, body in ATTACKS:
                call = pool.submit(_raw_call, server.address, m.secret, method, body)
                while not call.done():  # the manager's loop, as JobManager.run drives it
                    try:
                        m._handle_one(m.inbox.get(timeout=0.05))
                    except queue.Empty:
                        continue
                assert call.result() == grpc.StatusCode.INVALID_ARGUMENT, (method, body)
                job.tick()
        # the run goes on: the next heartbeat is heard and the job trains on
        assert _raw_call(server.address, m.secret, HEARTBEAT, _beat(12)) == grpc.StatusCode.OK
        m._handle_one(m.inbox.get(timeout=5.0))
        job.tick()
    finally:
        server.stop()
    assert m.outcome is None
    assert m.gens.ranks[0].committed == 12
    assert job.events("FaultDetected") == []


def _report(sender: Sender, report: Report) -> tuple[str, dict[str, Any]]:
    method = HEARTBEAT if isinstance(report, AgentHeartbeat) else REPORT
    return method, encode_report(sender, report)


RECORD = HeartbeatRecord(
    pid=2000,
    rank=0,
    generation=0,
    phase=Phase.TRAINING,
    tick=3,
    tick_at=T0,
    step=10,
    committed=10,
    committed_at=T0,
    step_time_s=0.05,
    start_step=0,
    recoverable=1,
    comm_ready_at=T0 + 1,
    state_loaded_at=T0 + 1,
    first_commit_at=T0 + 1.5,
    compute_time_s=0.01,
)
AGENT = Sender(pod=PODS[0], agent_pid=1000, generation=0, at=T0)
#: An agent the manager does not know (a replaced pod's): its reports are read, then ignored.
STRANGER = Sender(pod=PODS[1], agent_pid=4242, generation=0, at=T0)
#: The calls of ``unbroken inject``, ``release`` and ``link``, each refused by the job (no
#: rank 99, no node-9) unless a mutation makes it another.
CALLS: list[tuple[str, dict[str, Any]]] = [
    ("Inject", {"kind": "kill", "rank": 99, "pod": None, "node": None}),
    ("Inject", {"kind": "node", "node": "node-9", "clear": True}),
    ("Inject", {"kind": "device", "node": "node-9", "device": 0, "code": "80E3A201"}),
    ("Release", {"node": "node-9", "device": 0}),
    ("Link", {"to": "b"}),
]
BASES: list[tuple[str, dict[str, Any]]] = [
    (HELLO, {**encode_report(AGENT, AgentHeartbeat()), "pid": 1000, "node_rank": 0, "nproc": 2}),
    # the heartbeat of a known agent, the richest message, four times as often as the others
    *[_report(AGENT, AgentHeartbeat(ranks=(RankProgress(0, 2000, True, RECORD),)))] * 4,
    *(
        _report(STRANGER, r)
        for r in (
            RanksStarted(pids={2: 2002, 3: 2003}, started_at=T0),
            RanksRejoined(pids={2: 2002}, joined=(2,), started_at=T0),
            RankExited(rank=3, pid=2003, returncode=-9, exited_at=T0, signal="SIGKILL"),
            RankFailed(3, 2003, StepFailure.COLLECTIVE, 10, T0, device=1),
            RankHung(rank=3, pid=2003, silent_s=3.0, timeout_s=2.0, last_tick_at=T0),
            PlaneCarrierChanged(plane="a", up=False, changed_at=T0, planes=("a",)),
            PodFinished(without_session=(3,)),
            PodStopped(),
        )
    ),
    *CALLS,
]


def _with_record(**fields: Any) -> dict[str, Any]:
    """The known agent's heartbeat, its rank's record with ``fields``."""
    method, body = BASES[1]
    assert method == HEARTBEAT
    return {**body, "ranks": [{**body["ranks"][0], **fields}]}


def _through_the_channel(method: str, body: Any) -> dict[str, Any] | None:
    """``body`` as the control channel hands it to the manager's loop; None when the channel
    refuses it (INVALID_ARGUMENT)."""
    text = json_text(body)
    if text is None:
        return None
    try:
        received = wire.loads(text)
        if method in {"Inject", "Release", "Link"}:
            check_call(method, received)
    except ValueError:
        return None
    return received


def _handled(job: Job, method: str, body: Any) -> None:
    reply: queue.Queue[dict[str, Any]] = queue.Queue()
    job.m._handle_one(Inbound(method, body, reply if method in _ANSWERED else None, at=T0))
    if method in _ANSWERED:
        answer = reply.get_nowait()  # every call is answered, a refusal with ok false
        assert isinstance(answer.get("ok"), bool), answer


def test_any_mutation_of_any_message_leaves_the_run_going(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    job = scripted_job(tmp_path, monkeypatch, Strategy.RECOVER)
    placement_as_edges(job)  # a restart or a stop the messages cause starts no process

    def no_such_process(pid: int, sig: int) -> None:
        raise ProcessLookupError(pid)  # the ranks are scripted: no signal leaves the test

    monkeypatch.setattr(os, "kill", no_such_process)
    a0, a1 = job.agents

    messages = st.sampled_from(BASES).flatmap(lambda b: st.tuples(st.just(b[0]), mutated(b[1])))

    @settings(
        max_examples=400,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        database=None,
    )
    @given(message=messages)
    @example(message=(HEARTBEAT, {**BASES[1][1], "generation": math.inf}))
    @example(message=(HEARTBEAT, _with_record(committed=math.inf, step_time_s=math.nan)))
    @example(message=(HELLO, {**BASES[0][1], "pid": 1e999}))
    @example(message=("Inject", {"kind": "kill", "rank": math.inf}))
    @example(message=("Inject", {"kind": "kill", "rank": 0}))  # its process gone meanwhile
    @example(message=("Release", {"node": "node-9", "device": -math.inf}))
    @example(message=(REPORT, {**_report(STRANGER, PodStopped())[1], "agent_pid": 10**400}))
    def hostile(message: tuple[str, Any]) -> None:
        method, mutant = message
        received = _through_the_channel(method, mutant)
        if received is not None:
            _handled(job, method, received)
        if isinstance(mutant, dict):  # and as it is, as if it had come another way
            _handled(job, method, mutant)
        for a in (a0, a1):
            a.beat(Phase.TRAINING, committed=10)
        job.tick(0.01)
        assert job.m.outcome is None

    with caplog.at_level(logging.ERROR, logger="unbroken.manager.job"):
        # deeper than the interpreter recurses (no example of hypothesis: it cannot print it)
        for method, body in CALLS:
            _handled(job, method, {**body, "node": nested(5000), "to": nested(5000)})
        hostile()
    refusals = [r for r in caplog.records if "malformed" in r.getMessage()]
    assert refusals, "no message was refused"
    assert all("\n" not in r.getMessage() and r.exc_info is None for r in refusals)
    a0.beat(Phase.TRAINING, committed=11)
    a1.beat(Phase.TRAINING, committed=11)
    job.tick()
    assert job.m.outcome is None
