"""Invariants of the decision over random fault sequences and configurations (hypothesis)."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from unbroken.faults import Fault, FaultKind, FaultLevel
from unbroken.policy import (
    Decision,
    DumpLastWords,
    Event,
    Failed,
    FailJob,
    FaultReported,
    Feasibility,
    HotSwitch,
    JobCompleted,
    JobState,
    PodUnschedulable,
    Recovering,
    RecoverOnSpare,
    ReplacementReady,
    RescheduleJob,
    ReschedulePods,
    RestartInPlace,
    RestartProcesses,
    RetryOnline,
    Rung,
    RungFailed,
    RungSucceeded,
    Running,
    ScaleIn,
    Succeeded,
    Tick,
    decide,
)
from unbroken.policy.ladder import HARDWARE_RESCHEDULE_CAP
from unbroken.spec.knobs import (
    STRATEGY_PRIORITY,
    FaultHandling,
    FaultScheduling,
    ProcessRecover,
    Strategy,
    SubHealthyStrategy,
)

pytestmark = pytest.mark.unit

PODS = ("worker-0", "worker-1", "worker-2")
START = 1_000_000.0


@contextlib.contextmanager
def no_clock() -> Iterator[None]:
    """Reading any clock inside the decision is a test failure."""

    def refuse(*_: object) -> float:
        raise AssertionError("the decision read a clock")

    with contextlib.ExitStack() as stack:
        for name in ("time", "monotonic", "perf_counter", "time_ns", "monotonic_ns"):
            stack.enter_context(mock.patch.object(time, name, refuse))
        yield


@st.composite
def configs(draw: st.DrawFn) -> FaultHandling:
    chosen = draw(st.sets(st.sampled_from(STRATEGY_PRIORITY[:-1])))
    strategies = (
        tuple(s for s in STRATEGY_PRIORITY if s in chosen or s is Strategy.EXIT)
        if chosen or draw(st.booleans())
        else ()
    )
    return FaultHandling(
        strategies=strategies,
        fault_scheduling=draw(st.sampled_from(FaultScheduling)),
        grace_s=draw(st.sampled_from([2.0, 30.0, 900.0])),
        pod_rescheduling=draw(st.booleans()),
        fault_retry_times=draw(st.integers(0, 3)),
        process_recover=draw(st.sampled_from(ProcessRecover)),
        sub_healthy=draw(st.sampled_from(SubHealthyStrategy)),
        wait_reschedule_s=draw(st.sampled_from([30.0, 270.0])),
        decision_wait_s=draw(st.sampled_from([1.0, 30.0, 120.0])),
        max_restarts=draw(st.integers(0, 3)),
    )


feasibilities = st.builds(
    Feasibility,
    replica_for_lost_state=st.booleans(),
    outside_update=st.booleans(),
    spare_node_free=st.booleans(),
    fault_age_s=st.sampled_from([0.0, 10.0, 59.0, 61.0, 300.0]),
    rank0_pod_faulty=st.booleans(),
    pod_schedulable=st.booleans(),
    elastic_possible=st.booleans(),
)

SOFTWARE_KINDS = [FaultKind.PROCESS_EXIT, FaultKind.EXCEPTION, FaultKind.HANG]
SOFTWARE_LEVELS = [FaultLevel.RESTART_REQUEST, FaultLevel.RESTART_BUSINESS, FaultLevel.NOT_HANDLE]


def faults(kinds: Sequence[FaultKind], levels: Sequence[FaultLevel]) -> st.SearchStrategy[Fault]:
    return st.builds(
        Fault,
        kind=st.sampled_from(kinds),
        level=st.sampled_from(levels),
        code=st.sampled_from(["", "80E01801", "XID-79", "exit:1"]),
        at=st.just(0.0),  # replaced by the event's time minus an age
        node=st.sampled_from(["n0", "n1", None]),
        pod=st.sampled_from([*PODS, None]),
        ranks=st.lists(st.integers(0, 7), max_size=2, unique=True).map(tuple),
        device=st.sampled_from([0, 1, None]),
        detail=st.just(""),
    )


@dataclass(frozen=True)
class Step:
    dt_s: float
    kind: str
    fault: Fault | None = None
    feasibility: Feasibility = field(default_factory=Feasibility)
    age_s: float = 0.0
    pod: str = "worker-0"


def steps(fault_strategy: st.SearchStrategy[Fault]) -> st.SearchStrategy[list[Step]]:
    step = st.one_of(
        st.builds(
            Step,
            dt_s=st.sampled_from([0.0, 1.0, 30.0]),
            kind=st.just("fault"),
            fault=fault_strategy,
            feasibility=feasibilities,
            age_s=st.sampled_from([0.0, 5.0, 90.0]),
        ),
        st.builds(
            Step,
            dt_s=st.sampled_from([0.0, 5.0, 100.0, 400.0, 1000.0]),
            kind=st.sampled_from(
                ["completed", "failed", "unschedulable", "ready", "tick", "tick", "tick"]
            ),
            pod=st.sampled_from(PODS),
        ),
    )
    return st.lists(step, max_size=25)


def to_event(step: Step, now: float) -> Event:
    match step.kind:
        case "fault":
            assert step.fault is not None
            return FaultReported(
                dataclasses.replace(step.fault, at=now - step.age_s), step.feasibility
            )
        case "completed":
            return RungSucceeded(now)
        case "failed":
            return RungFailed("the executor reported a failure", now)
        case "unschedulable":
            return PodUnschedulable(step.pod, now)
        case "ready":
            return ReplacementReady(step.pod, now)
        case "tick":
            return Tick(now)
    raise AssertionError(step.kind)


@dataclass
class Tracker:
    """Budgets counted from the commands alone, independently of the policy's own counters."""

    config: FaultHandling
    restarts: dict[str, int] = field(default_factory=dict)
    charged: int = 0
    charged_since_progress: int = 0
    stopped: bool = False  # a rung of this incident stopped the processes
    dumped: bool = False  # last words were saved in this incident

    def observe(self, before: JobState, event: Event, decision: Decision, now: float) -> None:
        config = self.config
        assert decision.reason
        process_level = (
            bool(config.strategies)
            and config.process_recover is ProcessRecover.ON
            and config.fault_scheduling is FaultScheduling.GRACE
        )
        escalation = (
            isinstance(before, Recovering)
            and before.rung is Rung.POD_RESCHEDULE
            and not isinstance(event, FaultReported)
        )
        for command in decision.commands:
            match command:
                case RetryOnline():
                    assert process_level and Strategy.RETRY in config.strategies
                case RestartInPlace():
                    assert process_level and Strategy.RECOVER_IN_PLACE in config.strategies
                case RecoverOnSpare():
                    assert process_level and Strategy.RECOVER in config.strategies
                case ScaleIn():
                    assert process_level and Strategy.ELASTIC_TRAINING in config.strategies
                case DumpLastWords():
                    assert process_level and Strategy.DUMP in config.strategies
                    assert not self.stopped, "last words after the processes were stopped"
                    assert not self.dumped, "last words twice in one incident"
                    self.dumped = True
                case HotSwitch():
                    assert config.sub_healthy is SubHealthyStrategy.HOT_SWITCH
                case RestartProcesses(pod=pod):
                    self.stopped = True
                    self.restarts[pod] = self.restarts.get(pod, 0) + 1
                    assert self.restarts[pod] <= config.max_restarts
                case ReschedulePods(pods=pods, grace_s=grace_s):
                    self.stopped = True
                    assert config.pod_rescheduling
                    assert config.fault_scheduling is not FaultScheduling.OFF
                    assert grace_s is None or config.fault_scheduling is FaultScheduling.GRACE
                    for pod in pods:
                        self.restarts.pop(pod, None)
                    self._charge(escalation=False)
                case RescheduleJob(grace_s=grace_s):
                    self.stopped = True
                    assert config.fault_scheduling is not FaultScheduling.OFF
                    assert grace_s is None or config.fault_scheduling is FaultScheduling.GRACE
                    self.restarts.clear()
                    self._charge(escalation)
                case FailJob(reason=reason):
                    assert isinstance(decision.state, Failed)
                    assert reason == decision.state.reason
                    assert command is decision.commands[-1]
        if isinstance(event, RungSucceeded) and isinstance(before, Recovering):
            self.charged_since_progress = 0
        if not isinstance(decision.state, Recovering):
            self.stopped = self.dumped = False  # the incident is over
        assert self.charged_since_progress <= config.fault_retry_times + HARDWARE_RESCHEDULE_CAP
        self._check_state(before, decision.state, now, process_level)

    def _charge(self, escalation: bool) -> None:
        if not escalation:
            self.charged += 1
            self.charged_since_progress += 1

    @staticmethod
    def _check_state(before: JobState, after: JobState, now: float, process_level: bool) -> None:
        assert after.generation >= before.generation
        match after:
            case Recovering():
                assert math.isfinite(after.deadline_at)
                assert after.faults
                if after.rung.process_level:
                    assert process_level
                if after.generation != before.generation:
                    assert after.deadline_at > now
            case Failed():
                assert after.reason
            case Running() | Succeeded():
                pass
        if isinstance(before, Failed | Succeeded):
            assert after is before


