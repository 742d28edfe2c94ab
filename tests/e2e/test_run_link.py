"""``unbroken run`` with a real link fault: the kernel resets rank 2's TCP links to its peers
(``ss -K``) before its step 20. With op retry on for L1 the ranks re-execute the failed
gradient all-reduce over a new group and no recovery happens; with op retry off the failed
collective is a link fault, which ``retry`` recovers online in the same processes. Either way
no step is trained twice and the final model is the fault-free one, bit for bit."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest
from tests.support.cli_runs import (
    FIXTURES,
    Reference,
    digest,
    events,
    of_kind,
    run_job,
    write_job,
)
from tests.support.process_helpers import rank_pids, recomputed_steps, split_at_fault, started_ranks

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        shutil.which("ss") is None or os.geteuid() != 0,
        reason="a link fault needs ss and root (to reset another process's sockets)",
    ),
]

LINK = FIXTURES / "chaos-link.yaml"
LINK_MID = FIXTURES / "chaos-link-mid.yaml"  # between checkpoints


def test_a_link_fault_is_re_executed_by_op_retry_without_recovery(
    run_dir: Path, fault_free: Reference
) -> None:
    res = run_job(run_dir, "--chaos", LINK, job=FIXTURES / "job-opretry.yaml")
    assert res.rc == 0, res.explain()
    assert "job e2e-mlp: SUCCEEDED" in res.stdout, res.explain()
    assert "step 60/60; 0 fault(s), 0 recovery(ies)" in res.stdout, res.explain()
    assert digest(run_dir) == fault_free.digest

    evs = events(run_dir)
    retried = of_kind(evs, "OpRetry")
    # Every rank took part in the failed all-reduce of step 20 and re-executed it once.
    assert sorted(e["rank"] for e in retried) == [0, 1, 2, 3], retried
    assert {(e["step"], e["level"]) for e in retried} == {(20, 1)}, retried
    assert not of_kind(evs, "FaultDetected") and not of_kind(evs, "DecisionMade")
    assert started_ranks(evs) == [0, 1, 2, 3]  # no process was started again
    # HoldTime:1500: every rank waited 1.5 s before re-executing (a rebuild alone takes
    # well under that here), as each rank's log says.
    logs = sorted(run_dir.glob("pods/*/logs/rank*.log"))
    after = [
        float(m.group(1))
        for log in logs
        for m in re.finditer(r"re-executed \(op retry 1/3, L1\) ([0-9.]+) s after", log.read_text())
    ]
    assert len(after) == 4 and all(s >= 1.5 for s in after), after


def test_a_flapping_link_is_re_executed_after_hold_time_and_interval_time(
    run_dir: Path, fault_free: Reference, tmp_path: Path
) -> None:
    """The link fails again on the first re-execution: every rank's attempt 1 fails, attempt 2
    succeeds, ``HoldTime`` (0.5 s) after the failure and ``IntervalTime`` (1 s) after attempt 1,
    and still no recovery happens."""
    params = "MaxCnt:3, HoldTime:1500, IntervalTime:100"
    job = write_job(
        tmp_path / "job.yaml",
        job=FIXTURES / "job-opretry.yaml",
        replace={params: "MaxCnt:3, HoldTime:500, IntervalTime:1000"},
    )
    res = run_job(run_dir, "--chaos", FIXTURES / "chaos-link-flap.yaml", job=job)
    assert res.rc == 0, res.explain()
    assert "step 60/60; 0 fault(s), 0 recovery(ies)" in res.stdout, res.explain()
    assert digest(run_dir) == fault_free.digest
    evs = events(run_dir)
    retried = of_kind(evs, "OpRetry")
    assert sorted(e["rank"] for e in retried) == [0, 1, 2, 3], retried
    assert {(e["step"], e["attempt"]) for e in retried} == {(20, 2)}, retried
    assert started_ranks(evs) == [0, 1, 2, 3]
    logs = [log.read_text() for log in sorted(run_dir.glob("pods/*/logs/rank*.log"))]
    assert all("op retry 1/3 of step 20 failed" in log for log in logs), logs
    after = [
        float(m.group(1))
        for log in logs
        for m in re.finditer(r"re-executed \(op retry 2/3, L1\) ([0-9.]+) s after", log)
    ]
    # Held 0.5 s before attempt 1, then 1 s between attempts: at least 1.5 s in all.
    assert len(after) == 4 and all(s >= 1.5 for s in after), after


def test_a_link_fault_without_op_retry_is_retried_online(
    run_dir: Path, fault_free: Reference
) -> None:
    res = run_job(run_dir, "--chaos", LINK_MID, job=FIXTURES / "process-retry.yaml")
    assert res.rc == 0, res.explain()
    assert "step 60/60; 1 fault(s), 1 recovery(ies)" in res.stdout, res.explain()
    assert digest(run_dir) == fault_free.digest

    evs = events(run_dir)
    before, after = split_at_fault(evs)
    fault, decision = after[0], after[1]
    assert fault["source"] == "link" and fault["code"] == "collective-failed", fault
    assert fault["step"] == 25 and "no peer was lost" in fault["detail"], fault
    assert decision["strategy"] == "retry", decision
    assert decision["commands"][0].startswith("RetryOnline("), decision
    assert of_kind(after, "RecoveryCompleted", strategy="retry"), after
    assert recomputed_steps(run_dir) == 0
    assert started_ranks(after) == [], of_kind(after, "ProcessesStarted")
    assert rank_pids(evs) == rank_pids(before)
