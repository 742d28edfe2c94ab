"""Pod-level rescheduling escalates to job level after N pending scheduler sessions."""

from __future__ import annotations

import pytest

from unbroken.scheduler import (
    EscalationPolicy,
    attempt_failed,
    escalation_reason,
    next_attempt_at,
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
