"""Straggler scores: the tables of relative and node scores, and a tracker fed step by step."""

from __future__ import annotations

import pytest

from unbroken.policy.straggler import (
    StragglerKnobs,
    StragglerTracker,
    node_scores,
    relative_scores,
)

pytestmark = pytest.mark.unit

NODES = {0: "a", 1: "a", 2: "b", 3: "b"}


@pytest.mark.parametrize(
    ("medians", "scores"),
    [
        ({}, {}),
        ({0: 1.0}, {0: 1.0}),
        ({0: 1.0, 1: 1.0}, {0: 1.0, 1: 1.0}),
        ({0: 1.0, 1: 2.0}, {0: 1.0, 1: 0.5}),
        ({0: 0.4, 1: 0.5, 2: 2.0}, {0: 1.0, 1: 0.8, 2: 0.2}),
        ({0: 0.0, 1: 2.0, 2: 4.0}, {1: 1.0, 2: 0.5}),  # no timing yet: not scored
    ],
)
def test_relative_score_is_the_fastest_median_over_the_ranks_own(
    medians: dict[int, float], scores: dict[int, float]
) -> None:
    assert relative_scores(medians) == pytest.approx(scores)


@pytest.mark.parametrize(
    ("scores", "nodes"),
    [
        ({}, {}),
        ({0: 1.0, 1: 0.9, 2: 0.5, 3: 1.0}, {"a": 0.9, "b": 0.5}),
        ({0: 1.0, 2: 0.7, 9: 0.1}, {"a": 1.0, "b": 0.7}),  # rank 9: no node known
    ],
)
def test_a_node_scores_as_its_slowest_rank(
    scores: dict[int, float], nodes: dict[str, float]
) -> None:
    assert node_scores(scores, NODES) == pytest.approx(nodes)


def feed(tracker: StragglerTracker, step: int, times: dict[int, float]) -> None:
    for rank, t in times.items():
        tracker.observe(rank, step, t)


def test_a_node_slow_for_hold_s_is_a_straggler_and_a_quick_one_is_not() -> None:
    tr = StragglerTracker(StragglerKnobs(threshold=0.75, window=3, hold_s=10.0))
    fast = {0: 0.10, 1: 0.11, 2: 0.10, 3: 0.10}
    for step in range(3):
        feed(tr, step, fast)
    v = tr.evaluate(100.0, NODES)
    assert v.stragglers == () and v.slow_since == {}
    assert v.nodes["a"] == pytest.approx(0.10 / 0.11)
    # Node b's rank 3 computes four times as long from step 3 on (a CPU quota).
    slow = {**fast, 3: 0.40}
    feed(tr, 3, slow)
    assert tr.evaluate(101.0, NODES).slow_since == {}  # one slow step in three: median fast
    feed(tr, 4, slow)
    v = tr.evaluate(102.0, NODES)
    assert v.slow_since == {"b": 102.0} and v.stragglers == ()
    assert v.nodes["b"] == pytest.approx(0.25) and v.relative[2] == pytest.approx(1.0)
    assert v.individual[3] == pytest.approx(0.25)
    for step in range(5, 8):
        feed(tr, step, slow)
    assert tr.evaluate(111.9, NODES).stragglers == ()
    assert tr.evaluate(112.0, NODES).stragglers == ("b",)


def test_a_node_that_recovers_before_hold_s_starts_again() -> None:
    tr = StragglerTracker(StragglerKnobs(threshold=0.75, window=1, hold_s=5.0))
    feed(tr, 0, {0: 0.1, 2: 0.3})
    assert tr.evaluate(0.0, NODES).slow_since == {"b": 0.0}
    feed(tr, 1, {0: 0.1, 2: 0.1})
    assert tr.evaluate(4.0, NODES).slow_since == {}
    feed(tr, 2, {0: 0.1, 2: 0.3})
    assert tr.evaluate(6.0, NODES).stragglers == ()  # slow since 6.0, not since 0.0
    assert tr.evaluate(11.0, NODES).stragglers == ("b",)


def test_repeated_reports_of_a_step_count_once_and_a_redone_step_starts_the_window() -> None:
    tr = StragglerTracker(StragglerKnobs(window=2, hold_s=0.0))
    tr.observe(0, 5, 0.1)
    tr.observe(0, 5, 0.9)  # the same step read again from the heartbeat
    assert tr.medians() == {}
    tr.observe(0, 6, 0.1)
    assert tr.medians() == {0: pytest.approx(0.1)}
    tr.observe(0, 4, 0.3)  # recovered to an earlier step: the old window is gone
    assert tr.medians() == {}
    tr.observe(0, 5, 0.3)
    assert tr.medians() == {0: pytest.approx(0.3)}
    tr.forget(0)
    assert tr.medians() == {}


def test_one_node_or_all_slow_together_is_no_straggler() -> None:
    tr = StragglerTracker(StragglerKnobs(window=1, hold_s=0.0))
    feed(tr, 0, {0: 0.1, 1: 0.5})  # both on node a: nobody to compare a node with
    assert tr.evaluate(0.0, NODES).stragglers == ()
    tr2 = StragglerTracker(StragglerKnobs(window=1, hold_s=0.0))
    feed(tr2, 0, {0: 0.1, 2: 0.1})
    tr2.evaluate(0.0, NODES)
    feed(tr2, 1, {0: 0.4, 2: 0.4})  # everybody four times slower
    v = tr2.evaluate(1.0, NODES)
    assert v.stragglers == () and v.individual == pytest.approx({0: 0.25, 2: 0.25})


@pytest.mark.parametrize(("min_gap_s", "stragglers"), [(0.02, ()), (0.0, ("b",))])
def test_milliseconds_of_difference_are_noise_however_large_the_ratio(
    min_gap_s: float, stragglers: tuple[str, ...]
) -> None:
    tr = StragglerTracker(StragglerKnobs(window=1, hold_s=0.0, min_gap_s=min_gap_s))
    feed(tr, 0, {0: 0.001, 2: 0.004})  # four times as long, but 3 ms
    v = tr.evaluate(0.0, NODES)
    assert v.nodes["b"] == pytest.approx(0.25) and v.stragglers == stragglers


@pytest.mark.parametrize(
    ("kwargs", "problem"),
    [
        ({"threshold": 1.0}, "threshold must be between 0 and 1"),
        ({"threshold": 0.0}, "threshold must be between 0 and 1"),
        ({"window": 0}, "window must be at least 1"),
        ({"hold_s": -1.0}, "hold_s must not be negative"),
        ({"min_gap_s": -0.1}, "min_gap_s must not be negative"),
    ],
)
def test_bad_knobs_name_the_problem(kwargs: dict[str, float], problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        StragglerKnobs(**kwargs)  # type: ignore[arg-type]
