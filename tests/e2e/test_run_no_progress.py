"""Faults that recur at the same place with no step committed in between: the job backs off
and ends with the reason after ``no-progress-restarts`` of them, instead of restarting its
ranks several times a second for ``max_restarts`` rounds while the ledger grows; and
``max_restarts`` itself bounds each pod's in-place restarts."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.support.cli_runs import events, of_kind, run_job, write_job
from tests.support.disks import tmpfs

pytestmark = pytest.mark.e2e

#: The annotation that bounds the faults in a row without progress (default 8).
NO_PROGRESS_3 = {
    'pod-rescheduling: "on"\n': 'pod-rescheduling: "on"\n'
    "  annotations:\n"
    '    no-progress-restarts: "3"\n'
}


def test_script_that_raises_at_import_fails_the_job_with_the_reason(
    tmp_path: Path, run_dir: Path
) -> None:
    script = tmp_path / "broken_train.py"
    script.write_text('raise RuntimeError("the dataset is missing")\n')
    job = write_job(tmp_path / "job.yaml", replace=NO_PROGRESS_3, script=script)
    res = run_job(run_dir, job=job, timeout_s=120.0)
    assert res.rc == 1, res.explain()
    assert "Traceback" not in res.stderr, res.explain()
    reason = "no progress: 4 faults in a row with no step committed at all (no-progress-restarts 3)"
    assert reason in res.stdout + res.stderr, res.explain()
    evs = events(run_dir)
    (failed,) = of_kind(evs, "JobFailed")
    assert reason in failed["reason"]
    assert "RuntimeError" in failed["reason"]
    # Bounded: a few rounds (each rank of a round may report its fault), backed off, and a
    # ledger of kilobytes, not the megabytes of 32767 rounds.
    assert len(of_kind(evs, "FaultDetected")) <= 16, res.explain()
    assert any("backing off" in e.get("reason", "") for e in of_kind(evs, "DecisionMade"))
    assert (run_dir / "ledger.db").stat().st_size < 256 * 1024


def test_in_pod_restarts_stop_at_max_restarts(tmp_path: Path, run_dir: Path) -> None:
    """``--max_restarts=2`` on the launcher (the seed sets 32767 for process-level recovery):
    a pod's ranks are restarted in place at most twice, and the job fails saying which pod's
    restarts are spent (no rescheduling for software faults: fault-retry-times is 0)."""
    script = tmp_path / "broken_train.py"
    script.write_text('raise RuntimeError("the dataset is missing")\n')
    monitor = "                - --monitor_interval=1\n"
    replace = {monitor: f"{monitor}                - --max_restarts=2\n"}
    job = write_job(tmp_path / "job.yaml", replace=replace, script=script)
    res = run_job(run_dir, job=job, timeout_s=120.0)
    assert res.rc == 1, res.explain()
    evs = events(run_dir)
    (failed,) = of_kind(evs, "JobFailed")
    # Which pods are named depends on which faults came first: at least one, each spent.
    spent = re.search(r"in-pod restarts spent on pod (.+) \(max_restarts 2\)", failed["reason"])
    assert spent is not None, failed
    restarts = [c for e in of_kind(evs, "DecisionMade") for c in e["commands"]]
    counts = {
        pod: sum(c.startswith(f"RestartProcesses(pod='{pod}'") for c in restarts)
        for pod in ("e2e-mlp-master-0", "e2e-mlp-worker-0")
    }
    assert all(n <= 2 for n in counts.values()), restarts
    assert all(counts[pod] == 2 for pod in spent.group(1).split(", ")), (spent, restarts)
    assert restarts[-1].startswith("FailJob("), restarts


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    """A 16 KiB tmpfs: too small for one checkpoint of the e2e job's model."""
    with tmpfs(tmp_path / "tiny", "size=16k,mode=0700") as mount:
        yield mount


def test_full_checkpoint_disk_ends_the_job_instead_of_recovering_forever(
    tmp_path: Path, run_dir: Path, tiny_disk: Path
) -> None:
    replace = {
        'pod-rescheduling: "on"\n': 'pod-rescheduling: "on"\n'
        "  annotations:\n"
        '    no-progress-restarts: "2"\n',
        "--ckpt-dir=checkpoints": f"--ckpt-dir={tiny_disk}",
    }
    job = write_job(tmp_path / "job.yaml", replace=replace)
    res = run_job(run_dir, job=job, timeout_s=240.0)
    assert res.rc == 1, res.explain()
    evs = events(run_dir)
    (failed,) = of_kind(evs, "JobFailed")
    assert "no progress: 3 faults in a row with no step committed beyond step" in failed["reason"]
    assert "No space left on device" in failed["reason"], failed["reason"]
    assert len(of_kind(evs, "RecoveryCompleted")) <= 3, res.explain()
    assert not of_kind(evs, "JobSucceeded")
