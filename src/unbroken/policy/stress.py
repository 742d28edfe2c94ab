"""Judging an online stress test: every rank's result in, a verdict per device and link out.

Pure: no clock, no I/O. The manager (:mod:`unbroken.manager.stress`) gathers the ranks'
:class:`~unbroken.protocol.stress.RankStressResult` and calls :func:`judge`; the verdict's
codes are the seed's (:class:`~unbroken.protocol.stress.StressCode`):

- **device** (``aic``): ``0`` when the rank's checksum equals the one it computed at its
  start *and* the one most ranks computed now; ``2`` (isolate) when it differs from either
  (a device that computes wrong); ``3`` when the rank gave no result in time; ``1`` when the
  check could not run (an error other than a wrong result: training can resume).
- **link** (``p2p``): each link's bandwidth is the lower of its two ends' measures; a link
  below ``slow_fraction`` of the median of all links is *slow*. A rank all of whose links
  (at least two) are slow or failed is the culprit: ``2`` for the rank (its node's network).
  A slow link whose two ranks have other, healthy links is flagged ``1``: reported, training
  resumes, nothing is isolated, since the link cannot be pinned on one end.

The ranks with a ``2`` on either check are :attr:`StressVerdict.faulty`; any ``3``
(:attr:`StressVerdict.timed_out`) means the test itself could not finish.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from statistics import median

from unbroken.protocol.stress import RankStressResult, StressCode, link_rounds

#: A link slower than this fraction of the median link is flagged.
SLOW_FRACTION = 0.5


@dataclass(frozen=True)
class LinkVerdict:
    """One link: its two ranks, its bandwidth (the lower end's measure), its code and why."""

    a: int
    b: int
    gbps: float
    code: StressCode
    reason: str = ""


@dataclass(frozen=True)
class RankVerdict:
    """One rank: the device check's code and the link check's code (its links taken
    together), with why."""

    rank: int
    device: StressCode
    link: StressCode
    reason: str = ""

    @property
    def code(self) -> StressCode:
        return max(self.device, self.link)


@dataclass(frozen=True)
class StressVerdict:
    ranks: tuple[RankVerdict, ...]
    links: tuple[LinkVerdict, ...]
    median_gbps: float

    @property
    def faulty(self) -> tuple[RankVerdict, ...]:
        return tuple(r for r in self.ranks if r.code is StressCode.FAULT)

    @property
    def timed_out(self) -> tuple[int, ...]:
        return tuple(r.rank for r in self.ranks if r.code is StressCode.TIMEOUT)

    @property
    def code(self) -> StressCode:
        """The test's overall code: the worst of its ranks' and links'."""
        codes = [r.code for r in self.ranks] + [link.code for link in self.links]
        return max(codes, default=StressCode.OK)


def judge(
    results: Mapping[int, RankStressResult],
    world_size: int,
    slow_fraction: float = SLOW_FRACTION,
) -> StressVerdict:
    """The verdict on ``results`` (rank -> result; a rank missing gave none in time)."""
    majority = _majority_checksum(results.values())
    links = _links(results, world_size, slow_fraction)
    measured = [link.gbps for link in links if link.gbps > 0]
    ranks: list[RankVerdict] = []
    for rank in range(world_size):
        res = results.get(rank)
        if res is None:
            ranks.append(
                RankVerdict(rank, StressCode.TIMEOUT, StressCode.TIMEOUT, "no result in time")
            )
            continue
        device, why = _device(res, majority)
        link, link_why = _rank_links(rank, links)
        ranks.append(RankVerdict(rank, device, link, "; ".join(w for w in (why, link_why) if w)))
    return StressVerdict(
        ranks=tuple(ranks),
        links=tuple(links),
        median_gbps=median(measured) if measured else 0.0,
    )


def _majority_checksum(results: Iterable[RankStressResult]) -> str:
    counts = Counter(r.checksum for r in results if r.checksum)
    if not counts:
        return ""
    (best, n), *rest = counts.most_common()
    return best if not rest or rest[0][1] < n else ""  # a tie names no majority


def _device(res: RankStressResult, majority: str) -> tuple[StressCode, str]:
    if not res.checksum:
        return StressCode.FAILED, f"device check did not run: {res.error or 'no checksum'}"
    if res.checksum != res.expected:
        return StressCode.FAULT, (
            f"device checksum {res.checksum} differs from {res.expected} computed at start"
        )
    if majority and res.checksum != majority:
        return StressCode.FAULT, f"device checksum {res.checksum} differs from the other ranks'"
    return StressCode.OK, ""


def _links(
    results: Mapping[int, RankStressResult], world_size: int, slow_fraction: float
) -> list[LinkVerdict]:
    pairs = [p for round_ in link_rounds(world_size) for p in round_]
    measured: dict[tuple[int, int], float] = {}
    failed: dict[tuple[int, int], str] = {}
    for a, b in pairs:
        ends = []
        for me, peer in ((a, b), (b, a)):
            res = results.get(me)
            m = next((m for m in res.links if m.peer == peer), None) if res else None
            if m is None or m.error or m.gbps <= 0:
                failed[(a, b)] = (
                    m.error if m is not None and m.error else f"rank {me} measured nothing"
                )
                break
            ends.append(m.gbps)
        else:
            measured[(a, b)] = min(ends)
    mid = median(measured.values()) if measured else 0.0
    out = []
    for a, b in pairs:
        if (a, b) in failed:
            out.append(LinkVerdict(a, b, 0.0, StressCode.FAILED, failed[(a, b)]))
            continue
        gbps = measured[(a, b)]
        if mid > 0 and gbps < slow_fraction * mid:
            out.append(
                LinkVerdict(
                    a, b, gbps, StressCode.FAILED, f"{gbps:.2f} GB/s < {slow_fraction:g} x median"
                )
            )
        else:
            out.append(LinkVerdict(a, b, gbps, StressCode.OK))
    return out


def _rank_links(rank: int, links: Sequence[LinkVerdict]) -> tuple[StressCode, str]:
    mine = [link for link in links if rank in (link.a, link.b)]
    bad = [link for link in mine if link.code is not StressCode.OK]
    if not bad:
        return StressCode.OK, ""
    names = ", ".join(f"{link.a}-{link.b}" for link in bad)
    if len(mine) >= 2 and len(bad) == len(mine):
        return StressCode.FAULT, f"every link of the rank is slow or failed ({names})"
    return StressCode.FAILED, f"slow or failed link(s) {names}"
