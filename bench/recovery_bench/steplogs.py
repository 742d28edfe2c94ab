"""Reading the ranks' step logs: each training process's committed steps, and from them the
fault, the recovery and its phases."""

from __future__ import annotations

import itertools
import re
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recovery_bench.configs import PER_POD, VICTIM, WORLD


@dataclass(frozen=True)
class Incarnation:
    """One training process: its rank and its step log lines."""

    rank: int
    pid: int
    began_at: float  # the script ran (torch imported)
    started_at: float | None  # the training loop began (state restored); None: never
    start_step: int
    done: tuple[tuple[float, int], ...]  # (when, steps committed)
    killed_at: float | None
    redone: int = 0  # "done" lines dropped: the step's body ran, then the step was redone
    redo_from: int | None = None  # the lowest step this process went back to and redid


def committed_lines(
    lines: Iterable[tuple[float, int]],
) -> tuple[list[tuple[float, int]], int, int | None]:
    """The ``done`` lines of committed steps, how many were dropped, the lowest step redone.

    The step log writes ``done n`` when the body of step ``n - 1`` returns; the session commits
    the step right after, unless the step failed (a peer died inside its collectives, its own
    state is corrupt) and the rank recovered in process: then it yields the same step again
    and its ``done n`` repeats. A line followed by one with the same or a lower count was not
    committed; the later line's step was redone."""
    kept: list[tuple[float, int]] = []
    dropped = 0
    redo_from: int | None = None
    for when, n in lines:
        if kept and kept[-1][1] >= n:
            redo_from = n - 1 if redo_from is None else min(redo_from, n - 1)
        while kept and kept[-1][1] >= n:
            kept.pop()
            dropped += 1
        kept.append((when, n))
    return kept, dropped, redo_from


def read_steplogs(log_dir: Path) -> list[Incarnation]:
    found = []
    for path in sorted(log_dir.glob("rank*-*.log")):
        m = re.fullmatch(r"rank(\d+)-(\d+)\.log", path.name)
        if m is None:
            continue
        marks: dict[str, tuple[float, int]] = {}
        done: list[tuple[float, int]] = []
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) != 3 or not parts[2].isdigit():
                continue  # a line cut short by the kill
            when, kind, value = float(parts[0]), parts[1], int(parts[2])
            if kind == "done":
                done.append((when, value))
            else:
                marks.setdefault(kind, (when, value))
        if "begin" not in marks:
            continue
        start = marks.get("start")
        committed, redone, redo_from = committed_lines(done)
        found.append(
            Incarnation(
                rank=int(m[1]),
                pid=int(m[2]),
                began_at=marks["begin"][0],
                started_at=start[0] if start else None,
                start_step=start[1] if start else 0,
                done=tuple(committed),
                killed_at=marks["kill"][0] if "kill" in marks else None,
                redone=redone,
                redo_from=redo_from,
            )
        )
    return found


def fault_time(incs: Iterable[Incarnation], kill_step: int) -> float | None:
    """When the victim committed the kill step (the kill itself follows within microseconds)."""
    times = []
    for inc in incs:
        if inc.rank != VICTIM:
            continue
        if inc.killed_at is not None:
            return inc.killed_at
        times += [t for t, n in inc.done if n == kill_step]
    return min(times) if times else None


@dataclass(frozen=True)
class Recovery:
    restart_rounds: int  # processes started per rank after the fault (the most of any rank)
    resumed_from: int | None  # the step the new processes started at, or the kept ones redid
    new_ranks: tuple[int, ...]  # ranks given a new process after the fault
    kept_ranks: tuple[int, ...]  # ranks whose process from before the fault trained on
    began_s: float | None  # fault -> every rank without a surviving process runs the script
    loop_s: float | None  # fault -> ... and is in its training loop (state restored)
    mttr_s: float | None  # fault -> every rank committed a step


def _every(ranks: Iterable[int], at: dict[int, float], fault_at: float) -> float | None:
    """fault -> the last of ``ranks`` to reach ``at``; None if one never did or none need to."""
    wanted = list(ranks)
    if not wanted or any(r not in at for r in wanted):
        return None
    return max(at[r] for r in wanted) - fault_at


