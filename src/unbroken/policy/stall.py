"""Faults that recur without progress: how they are counted and backed off. Pure.

A script that raises at import, a checkpoint disk that is full, a device that fails the same
step every time: each recovery "works" (the ranks restart, the incident may even end with a
committed step), and the same fault comes back at the same place. Without a bound such a loop
restarts the ranks several times a second for ``max_restarts`` (32767) rounds.

The executor reports, with every fault, the highest step the job has ever committed
(``FaultReported.progress_step``). The budgets keep the mark of the previous stopping fault: a
fault whose job has not committed a step beyond that mark is a *stall*. Stalls are counted in a
row (a fault after progress starts the count again; the faults of the ranks of one round count
once); the rung for the n-th stall in a row waits :func:`backoff_s` first, and a stall beyond
``no_progress_restarts`` fails the job with the reason. ``progress_step`` None (an executor
that cannot say) counts nothing.
"""

from __future__ import annotations

import dataclasses

from unbroken.policy.states import Budgets

#: The wait before the rung of the second stall in a row; it doubles with each further stall.
BACKOFF_BASE_S = 1.0
#: The longest wait before a rung.
BACKOFF_CAP_S = 30.0
#: ``unbroken launch`` without a control plane sees no steps: a round of ranks that ends sooner
#: than this after it started counts as a round without progress.
QUICK_ROUND_S = 60.0


def noted(budgets: Budgets, progress_step: int | None, fault_at: float, now: float) -> Budgets:
    """``budgets`` after a stopping fault stamped ``fault_at`` that found the job at
    ``progress_step``, decided at ``now``.

    A fault stamped no later than the rung of the last counted one began (its decision plus
    its wait) is of the same round (the other ranks of a restart failing alike): not counted.
    """
    if progress_step is None:
        return budgets
    if progress_step > budgets.progress_mark:
        return dataclasses.replace(budgets, progress_mark=progress_step, stalls=0, round_at=now)
    if fault_at <= budgets.round_at:
        return budgets
    stalls = budgets.stalls + 1
    return dataclasses.replace(budgets, stalls=stalls, round_at=now + backoff_s(stalls))


def wait_s(budgets: Budgets, now: float) -> float:
    """How long a rung decided at ``now`` waits: what is left of the last stall's backoff."""
    return max(0.0, budgets.round_at - now)


def backoff_s(stalls: int) -> float:
    """The wait before the rung of the ``stalls``-th stall in a row: none for the first (a
    fault that strikes twice may just be unlucky), then 1, 2, 4, ... s up to the cap."""
    if stalls <= 1:
        return 0.0
    return min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2.0 ** min(stalls - 2, 32))


def exhausted(budgets: Budgets, limit: int) -> str | None:
    """Why the job must end (``budgets`` past ``limit`` stalls in a row), or None."""
    if budgets.stalls <= limit:
        return None
    mark = budgets.progress_mark
    where = f"beyond step {mark}" if mark > 0 else "at all"
    return (
        f"no progress: {budgets.stalls} faults in a row with no step committed {where} "
        f"(no-progress-restarts {limit}); the fault recurs at the same place"
    )


def after_round(stalls: int, lasted_s: float) -> int:
    """Rounds in a row without progress, after one that lasted ``lasted_s`` (``unbroken launch``
    without a control plane: a quick round is one without progress, a long one starts the count
    again)."""
    return stalls + 1 if lasted_s < QUICK_ROUND_S else 0
