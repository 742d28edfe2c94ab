"""Pod-level rescheduling escalates to job level after N pending scheduler sessions."""

from __future__ import annotations

import pytest

from unbroken.scheduler import (
    EscalationPolicy,
    attempt_failed,
    escalation_reason,
    next_attempt_at,
    pending_line,
    should_escalate,
    start_pending,
)

pytestmark = pytest.mark.unit


def test_reference_escalates_after_twelve_one_second_sessions() -> None:
    policy = EscalationPolicy()
    pending = start_pending(["worker-1"], now=100.0)
    assert next_attempt_at(pending, policy) == 100.0
    for second in range(11):
        pending = attempt_failed(pending, 100.0 + second, policy)
        assert not should_escalate(pending, policy)
    assert next_attempt_at(pending, policy) == 111.0
    pending = attempt_failed(pending, 111.0, policy)
    assert pending.attempts == 12
    assert should_escalate(pending, policy)
    assert escalation_reason(pending, now=111.0) == (
        "pod worker-1 stayed pending for 12 scheduler sessions (11.0 s); rescheduling the whole job"
    )


def test_attempts_within_one_session_count_once() -> None:
    policy = EscalationPolicy(sessions=2, session_s=1.0)
    pending = start_pending(["a", "b"], now=0.0)
    for t in (0.0, 0.1, 0.5, 0.99):
        pending = attempt_failed(pending, t, policy)
    assert pending.attempts == 1
    pending = attempt_failed(pending, 1.0, policy)
    assert should_escalate(pending, policy)
    assert escalation_reason(pending, 1.0).startswith("pods a, b stayed pending for 2 ")


def test_policy_rejects_nonsense() -> None:
    with pytest.raises(ValueError, match="must be >= 1, got 0"):
        EscalationPolicy(sessions=0)
    with pytest.raises(ValueError, match=r"must be > 0 s, got 0\.0"):
        EscalationPolicy(session_s=0.0)


@pytest.mark.parametrize(
    ("sessions", "session_s", "attempts_at", "counted", "escalates", "next_at", "line_at"),
    [
        # The reference: one attempt a second, the 12th escalates.
        (12, 1.0, [0.0], 1, False, 1.0, "pod w pending 0 s: 1 of 12 scheduler sessions failed"),
        (12, 1.0, [float(t) for t in range(12)], 12, True, 12.0, "pod w pending 11 s: 12 of 12"),
        # Faster attempts do not escalate sooner; slower ones count one each.
        (2, 1.0, [0.0, 0.5, 0.9], 1, False, 1.0, "pod w pending 1 s: 1 of 2"),
        (2, 1.0, [0.0, 5.0], 2, True, 6.0, "pod w pending 5 s: 2 of 2"),
        (3, 2.5, [0.0, 2.5, 4.0, 5.0], 3, True, 7.5, "pod w pending 5 s: 3 of 3"),
    ],
)
def test_pending_sessions_table(
    sessions: int,
    session_s: float,
    attempts_at: list[float],
    counted: int,
    escalates: bool,
    next_at: float,
    line_at: str,
) -> None:
    policy = EscalationPolicy(sessions=sessions, session_s=session_s)
    pending = start_pending(["w"], now=attempts_at[0])
    for t in attempts_at:
        pending = attempt_failed(pending, t, policy)
    assert pending.attempts == counted
    assert should_escalate(pending, policy) is escalates
    assert next_attempt_at(pending, policy) == next_at
    assert pending_line(pending, policy, attempts_at[-1]).startswith(line_at)
    assert pending_line(pending, policy, attempts_at[-1]).endswith(", then job-level rescheduling")
