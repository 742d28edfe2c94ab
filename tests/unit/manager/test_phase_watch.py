"""The manager's phase watch: when every rank of a generation reached each phase, kept up to
date from the ranks it was told changed, always equal to a scan of every rank."""

from __future__ import annotations

import random

import pytest

from unbroken.manager.progress import GenerationPhases, PhaseWatch, RankView

pytestmark = pytest.mark.unit

NONE = GenerationPhases(None, None, None, None)


def scan(ranks: dict[int, RankView], world_size: int, since: float) -> GenerationPhases:
    """Every rank read: a phase is reached when every rank's stamp for it is newer than
    ``since``, at the latest of them; the start step when all ranks agree on one."""
    views = list(ranks.values())
    if len(views) < world_size:
        return NONE
    out: list[float | None] = []
    for stamp in ("comm_ready_at", "state_loaded_at", "first_commit_at"):
        ts = [getattr(v, stamp) for v in views]
        out.append(max(ts) if ts and all(t > since for t in ts) else None)
    if all(t is None for t in out):
        return NONE
    starts = {v.start_step for v in views}
    start = next(iter(starts)) if len(starts) == 1 and -1 not in starts else None
    return GenerationPhases(out[0], out[1], start, out[2])


def view(rank: int, comm: float = 0.0, state: float = 0.0, first: float = 0.0, start: int = -1):
    v = RankView(rank=rank, pid=100 + rank, generation=0)
    v.comm_ready_at, v.state_loaded_at, v.first_commit_at, v.start_step = (
        comm,
        state,
        first,
        start,
    )
    return v


def test_a_phase_is_reached_when_the_last_rank_reaches_it() -> None:
    w = PhaseWatch()
    ranks = {r: view(r) for r in range(4)}
    assert w.phases(ranks, 4, 1, 10.0) == NONE
    for r in range(4):
        ranks[r].comm_ready_at = 11.0 + r
        w.touch(r)
        got = w.phases(ranks, 4, 1, 10.0)
        assert got.comm_ready_at == (14.0 if r == 3 else None)
    # A stamp from before the generation began (a process that lived on) does not count.
    ranks[2].state_loaded_at = 9.0
    w.touch(2)
    assert w.phases(ranks, 4, 1, 10.0).state_loaded_at is None


def test_fewer_ranks_than_the_world_reach_nothing() -> None:
    w = PhaseWatch()
    ranks = {r: view(r, 11.0, 12.0, 13.0, 5) for r in range(3)}
    assert w.phases(ranks, 4, 1, 10.0) == NONE
    ranks[3] = view(3, 11.0, 12.0, 13.0, 5)
    w.touch(3)
    assert w.phases(ranks, 4, 1, 10.0) == GenerationPhases(11.0, 12.0, 5, 13.0)


def test_a_replaced_view_takes_back_what_the_old_one_reached() -> None:
    w = PhaseWatch()
    ranks = {r: view(r, 11.0 + r, 12.0, 13.0, 5) for r in range(3)}
    assert w.phases(ranks, 3, 1, 10.0) == GenerationPhases(13.0, 12.0, 5, 13.0)
    ranks[2] = view(2)  # a replacement process: nothing reached yet
    w.touch(2)
    assert w.phases(ranks, 3, 1, 10.0) == NONE
    ranks[2] = view(2, 11.5, 12.0, 13.0, 5)
    w.touch(2)
    # The latest communication stamp went with the old view.
    assert w.phases(ranks, 3, 1, 10.0) == GenerationPhases(12.0, 12.0, 5, 13.0)


def test_a_new_generation_counts_afresh() -> None:
    w = PhaseWatch()
    ranks = {r: view(r, 11.0, 12.0, 13.0, 5) for r in range(2)}
    assert w.phases(ranks, 2, 1, 10.0).first_commit_at == 13.0
    assert w.phases(ranks, 2, 2, 20.0) == NONE


def test_a_view_added_without_a_touch_is_still_counted() -> None:
    w = PhaseWatch()
    ranks = {r: view(r, 11.0, 12.0, 13.0, 5) for r in range(2)}
    assert w.phases(ranks, 3, 1, 10.0) == NONE
    ranks[2] = view(2, 11.0, 12.0, 14.0, 5)
    assert w.phases(ranks, 3, 1, 10.0) == GenerationPhases(11.0, 12.0, 5, 14.0)


@pytest.mark.parametrize("seed", range(20))
def test_equals_a_scan_of_every_rank_through_random_changes(seed: int) -> None:
    rng = random.Random(seed)
    w = PhaseWatch()
    world = rng.randint(1, 12)
    ranks: dict[int, RankView] = {}
    gen, since = 1, 10.0
    for _ in range(300):
        op = rng.random()
        r = rng.randrange(world)
        if op < 0.03:  # a new generation: every view replaced by the rejoin
            gen, since = gen + 1, since + 10.0
            ranks = {}
        elif op < 0.25:
            ranks[r] = view(r)
            w.touch(r)
        elif r in ranks:
            v = ranks[r]
            stamp = rng.choice(("comm_ready_at", "state_loaded_at", "first_commit_at"))
            setattr(v, stamp, rng.choice((0.0, since - 1.0, since + rng.randint(1, 5))))
            if rng.random() < 0.3:
                v.start_step = rng.choice((-1, 5, 6))
            w.touch(r)
        if rng.random() < 0.5:
            assert w.phases(ranks, world, gen, since) == scan(ranks, world, since)
    assert w.phases(ranks, world, gen, since) == scan(ranks, world, since)
