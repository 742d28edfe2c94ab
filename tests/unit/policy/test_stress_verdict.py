"""Judging an online stress test (unbroken.policy.stress): pure, no torch."""

from __future__ import annotations

import pytest

from unbroken.policy.stress import judge
from unbroken.protocol.stress import (
    LinkMeasure,
    RankStressResult,
    StressCode,
    decode_result,
    encode_result,
    link_rounds,
)

pytestmark = pytest.mark.unit

GOOD = "3f8a1c2e00000000"


def result(
    rank: int,
    links: dict[int, float],
    checksum: str = GOOD,
    expected: str = GOOD,
    error: str = "",
) -> RankStressResult:
    return RankStressResult(
        rank=rank,
        device_code=StressCode.OK if checksum == expected else StressCode.FAULT,
        checksum=checksum,
        expected=expected,
        device_s=0.01,
        links=tuple(LinkMeasure(peer=p, gbps=g, seconds=0.01) for p, g in links.items()),
        error=error,
    )


def healthy(world: int, gbps: float = 2.0) -> dict[int, RankStressResult]:
    peers: dict[int, dict[int, float]] = {r: {} for r in range(world)}
    for round_ in link_rounds(world):
        for a, b in round_:
            peers[a][b] = gbps
            peers[b][a] = gbps
    return {r: result(r, peers[r]) for r in range(world)}


@pytest.mark.parametrize("world", [2, 3, 4, 5, 8])
def test_link_rounds_pair_each_rank_at_most_once_per_round_and_cover_the_ring(world: int) -> None:
    rounds = link_rounds(world)
    for round_ in rounds:
        ranks = [r for pair in round_ for r in pair]
        assert len(ranks) == len(set(ranks)), round_
    links = {pair for round_ in rounds for pair in round_}
    ring = {tuple(sorted((i, (i + 1) % world))) for i in range(world)}
    assert links == ring
    assert len(rounds) <= 3


def test_link_rounds_of_four_ranks_are_neighbours_then_shifted_pairs() -> None:
    assert link_rounds(4) == (((0, 1), (2, 3)), ((0, 3), (1, 2)))
    assert link_rounds(1) == ()


def test_a_healthy_job_passes_with_every_code_zero() -> None:
    v = judge(healthy(4), 4)
    assert v.code is StressCode.OK and v.faulty == () and v.timed_out == ()
    assert [(link.a, link.b, link.gbps) for link in v.links] == [
        (0, 1, 2.0),
        (2, 3, 2.0),
        (0, 3, 2.0),
        (1, 2, 2.0),
    ]
    assert v.median_gbps == 2.0


def test_a_device_that_computes_wrong_is_faulty() -> None:
    results = healthy(4)
    r3 = results[3]
    results[3] = result(3, {m.peer: m.gbps for m in r3.links}, checksum="3f8a1c2e00000001")
    v = judge(results, 4)
    assert [r.rank for r in v.faulty] == [3]
    (bad,) = v.faulty
    assert bad.device is StressCode.FAULT and bad.link is StressCode.OK
    assert "differs from 3f8a1c2e00000000 computed at start" in bad.reason
    assert v.code is StressCode.FAULT


def test_a_device_wrong_since_the_start_is_found_by_the_other_ranks_checksums() -> None:
    results = healthy(4)
    wrong = "0000000000000bad"
    results[2] = result(2, {m.peer: m.gbps for m in results[2].links}, wrong, wrong)
    v = judge(results, 4)
    assert [r.rank for r in v.faulty] == [2]
    assert "differs from the other ranks'" in v.faulty[0].reason


def test_a_rank_without_a_result_times_out() -> None:
    results = healthy(4)
    del results[1]
    v = judge(results, 4)
    assert v.timed_out == (1,)
    assert v.code is StressCode.TIMEOUT


def test_a_rank_whose_every_link_is_slow_is_isolated_a_single_slow_link_only_flagged() -> None:
    results = healthy(4, gbps=2.0)
    # Rank 2's both links (to 3 and to 1) are slow: rank 2 is the culprit.
    for me, peer in ((2, 3), (3, 2), (2, 1), (1, 2)):
        links = {m.peer: (0.1 if m.peer == peer else m.gbps) for m in results[me].links}
        results[me] = result(me, links)
    v = judge(results, 4)
    assert [r.rank for r in v.faulty] == [2]
    assert v.faulty[0].link is StressCode.FAULT
    # Ranks 1 and 3 have one slow link each (to 2) and one healthy: flagged, not isolated.
    codes = {r.rank: r.link for r in v.ranks}
    assert codes == {
        0: StressCode.OK,
        1: StressCode.FAILED,
        2: StressCode.FAULT,
        3: StressCode.FAILED,
    }
    slow = [(link.a, link.b) for link in v.links if link.code is StressCode.FAILED]
    assert slow == [(2, 3), (1, 2)]


def test_one_slow_link_is_flagged_and_nothing_is_isolated() -> None:
    results = healthy(4, gbps=2.0)
    for me, peer in ((0, 1), (1, 0)):
        links = {m.peer: (0.5 if m.peer == peer else m.gbps) for m in results[me].links}
        results[me] = result(me, links)
    v = judge(results, 4)
    assert v.faulty == ()
    (slow,) = [link for link in v.links if link.code is not StressCode.OK]
    assert (slow.a, slow.b, slow.gbps) == (0, 1, 0.5)
    assert "0.50 GB/s < 0.5 x median" in slow.reason
    assert v.code is StressCode.FAILED


def test_a_link_slower_on_one_end_counts_its_lower_measure() -> None:
    results = healthy(2, gbps=3.0)
    results[1] = result(1, {0: 1.0})
    v = judge(results, 2)
    assert [link.gbps for link in v.links] == [1.0]


def test_results_round_trip_through_their_codec() -> None:
    r = RankStressResult(
        rank=2,
        device_code=StressCode.FAULT,
        checksum="a",
        expected="b",
        device_s=0.5,
        links=(LinkMeasure(1, 1.5, 0.01), LinkMeasure(3, 0.0, 0.0, "peer gone")),
        error="",
    )
    assert decode_result(encode_result(r)) == r
