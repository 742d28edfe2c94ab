"""When pod-level rescheduling gives up and the job is rescheduled as a whole.

In the reference, a rescheduled pod that stays pending for 12 scheduler sessions (Volcano runs
one per second) escalates the fault to job-level rescheduling. Here the manager retries the
placement of the pending pods once per session and feeds each failed attempt in; the count
and the session length are configurable. Attempts closer together than one session count once,
so retrying faster does not escalate sooner. Pure: time is an argument.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

#: Reference: a pod pending for 12 scheduler sessions escalates to job level.
PENDING_SESSIONS_DEFAULT = 12
#: Reference: Volcano's scheduling period.
SCHEDULER_SESSION_S_DEFAULT = 1.0


@dataclass(frozen=True)
class EscalationPolicy:
    sessions: int = PENDING_SESSIONS_DEFAULT
    session_s: float = SCHEDULER_SESSION_S_DEFAULT

    def __post_init__(self) -> None:
        if self.sessions < 1:
            raise ValueError(
                f"pending sessions before escalation must be >= 1, got {self.sessions}"
            )
        if not self.session_s > 0:
            raise ValueError(f"scheduler session length must be > 0 s, got {self.session_s}")


@dataclass(frozen=True)
class Pending:
    """Pods waiting for a node since ``since_at``, and the failed sessions so far."""

    pods: tuple[str, ...]
    since_at: float
    attempts: int = 0
    last_attempt_at: float | None = None


def start_pending(pods: Iterable[str], now: float) -> Pending:
    return Pending(pods=tuple(pods), since_at=now)


def attempt_failed(pending: Pending, now: float, policy: EscalationPolicy) -> Pending:
    """Count a failed placement attempt at ``now`` (at most one per session)."""
    last = pending.last_attempt_at
    if last is not None and now < last + policy.session_s:
        return pending
    return replace(pending, attempts=pending.attempts + 1, last_attempt_at=now)


def should_escalate(pending: Pending, policy: EscalationPolicy) -> bool:
    """Whether the pods have been pending for the configured number of sessions."""
    return pending.attempts >= policy.sessions


def next_attempt_at(pending: Pending, policy: EscalationPolicy) -> float:
    """When the next attempt counts as a new session."""
    if pending.last_attempt_at is None:
        return pending.since_at
    return pending.last_attempt_at + policy.session_s


def escalation_reason(pending: Pending, now: float) -> str:
    """The sentence recorded with the decision to escalate."""
    pods = ", ".join(pending.pods)
    noun = "pod" if len(pending.pods) == 1 else "pods"
    return (
        f"{noun} {pods} stayed pending for {pending.attempts} scheduler sessions "
        f"({now - pending.since_at:.1f} s); rescheduling the whole job"
    )


def pending_line(pending: Pending, policy: EscalationPolicy, now: float) -> str:
    """What ``unbroken status`` says of pods pending in pod-level rescheduling."""
    pods = ", ".join(pending.pods)
    noun = "pod" if len(pending.pods) == 1 else "pods"
    return (
        f"{noun} {pods} pending {now - pending.since_at:.0f} s: {pending.attempts} of "
        f"{policy.sessions} scheduler sessions failed, then job-level rescheduling"
    )
