"""Stragglers: ranks and nodes slower than their peers, scored from step timings. Pure.

In lockstep data-parallel training every rank's step time (start to commit) is the slowest
rank's, so the step time cannot tell which rank is slow. What differs is the time a rank
spends computing before it enters the gradient collective (its *compute time*): the fast ranks
then wait in the collective for the slow one, the slow one does not wait. The scores are over
compute times, as NVIDIA's straggler detector (nvidia-resiliency-ext) scores its section
timings:

- a rank's *median* is the median of its last ``window`` compute times (one per step);
- its *relative score* is the fastest rank's median over its own: 1.0 for the fastest rank,
  0.5 for a rank that takes twice as long;
- its *individual score* is its own best median seen over its current one: it drops when a
  rank becomes slower than it was, even when all ranks slow down together;
- a node's score is its slowest rank's (a node is as slow as its slowest rank).

A node whose relative score stays below ``threshold`` (and whose median is at least
``min_gap_s`` longer than the fastest) for ``hold_s`` seconds is a straggler:
a sub-health fault that the job's ``subHealthyStrategy`` handles. One slow step (a checkpoint,
a page fault, a noisy neighbour for a moment) moves a median by little, and a node must stay
slow for ``hold_s`` to count, so the verdict does not flap. The individual score is reported
(it says a node got slower than it was) but does not make a straggler on its own: a job whose
every rank slowed down has no healthy node to switch to.

No clock is read here: every call takes ``now``.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections import deque
from collections.abc import Mapping

#: A node whose relative score is below this is slow (NVRx's default threshold is 0.75).
DEFAULT_THRESHOLD = 0.75
#: Compute times (steps) per rank in the median.
DEFAULT_WINDOW = 5
#: How long a node must stay slow to be a straggler.
DEFAULT_HOLD_S = 10.0
#: A node is slow only when its median is also this much longer than the fastest: a model
#: whose compute takes milliseconds has ratios made of scheduler noise.
DEFAULT_MIN_GAP_S = 0.02


@dataclasses.dataclass(frozen=True)
class StragglerKnobs:
    """``threshold`` in (0, 1), ``window`` >= 1 samples, ``hold_s`` >= 0, ``min_gap_s`` >= 0
    (see :data:`DEFAULT_MIN_GAP_S`)."""

    threshold: float = DEFAULT_THRESHOLD
    window: int = DEFAULT_WINDOW
    hold_s: float = DEFAULT_HOLD_S
    min_gap_s: float = DEFAULT_MIN_GAP_S

    def __post_init__(self) -> None:
        if not 0.0 < self.threshold < 1.0:
            raise ValueError(f"threshold must be between 0 and 1 (exclusive), got {self.threshold}")
        if self.window < 1:
            raise ValueError(f"window must be at least 1 step, got {self.window}")
        if self.hold_s < 0:
            raise ValueError(f"hold_s must not be negative, got {self.hold_s}")
        if self.min_gap_s < 0:
            raise ValueError(f"min_gap_s must not be negative, got {self.min_gap_s}")


def relative_scores(medians: Mapping[int, float]) -> dict[int, float]:
    """Each rank's fastest median over its own (1.0: the fastest). Ranks without a positive
    median are left out; no ranks, no scores."""
    known = {r: m for r, m in medians.items() if m > 0}
    if not known:
        return {}
    best = min(known.values())
    return {r: best / m for r, m in known.items()}


def node_scores(scores: Mapping[int, float], node_of: Mapping[int, str]) -> dict[str, float]:
    """Each node's slowest rank's score; ranks of no known node are left out."""
    out: dict[str, float] = {}
    for rank, score in scores.items():
        node = node_of.get(rank)
        if node is not None:
            out[node] = min(score, out.get(node, score))
    return out


@dataclasses.dataclass(frozen=True)
class StragglerVerdict:
    """One evaluation: the scores, and the nodes that are stragglers now (slow since
    ``slow_since[node]`` for at least ``hold_s``)."""

    relative: dict[int, float]
    individual: dict[int, float]
    nodes: dict[str, float]
    slow_since: dict[str, float]
    stragglers: tuple[str, ...]


class StragglerTracker:
    """Compute times per rank, fed step by step, and the verdict at ``now``.

    :meth:`observe` takes a rank's compute time of one step; the same step reported again
    (the heartbeat is read more often than steps commit) is ignored, and a step lower than the
    last (the rank restarted, or redid a step after a recovery) starts that rank's window
    afresh. :meth:`forget` drops a rank that left (its pod was switched or deleted).
    """

    def __init__(self, knobs: StragglerKnobs | None = None) -> None:
        self.knobs = knobs or StragglerKnobs()
        self._times: dict[int, deque[float]] = {}
        self._last_step: dict[int, int] = {}
        self._best: dict[int, float] = {}
        self._slow_since: dict[str, float] = {}

    def observe(self, rank: int, step: int, compute_s: float) -> None:
        if compute_s <= 0:
            return
        last = self._last_step.get(rank)
        if last is not None and step == last:
            return
        if last is not None and step < last:
            self._times.pop(rank, None)
            self._best.pop(rank, None)
        self._last_step[rank] = step
        self._times.setdefault(rank, deque(maxlen=self.knobs.window)).append(compute_s)

    def forget(self, rank: int) -> None:
        self._times.pop(rank, None)
        self._last_step.pop(rank, None)
        self._best.pop(rank, None)

    def medians(self) -> dict[int, float]:
        """Each rank's median over a full window; ranks with fewer samples are not scored."""
        return {
            r: statistics.median(t) for r, t in self._times.items() if len(t) == self.knobs.window
        }

    def evaluate(self, now: float, node_of: Mapping[int, str]) -> StragglerVerdict:
        """Score the ranks with a full window and say which nodes are stragglers at ``now``.

        Fewer than two nodes scored: nobody is compared with anybody, no node is slow."""
        medians = self.medians()
        for rank, m in medians.items():
            self._best[rank] = min(m, self._best.get(rank, m))
        individual = {r: self._best[r] / m for r, m in medians.items()}
        relative = relative_scores(medians)
        nodes = node_scores(relative, node_of)
        nodes_slow: set[str] = set()
        if len(nodes) >= 2:
            best = min(m for m in medians.values() if m > 0)
            gap = {n: 0.0 for n in nodes}
            for rank, m in medians.items():
                node = node_of.get(rank)
                if node is not None and node in gap:
                    gap[node] = max(gap[node], m - best)
            nodes_slow = {
                n
                for n, score in nodes.items()
                if score < self.knobs.threshold and gap[n] >= self.knobs.min_gap_s
            }
        self._slow_since = {n: self._slow_since.get(n, now) for n in nodes_slow}
        stragglers = tuple(
            sorted(n for n, t in self._slow_since.items() if now - t >= self.knobs.hold_s)
        )
        return StragglerVerdict(
            relative=relative,
            individual=individual,
            nodes=nodes,
            slow_since=dict(self._slow_since),
            stragglers=stragglers,
        )
