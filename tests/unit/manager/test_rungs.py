"""The multi-step rungs advance one step at a time, as values: rejoin once the ranks it waits for
stopped (from the most advanced of them), last words from a stopped replica, each failure named."""

from __future__ import annotations

import dataclasses

import pytest

from unbroken.manager.rungs import (
    AskWriter,
    LastWords,
    LastWordsFailed,
    NoReplica,
    PendingRejoin,
    RankSeen,
    RejoinFrom,
    Saved,
    Wait,
    WaitFor,
    advance_last_words,
    advance_rejoin,
    replica_source,
)

pytestmark = pytest.mark.unit

T0 = 1767225600.0


def _rank(rank: int, committed: int = 10, **kw: object) -> RankSeen:
    fields: dict[str, object] = {
        "rank": rank,
        "pod": f"pod-{rank // 2}",
        "alive": True,
        "pod_up": True,
        "pod_known": True,
        "stopping": True,
        "committed": committed,
    }
    fields.update(kw)
    return RankSeen(**fields)  # type: ignore[arg-type]


def _ranks(*ranks: RankSeen) -> dict[int, RankSeen]:
    return {r.rank: r for r in ranks}


REJOIN = PendingRejoin(
    replace={"pod-1": (3,)},
    lost=frozenset({3}),
    skip_pods=(),
    deadline_at=T0 + 10,
    rung=4,
    waits_for=frozenset({"pod-0", "pod-1"}),
)


def test_the_source_is_the_most_advanced_healthy_replica_lowest_rank_first() -> None:
    ranks = [_rank(0, 10), _rank(1, 11), _rank(2, 11), _rank(3, 12)]
    assert replica_source(ranks, exclude={3}) == (1, 11)
    assert replica_source([_rank(0, alive=False), _rank(1, pod_up=False)], exclude=()) is None
    assert replica_source([_rank(0, 10, stopping=False), _rank(1, 9)], (), stopped=True) == (1, 9)


def test_a_rejoin_waits_for_every_healthy_rank_to_stop() -> None:
    ranks = [_rank(0), _rank(1, stopping=False), _rank(2), _rank(3, alive=False)]
    assert advance_rejoin(REJOIN, ranks, T0) == Wait()
    ranks[1] = _rank(1)
    assert advance_rejoin(REJOIN, ranks, T0) == RejoinFrom(0, 10, all_stopped=True)


def test_a_recovery_waits_for_the_source_pod_alone_and_takes_its_step() -> None:
    """The rejoin names the step the source stopped at; the other ranks, still training, stop
    at their step boundary when the rejoin reaches them."""
    source_only = dataclasses.replace(REJOIN, waits_for=frozenset({"pod-0"}))
    ranks = [_rank(0, 10, stopping=False), _rank(1, 10), _rank(2, 12, stopping=False)]
    assert advance_rejoin(source_only, ranks, T0) == Wait()
    ranks[0] = _rank(0, 11)
    assert advance_rejoin(source_only, ranks, T0) == RejoinFrom(0, 11, all_stopped=True)


def test_when_the_source_pod_goes_before_it_stopped_the_next_replica_is_waited_for() -> None:
    source_only = dataclasses.replace(REJOIN, waits_for=frozenset({"pod-0"}))
    gone = [
        _rank(0, 12, stopping=False, pod_up=False),
        _rank(1, 12, stopping=False, alive=False),
        _rank(2, 11, stopping=False),
    ]
    assert advance_rejoin(source_only, gone, T0) == WaitFor("pod-1")
    nothing_left = [_rank(0, pod_up=False), _rank(1, alive=False), _rank(3)]
    assert advance_rejoin(source_only, nothing_left, T0) == NoReplica()


def test_a_rejoin_goes_ahead_at_its_deadline_and_says_so() -> None:
    ranks = [_rank(0), _rank(1, stopping=False, committed=11)]
    assert advance_rejoin(REJOIN, ranks, T0 + 10) == RejoinFrom(1, 11, all_stopped=False)


