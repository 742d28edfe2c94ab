"""How long a stopped rank waits for the job manager's decision (``MINDIO_WAIT_MINDX_TIME``).

In the reference a rank whose step failed waits ``MINDIO_WAIT_MINDX_TIME`` seconds (1-3600,
default 30) for the fault center to decide what happens to the job; hearing nothing, it gives
up. Here the control plane gives the value to the ranks as ``UNBROKEN_DECISION_WAIT_S``. A
stopped rank has heard the decision when any order reaches its mailbox: the ``pause`` every
process-level rung begins with (also the "hold" of a pod pending for room before a scale-in),
a ``dump``, a ``stress`` test or the ``rejoin`` itself. After that it waits for its ``rejoin``
up to ``UNBROKEN_COMMAND_TIMEOUT_S`` from the stop, as long as the rung may take. Without the
variable (plain ``torchrun``, a test) only the command timeout applies. Pure: no torch, time is
an argument.
"""

from __future__ import annotations

from collections.abc import Mapping

DECISION_WAIT = "UNBROKEN_DECISION_WAIT_S"
#: The reference's range of ``MINDIO_WAIT_MINDX_TIME``.
DECISION_WAIT_MIN_S = 1.0
DECISION_WAIT_MAX_S = 3600.0


def decision_wait_from_environ(environ: Mapping[str, str]) -> float | None:
    """``UNBROKEN_DECISION_WAIT_S`` in seconds, or None when it is not set."""
    raw = environ.get(DECISION_WAIT, "")
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{DECISION_WAIT}={raw!r} is not a number of seconds") from None
    if not DECISION_WAIT_MIN_S <= value <= DECISION_WAIT_MAX_S:
        raise ValueError(
            f"{DECISION_WAIT}={raw!r} is out of range: MINDIO_WAIT_MINDX_TIME is "
            f"{DECISION_WAIT_MIN_S:g}-{DECISION_WAIT_MAX_S:g} s"
        )
    return value


def undecided_too_long(waited_s: float, decided: bool, decision_wait_s: float | None) -> str | None:
    """Why a rank that has waited ``waited_s`` since it stopped gives up for want of a
    decision, or None while it may go on waiting (a decision heard, or none is bounded)."""
    if decided or decision_wait_s is None or waited_s < decision_wait_s:
        return None
    return (
        f"no decision from the job manager within {decision_wait_s:g} s "
        "(MINDIO_WAIT_MINDX_TIME), giving up"
    )
