"""Reading a process-level recovery back from a run's ledger and status: which processes each
rank ran in, which ranks were started again, and the one incident of a run.

Like :mod:`tests.support.cli_runs`, nothing here imports the package: the events and the
status are the ``unbroken events --json`` and ``unbroken status --json`` records.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from tests.support.cli_runs import of_kind, unbroken


def the_incident(evs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The events from the only fault to its recovery; fails unless there was exactly one
    fault and it was recovered."""
    faults = of_kind(evs, "FaultDetected")
    assert len(faults) == 1, f"expected one fault, got {faults}"
    ids = [e["id"] for e in evs]
    first = ids.index(faults[0]["id"])
    done = of_kind(evs, "RecoveryCompleted", fault_id=faults[0]["fault_id"])
    assert done, f"the fault was not recovered: {[e['kind'] for e in evs[first:]]}"
    return evs[first : ids.index(done[0]["id"]) + 1]


def split_at_fault(evs: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The events before the only fault, and the events from it on."""
    faults = of_kind(evs, "FaultDetected")
    assert len(faults) == 1, f"expected one fault, got {faults}"
    at = next(i for i, e in enumerate(evs) if e["id"] == faults[0]["id"])
    return evs[:at], evs[at:]


def rank_pids(evs: Iterable[Mapping[str, Any]]) -> dict[int, int]:
    """Each rank's process as the ``ProcessesStarted`` events among ``evs`` leave it (a later
    start of a rank replaces its earlier one)."""
    pids: dict[int, int] = {}
    for e in of_kind(evs, "ProcessesStarted"):
        assert len(e["ranks"]) == len(e["pids"]), e
        pids.update(zip(e["ranks"], e["pids"], strict=True))
    return pids


def started_ranks(evs: Iterable[Mapping[str, Any]]) -> list[int]:
    """The ranks that ``ProcessesStarted`` events among ``evs`` name, sorted, with repeats."""
    return sorted(r for e in of_kind(evs, "ProcessesStarted") for r in e["ranks"])


def status_rank_pids(st: Mapping[str, Any]) -> dict[int, int]:
    """Each rank's process as ``unbroken status --json`` reports it."""
    pids: dict[int, int] = {}
    for pod in st["pods"]:
        pids.update(zip(pod["ranks"], pod["pids"], strict=True))
    return pids


def recomputed_steps(run_dir: Path) -> int:
    """The steps the only incident of the run trained twice (``unbroken events --incidents``)."""
    res = unbroken("events", run_dir, "--incidents")
    assert res.rc == 0, res.explain()
    found = re.findall(r"^\s+recomputed\s+(\d+) steps$", res.stdout, re.MULTILINE)
    assert len(found) == 1, res.stdout
    return int(found[0])
