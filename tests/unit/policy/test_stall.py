"""Faults without progress: the backoff table and the rounds of ``unbroken launch``."""

from __future__ import annotations

import pytest

from unbroken.policy import Budgets
from unbroken.policy.stall import QUICK_ROUND_S, after_round, backoff_s, noted

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("stalls", "wait_s"),
    [(0, 0.0), (1, 0.0), (2, 1.0), (3, 2.0), (4, 4.0), (6, 16.0), (7, 30.0), (10**6, 30.0)],
)
def test_backoff_doubles_from_the_second_stall_and_is_capped(stalls: int, wait_s: float) -> None:
    assert backoff_s(stalls) == wait_s


@pytest.mark.parametrize(
    ("stalls", "lasted_s", "after"),
    [(0, 0.2, 1), (3, QUICK_ROUND_S - 0.1, 4), (3, QUICK_ROUND_S, 0), (7, 3600.0, 0)],
)
def test_a_quick_round_counts_and_a_long_one_starts_again(
    stalls: int, lasted_s: float, after: int
) -> None:
    assert after_round(stalls, lasted_s) == after


def test_faults_of_one_round_count_once() -> None:
    first = noted(Budgets(), 0, fault_at=10.0, now=10.1)
    assert (first.progress_mark, first.stalls, first.round_at) == (0, 0, 10.1)
    same_round = noted(first, 0, fault_at=10.05, now=10.2)
    assert same_round == first
    second = noted(first, 0, fault_at=11.0, now=11.1)
    assert (second.stalls, second.round_at) == (1, 11.1)
    third = noted(second, 0, fault_at=12.0, now=12.0)
    assert (third.stalls, third.round_at) == (2, 13.0)  # its rung begins after 1 s
    assert noted(third, None, fault_at=20.0, now=20.0) == third
