"""The map of virtual data-parallel ranks onto physical ranks (pure, no torch)."""

from __future__ import annotations

import pytest

from unbroken.worker import vranks

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("virtual", "world_size", "expected"),
    [
        (4, 4, [[0], [1], [2], [3]]),
        (4, 2, [[0, 1], [2, 3]]),
        (4, 3, [[0], [1], [2, 3]]),
        (4, 1, [[0, 1, 2, 3]]),
        (8, 3, [[0, 1], [2, 3, 4], [5, 6, 7]]),
        (1, 1, [[0]]),
    ],
)
def test_hosted_blocks(virtual: int, world_size: int, expected: list[list[int]]) -> None:
    assert [list(vranks.hosted(virtual, world_size, r)) for r in range(world_size)] == expected
    assert vranks.most_hosted(virtual, world_size) == max(len(e) for e in expected)


def test_every_virtual_rank_has_exactly_one_host_and_host_of_finds_it() -> None:
    for virtual in range(1, 13):
        for world_size in range(1, virtual + 1):
            owners = {}
            for r in range(world_size):
                block = vranks.hosted(virtual, world_size, r)
                assert len(block) >= 1
                for pos, v in enumerate(block):
                    assert v not in owners
                    owners[v] = (r, pos)
            assert sorted(owners) == list(range(virtual))
            for v, where in owners.items():
                assert vranks.host_of(virtual, world_size, v) == where


@pytest.mark.parametrize(
    ("virtual", "world_size", "message"),
    [
        (4, 5, "5 physical rank(s) cannot host 4 virtual rank(s)"),
        (4, 0, "0 physical rank(s) cannot host 4"),
        (0, 1, "must be >= 1, got 0"),
    ],
)
def test_impossible_sizes_are_refused(virtual: int, world_size: int, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        vranks.hosted(virtual, world_size, 0)


def test_out_of_range_ranks_are_refused() -> None:
    with pytest.raises(ValueError, match="rank 2 is not in a world of 2"):
        vranks.hosted(4, 2, 2)
    with pytest.raises(ValueError, match=r"virtual rank 4 is not in 0\.\.3"):
        vranks.host_of(4, 2, 4)
