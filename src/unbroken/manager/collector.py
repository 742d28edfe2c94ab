"""The garbage collector of a large job's manager: what lives as long as the job is walked rarely.

A 10k-node job's manager holds about 1.5 million container objects that live as long as the job:
80k rank views, and each agent's open order and heartbeat streams on the control server's event
loop (coroutines, tasks, gRPC's call state). CPython walks every one of them at each full
collection, and it makes one each time a quarter more objects have outlived the younger
generations since the last: with heartbeats replacing rank records all the time, every 2-10 s
at 10k nodes, 0.8-1.1 s each, collecting almost nothing (tens of objects), and the interpreter's
lock held throughout, so the manager and the control server both stood still
(``bench/scale.py``: "the manager did not run for 2 s", a node's loss found 4.5 s after it
instead of 2 s; at 2000 nodes 0.1-0.26 s each).

So a large job's manager freezes what is there every :data:`FREEZE_S` (``gc.freeze``: moved
out of the collector's generations, O(1); still freed as usual when nothing refers to it), and a
full collection walks only what came after. A frozen object that becomes garbage only as part
of a cycle is not freed by its count: a collection of everything (unfreeze, collect) finds it,
made at most once per :data:`FULL_S` and only while no incident is open. A small job (heartbeats
at the floor interval) leaves the collector as Python sets it.
"""

from __future__ import annotations

import gc
import logging
import time

log = logging.getLogger(__name__)

#: How often a large job's manager freezes the objects it holds.
FREEZE_S = 10.0
#: How often at most it collects everything, frozen objects included, while no incident is open.
FULL_S = 600.0


class Collector:
    """Freezes a large job manager's long-lived objects; collects everything at quiet times.

    Args:
        active: whether to do anything (a large job); inactive, every call returns at once.
    """

    def __init__(self, active: bool) -> None:
        self.active = active
        self._freeze_at: float | None = None
        self._full_at = 0.0
        #: What the last collection of everything took, s, and what it found (for the log).
        self.last_full: tuple[float, int] | None = None

    def tick(self, now: float, quiet: bool) -> None:
        """Called on the manager's tick; ``quiet``: no incident is open."""
        if not self.active:
            return
        if self._freeze_at is None:  # the first tick: the job's start is behind
            self._freeze_at = now
            self._full_at = now + FULL_S
        if quiet and now >= self._full_at:
            self._full_at = now + FULL_S
            self.collect_all()
        if now >= self._freeze_at:
            self._freeze_at = now + FREEZE_S
            gc.freeze()

    def collect_all(self) -> None:
        """Collects every generation, what was frozen included, then freezes what is left."""
        t0 = time.perf_counter()
        gc.unfreeze()
        found = gc.collect()
        gc.freeze()
        took = time.perf_counter() - t0
        self.last_full = (took, found)
        log.log(
            logging.INFO if took > 0.5 else logging.DEBUG,
            "collected everything the manager holds: %d objects freed in %.2f s",
            found,
            took,
        )

    def close(self) -> None:
        """The job is over: what was frozen goes back to the collector."""
        if self.active:
            gc.unfreeze()
