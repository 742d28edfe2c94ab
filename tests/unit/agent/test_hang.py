"""Hang detection: three step times measured online, a small floor for jitter, and both the
tick and the progress must stop."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import time

import pytest

from unbroken.agent.hang import (
    HangSettings,
    StepClock,
    blocked,
    hang_timeout_s,
    hung,
    process_stopped,
    timeout_for,
)
from unbroken.protocol.heartbeat import HeartbeatRecord, Phase

pytestmark = pytest.mark.unit

T0 = 1767225600.0
SETTINGS = HangSettings()


def _rec(committed: int, committed_at: float, **kw: object) -> HeartbeatRecord:
    fields: dict[str, object] = {
        "pid": 7,
        "phase": Phase.TRAINING,
        "committed": committed,
        "committed_at": committed_at,
        "step": committed,
        "step_at": committed_at,
        "tick_at": committed_at,
    }
    fields.update(kw)
    return HeartbeatRecord(**fields)  # type: ignore[arg-type]


def _stopped_timeout(clock: StepClock | None, settings: HangSettings) -> float:
    return timeout_for(clock, settings, stopped=True)


def _clock(step_s: float, commits: int = 6) -> StepClock:
    clock = StepClock.of(_rec(0, 0.0))
    for i in range(1, commits + 1):
        clock = clock.observe(_rec(i, T0 + i * step_s))
    return clock


@pytest.mark.parametrize("step_s", [0.2, 0.5, 2.0])
def test_the_step_time_is_the_interval_between_commits(step_s: float) -> None:
    assert _clock(step_s).step_s == pytest.approx(step_s)
    assert _stopped_timeout(_clock(step_s), SETTINGS) == pytest.approx(3 * step_s)


def test_commits_seen_together_count_each_step() -> None:
    clock = StepClock.of(_rec(10, T0)).observe(_rec(14, T0 + 1.0))
    assert clock.step_s == pytest.approx(0.25)


def test_a_fast_job_is_held_to_the_jitter_floor() -> None:
    assert _stopped_timeout(_clock(0.01), SETTINGS) == SETTINGS.floor_s


@pytest.mark.parametrize(
    "change",
    [{"pid": 8}, {"recoveries": 1}, {"state_loaded_at": T0 + 9.0}],
    ids=["new-process", "recovered-in-process", "state-repaired"],
)
def test_a_new_process_or_a_recovery_starts_a_new_clock(change: dict[str, object]) -> None:
    """The time from the last commit before a fault to the first after it is no step time:
    until two commits are seen again the startup timeout holds."""
    clock = _clock(0.2).observe(dataclasses.replace(_rec(20, T0 + 30.0), **change))  # type: ignore[arg-type]
    assert clock.step_s == 0.0
    assert _stopped_timeout(clock, SETTINGS) == SETTINGS.startup_s


def test_before_two_commits_the_startup_timeout_holds() -> None:
    assert _stopped_timeout(None, SETTINGS) == SETTINGS.startup_s
    assert _stopped_timeout(StepClock.of(_rec(0, 0.0)).observe(_rec(1, T0)), SETTINGS) == 3.0


def test_one_slow_step_moves_the_step_time_only_part_of_the_way() -> None:
    clock = _clock(0.2).observe(_rec(7, T0 + 6 * 0.2 + 2.0))
    assert 0.2 < clock.step_s < 2.0


@pytest.mark.parametrize(
    ("tick_age_s", "progress_age_s", "is_hung"),
    [
        (0.7, 0.7, True),  # a stopped process: neither ticks nor steps
        (0.7, 0.1, False),  # the tick thread starved, but steps go on
        (0.05, 5.0, False),  # blocked in a collective (a peer is gone): it ticks
        (0.5, 0.7, False),  # at the timeout, not past it
    ],
)
def test_a_hang_needs_both_the_tick_and_the_progress_to_stop(
    tick_age_s: float, progress_age_s: float, is_hung: bool
) -> None:
    now = T0 + 100.0
    rec = _rec(50, now - progress_age_s, tick_at=now - tick_age_s)
    silence = hung(rec, 0.5, now)
    assert (silence is not None) is is_hung
    if silence is not None:
        assert silence.silent_s == pytest.approx(tick_age_s)


def test_stamps_not_yet_written_count_from_the_start_not_from_the_epoch() -> None:
    """A record read with no tick and no progress stamped (0.0) is measured from the process's
    start: a replacement that started a moment ago is not "silent for 56 years"."""
    now = T0 + 100.0
    fresh = _rec(20, 0.0, step_at=0.0, tick_at=0.0, started_at=now - 0.2)
    assert hung(fresh, 0.5, now) is None
    assert hung(fresh, 0.5, now + 1.0) is not None  # still silent well after its start
    assert hung(_rec(20, 0.0, step_at=0.0, tick_at=0.0), 0.5, now) is None


def test_a_hang_is_caught_within_three_step_times() -> None:
    """The rank stops right after a commit: the agent sees it hung once three step times
    have passed, not before."""
    step_s = 0.4
    clock = _clock(step_s)
    stopped = _rec(6, T0 + 6 * step_s)
    timeout = _stopped_timeout(clock.observe(stopped), SETTINGS)
    assert hung(stopped, timeout, T0 + 6 * step_s + 3 * step_s - 0.01) is None
    assert hung(stopped, timeout, T0 + 6 * step_s + 3 * step_s + 0.01) is not None


def test_settings_must_be_positive() -> None:
    with pytest.raises(ValueError, match="must be > 0"):
        HangSettings(floor_s=0.0)


def test_a_process_that_runs_or_sleeps_gets_the_startup_timeout_at_least() -> None:
    """Its tick stopped while it holds the GIL in a C call: a healthy rank may do so for a
    moment (a new process group after an op retry), so three fast steps are not enough."""
    assert timeout_for(_clock(0.05), SETTINGS, stopped=False) == SETTINGS.startup_s
    assert timeout_for(_clock(2.0), SETTINGS, stopped=False) == pytest.approx(6.0)


def test_the_state_of_a_process_is_read_from_proc() -> None:
    proc = subprocess.Popen(["sleep", "30"])
    try:
        assert not process_stopped(proc.pid)
        clock = dataclasses.replace(_clock(0.05), pid=proc.pid)
        assert hang_timeout_s(clock, SETTINGS) == SETTINGS.startup_s
        os.kill(proc.pid, signal.SIGSTOP)
        for _ in range(100):
            if process_stopped(proc.pid):
                break
            time.sleep(0.01)
        assert process_stopped(proc.pid)
        assert hang_timeout_s(clock, SETTINGS) == SETTINGS.floor_s
    finally:
        proc.kill()
        proc.wait()
    assert not process_stopped(proc.pid)


# A rank asked to stop (SIGTERM) whose step began at T0 and took 1 s: is it blocked?
@pytest.mark.parametrize(
    ("now", "changes", "expected"),
    [
        (T0 + 1.0, {}, False),  # ticking, in its step
        (T0 + 5.0, {}, True),  # no progress for four step times: inside a collective
        (T0 + 1.0, {"tick_at": T0 + 0.2}, True),  # its tick stopped (SIGSTOP, a wedged lock)
        # It saw its step fail and stops (writing last words): acting, however long it takes.
        (T0 + 30.0, {"phase": Phase.STOPPING, "failed_at": T0 + 1.5}, False),
        # Stopping, but its failure was an earlier step's: blocked as any other.
        (T0 + 30.0, {"phase": Phase.STOPPING, "failed_at": T0 - 9.0}, True),
    ],
)
def test_a_rank_asked_to_stop_is_blocked_only_when_it_cannot_act(
    now: float, changes: dict[str, object], expected: bool
) -> None:
    rec = _rec(4, T0, step_time_s=1.0, tick_at=now - 0.1)
    assert blocked(dataclasses.replace(rec, **changes), now) is expected  # type: ignore[arg-type]
