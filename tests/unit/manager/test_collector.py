"""A large job's manager freezes what it holds, so full collections walk only what came after,
and collects everything, frozen cycles included, only at a quiet time."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from unbroken.manager.collector import FREEZE_S, FULL_S, Collector

pytestmark = pytest.mark.unit


class _Node:
    def __init__(self) -> None:
        self.peer: _Node | None = None


def _cycle() -> weakref.ref[_Node]:
    """A reference cycle nothing else refers to, and a weak reference that says if it lives."""
    a, b = _Node(), _Node()
    a.peer, b.peer = b, a
    return weakref.ref(a)


@pytest.fixture(autouse=True)
def _unfrozen() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()


def test_a_small_jobs_manager_leaves_the_collector_alone() -> None:
    c = Collector(active=False)
    c.tick(0.0, quiet=True)
    c.tick(FULL_S + 1, quiet=True)
    assert gc.get_freeze_count() == 0


def test_frozen_cycles_are_collected_only_at_a_quiet_full_collection() -> None:
    c = Collector(active=True)
    alive = _cycle()
    c.tick(100.0, quiet=True)  # the first tick freezes what the start left
    assert gc.get_freeze_count() > 0
    gc.collect()
    assert alive() is not None, "a frozen cycle is not walked by Python's own collections"
    c.tick(100.0 + FULL_S, quiet=False)  # an incident is open: no collection of everything
    gc.collect()
    assert alive() is not None
    c.tick(100.0 + FULL_S + 1, quiet=True)
    assert alive() is None
    assert c.last_full is not None and c.last_full[1] >= 2
    assert gc.get_freeze_count() > 0, "what is left is frozen again"
    c.close()
    assert gc.get_freeze_count() == 0


def test_what_came_after_a_freeze_is_collected_as_usual_until_the_next() -> None:
    c = Collector(active=True)
    c.tick(0.0, quiet=True)
    young = _cycle()
    c.tick(FREEZE_S / 2, quiet=True)  # not yet time to freeze again
    gc.collect()
    assert young() is None
    kept = _cycle()
    c.tick(FREEZE_S, quiet=True)
    gc.collect()
    assert kept() is not None
    c.close()