def test_a_rejoin_without_a_replica_fails() -> None:
    ranks = [_rank(0, pod_up=False), _rank(3)]
    assert advance_rejoin(REJOIN, ranks, T0 + 10) == NoReplica()


def test_a_hot_switch_waits_for_the_leaving_ranks_but_never_takes_them_as_source() -> None:
    """The sub-healthy pod's ranks are healthy and the most advanced here, but they leave
    the job: the rejoin waits for them to stop, then takes the state from a rank that stays."""
    switch = PendingRejoin(
        replace={},
        lost=frozenset(),
        skip_pods=(),
        deadline_at=T0 + 10,
        rung=4,
        waits_for=frozenset({"pod-0", "pod-1"}),
        leaving=frozenset({2, 3}),
    )
    ranks = [_rank(0, 10), _rank(1, 10), _rank(2, 11, stopping=False), _rank(3, 11)]
    assert advance_rejoin(switch, ranks, T0) == Wait()
    ranks[2] = _rank(2, 11)
    assert advance_rejoin(switch, ranks, T0) == RejoinFrom(0, 10, all_stopped=True)
    only_leaving = [_rank(0, pod_up=False), _rank(1, alive=False), _rank(2), _rank(3)]
    assert advance_rejoin(switch, only_leaving, T0) == NoReplica()


def test_a_rejoin_ignores_the_pods_it_skips() -> None:
    skipping = dataclasses.replace(REJOIN, skip_pods=("pod-1",))
    ranks = [_rank(0), _rank(1), _rank(2, stopping=False)]
    assert advance_rejoin(skipping, ranks, T0) == RejoinFrom(0, 10, all_stopped=True)


LAST_WORDS = LastWords(
    lost=frozenset({3}), stop_deadline_at=T0 + 10, deadline_at=T0 + 60, began_at=T0, rung=2
)


def test_last_words_are_asked_of_a_stopped_replica_then_saved() -> None:
    ranks = _ranks(_rank(0, 9), _rank(1, 10, stopping=False), _rank(2, 10), _rank(3, alive=False))
    lw, step = advance_last_words(LAST_WORDS, ranks, T0 + 1)
    assert step == Wait() and lw == LAST_WORDS
    ranks[1] = _rank(1, 10)
    lw, step = advance_last_words(LAST_WORDS, ranks, T0 + 2)
    assert step == AskWriter(1, 10) and (lw.writer, lw.asked_at) == ((1, 10), T0 + 2)
    assert advance_last_words(lw, ranks, T0 + 3)[1] == Wait()
    ranks[1] = _rank(1, 10, dumped_step=10, dumped_at=T0 + 4.5)
    assert advance_last_words(lw, ranks, T0 + 5)[1] == Saved(1, 10, T0 + 4.5, 2.5)


@pytest.mark.parametrize(
    ("writer", "now", "reason"),
    [
        (_rank(1, alive=False), T0 + 3, "rank 1 died writing them"),
        (_rank(1, dump_failed_at=T0 + 3), T0 + 3, "rank 1 could not write them (see its log)"),
        (_rank(1), T0 + 60, "rank 1 did not finish within the dump timeout"),
        (_rank(1, dumped_step=9, dumped_at=T0 + 3), T0 + 60, "within the dump timeout"),
    ],
)
def test_last_words_that_fail_say_why(writer: RankSeen, now: float, reason: str) -> None:
    asked = dataclasses.replace(LAST_WORDS, writer=(1, 10), asked_at=T0 + 2)
    _, step = advance_last_words(asked, _ranks(_rank(0), writer), now)
    assert isinstance(step, LastWordsFailed) and step.reason.endswith(reason)


def test_last_words_with_no_stopped_replica_fail_at_the_stop_deadline() -> None:
    ranks = _ranks(_rank(0, stopping=False), _rank(3, alive=False))
    _, step = advance_last_words(LAST_WORDS, ranks, T0 + 10)
    assert step == LastWordsFailed("no healthy rank stopped at a step boundary")