def recovery(incs: Sequence[Incarnation], fault_at: float, kill_step: int) -> Recovery:
    """MTTR: fault -> every rank committed a step after the fault. A rank given a new process
    counts that process's first step (its old one's lines after the fault are ignored); a rank
    that kept its process counts that process's first committed step past the kill step."""
    after = [i for i in incs if i.began_at > fault_at]
    new = {i.rank for i in after}
    began: dict[int, float] = {}
    loop: dict[int, float] = {}
    first: dict[int, float] = {}
    for inc in after:
        began[inc.rank] = min(began.get(inc.rank, inc.began_at), inc.began_at)
        if inc.started_at is not None:
            loop[inc.rank] = min(loop.get(inc.rank, inc.started_at), inc.started_at)
    for inc in incs:
        restarted = inc.began_at > fault_at
        if inc.rank in new and not restarted:
            continue
        for when, n in inc.done:
            if when > fault_at and (restarted or n > kill_step):
                first[inc.rank] = min(first.get(inc.rank, when), when)
                break
    kept = sorted(r for r in first if r not in new)
    needed = [r for r in range(WORLD) if r not in kept]
    rounds = max((sum(1 for i in after if i.rank == r) for r in range(WORLD)), default=0)
    starts = [i.start_step for i in after if i.done]
    starts += [
        i.redo_from
        for i in incs
        if i.rank in kept and i.began_at <= fault_at and i.redo_from is not None
    ]
    resumed = min(starts, default=None)
    return Recovery(
        restart_rounds=rounds,
        resumed_from=resumed,
        new_ranks=tuple(sorted(new)),
        kept_ranks=tuple(kept),
        began_s=_every(needed, began, fault_at),
        loop_s=_every(needed, loop, fault_at),
        mttr_s=_every(range(WORLD), first, fault_at),
    )


def step_ms(incs: Iterable[Incarnation], before: float | None) -> float | None:
    times = [
        t for inc in incs if inc.rank == 0 for t, _ in inc.done if before is None or t < before
    ]
    times.sort()
    gaps = [b - a for a, b in itertools.pairwise(times)]
    return statistics.median(gaps) * 1000 if gaps else None


def shrunk_mttr(incs: Sequence[Incarnation], fault_at: float, kill_step: int) -> float | None:
    """Fault -> every rank outside the victim's pod committed a step past the kill step in the
    process it had before the fault: the job trains on at its smaller size (the elastic
    configuration's scale-in, detection included). None until they all have."""
    survivors = [r for r in range(WORLD) if r // PER_POD != VICTIM // PER_POD]
    first: dict[int, float] = {}
    for inc in incs:
        if inc.rank not in survivors or inc.began_at > fault_at:
            continue
        after = [when for when, n in inc.done if when > fault_at and n > kill_step]
        if after:
            first[inc.rank] = min(first.get(inc.rank, after[0]), after[0])
    return _every(survivors, first, fault_at)


@dataclass(frozen=True)
class ElasticFigures:
    """The elastic configuration's run: its changes of world size (the ledger's ``ScaledIn``
    and ``ScaledOut``) and rank 0's median step time at each size (step logs)."""

    scaled_in: bool
    scaled_out: bool
    shrunk_size: int | None
    scale_in_s: float | None  # ScaledIn.took_s: the decision -> the first step at the smaller size
    scale_out_s: float | None  # ScaledOut.took_s: the pause -> the first step at full size
    shrunk_step_ms: float | None  # median step of rank 0 while scaled in
    full_step_ms: float | None  # median step of rank 0 at full size (before the fault, after)
    shrunk_steps: int  # steps committed while scaled in


def _median_gap_ms(times: Sequence[float]) -> float | None:
    gaps = [b - a for a, b in itertools.pairwise(sorted(times))]
    return statistics.median(gaps) * 1000 if gaps else None


def elastic_figures(
    incs: Iterable[Incarnation], fault_at: float, ledger: dict[str, Any]
) -> ElasticFigures:
    """Rank 0's steps split by world size: full before the fault, scaled in from the first
    step at the smaller size (``ScaledIn.at``) to the pause before scaling out
    (``ScaledOut.at - took_s``), full again from the first step of the whole world."""
    ins = ledger.get("ScaledIn") or []
    outs = ledger.get("ScaledOut") or []
    done = sorted((t, n) for inc in incs if inc.rank == 0 for t, n in inc.done)
    shrunk: list[float] = []
    if ins:
        paused_at = outs[0]["at"] - outs[0]["took_s"] if outs else float("inf")
        shrunk = [t for t, _ in done if ins[0]["at"] <= t <= paused_at]
    before = [t for t, _ in done if t <= fault_at]
    after = [t for t, _ in done if outs and t >= outs[0]["at"]]
    full = [g for part in (before, after) for g in itertools.pairwise(part)]
    return ElasticFigures(
        scaled_in=bool(ins),
        scaled_out=bool(outs),
        shrunk_size=ins[0]["world_size"] if ins else None,
        scale_in_s=ins[0]["took_s"] if ins else None,
        scale_out_s=outs[0]["took_s"] if outs else None,
        shrunk_step_ms=_median_gap_ms(shrunk),
        full_step_ms=statistics.median(b - a for a, b in full) * 1000 if full else None,
        shrunk_steps=len(shrunk),
    )