def run(config: FaultHandling, sequence: Sequence[Step]) -> tuple[JobState, Tracker]:
    tracker = Tracker(config)
    state: JobState = Running()
    now = START
    for step in sequence:
        now += step.dt_s
        event = to_event(step, now)
        with no_clock():
            decision = decide(state, event, config, now)
        tracker.observe(state, event, decision, now)
        state = decision.state
    # Liveness: with only time passing, a recovery ends (succeeds or fails) within its budgets.
    for _ in range(200):
        if not isinstance(state, Recovering):
            break
        now = max(now, state.deadline_at)
        event = Tick(now)
        with no_clock():
            decision = decide(state, event, config, now)
        tracker.observe(state, event, decision, now)
        state = decision.state
    assert not isinstance(state, Recovering), "a recovery never ended with only time passing"
    return state, tracker


ANY_FAULT = faults(list(FaultKind), list(FaultLevel))
QUICK = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@QUICK
@given(config=configs(), sequence=steps(ANY_FAULT))
def test_any_sequence_respects_configuration_budgets_and_ends(
    config: FaultHandling, sequence: list[Step]
) -> None:
    state, _ = run(config, sequence)
    assert isinstance(state, Running | Succeeded | Failed)


@QUICK
@given(
    config=configs(),
    sequence=steps(faults(SOFTWARE_KINDS, SOFTWARE_LEVELS)),
)
def test_software_faults_reschedule_at_most_fault_retry_times(
    config: FaultHandling, sequence: list[Step]
) -> None:
    _, tracker = run(config, sequence)
    assert tracker.charged <= config.fault_retry_times


@QUICK
@given(config=configs(), sequence=steps(ANY_FAULT))
def test_a_job_completed_event_always_succeeds_unless_failed(
    config: FaultHandling, sequence: list[Step]
) -> None:
    state: JobState = Running()
    now = START
    for step in sequence:
        now += step.dt_s
        with no_clock():
            state = decide(state, to_event(step, now), config, now).state
    with no_clock():
        final = decide(state, JobCompleted(now), config, now).state
    expected = Failed if isinstance(state, Failed) else Succeeded
    assert isinstance(final, expected)


def test_no_clock_guard_catches_a_clock_read() -> None:
    with no_clock(), pytest.raises(AssertionError, match="read a clock"):
        time.monotonic()
