"""What the seed forbids, refused by ``unbroken run`` itself: each combination the seed rules
out (or says must come together) stops the run before anything starts, with one line per
offending place that names the file, its line, the field, and the seed's reason. Nothing is
made (no run directory) and nothing is left running."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.support.cli_runs import FIXTURES, JOB, processes_of, unbroken, write_job

pytestmark = pytest.mark.e2e

RECOVER = FIXTURES / "process-recover.yaml"
IN_PLACE = FIXTURES / "process-recover-in-place.yaml"
ASCEND = "            - name: ascend\n"
SCRIPT = "                - --step-sleep=0.02\n"


def env(name: str, value: str) -> dict[str, str]:
    """``name=value`` in the environment of every container of the job."""
    pad = " " * 14
    return {ASCEND: f'{ASCEND}{pad}env:\n{pad}  - name: {name}\n{pad}    value: "{value}"\n'}


def script_flag(flag: str) -> dict[str, str]:
    """``flag`` among the training script's arguments, in every container's command."""
    return {SCRIPT: f"{SCRIPT}                - {flag}\n"}


# (id, the job the change is made to, the change, the field named, the seed's reason)
REFUSED = [
    (
        "force-with-host-network",
        JOB,
        {
            'fault-scheduling: "grace"': 'fault-scheduling: "force"',
            "      template:\n        spec:\n": (
                "      template:\n        spec:\n          hostNetwork: true\n"
            ),
        },
        "spec.replicaSpecs.Master.template.spec.hostNetwork",
        "fault-scheduling 'force' cannot be used with hostNetwork: true",
    ),
    (
        "worker-reboot-without-high-availability",
        RECOVER,
        script_flag("--enable-worker-reboot"),
        "spec.replicaSpecs.Master.template.spec.containers[0].command",
        "--enable-worker-reboot without --enable-high-availability: it must be enabled together "
        "with --enable-high-availability",
    ),
    (
        "hbmfault-repair-without-high-availability",
        RECOVER,
        script_flag("--enable-hbmfault-repair"),
        "spec.replicaSpecs.Master.template.spec.containers[0].command",
        "--enable-hbmfault-repair without --enable-high-availability: it must be enabled "
        "together with --enable-high-availability",
    ),
    (
        "watchdog-with-a-rung",
        RECOVER,
        env("HCCL_ASYNC_ERROR_HANDLING", "1"),
        "spec.replicaSpecs.Master.template.spec.containers[0].env[HCCL_ASYNC_ERROR_HANDLING]",
        "HCCL_ASYNC_ERROR_HANDLING=1 makes the collective watchdog abort the process",
    ),
    (
        "taskd-off-with-a-rung",
        RECOVER,
        env("TASKD_PROCESS_ENABLE", "off"),
        "spec.replicaSpecs.Master.template.spec.containers[0].env[TASKD_PROCESS_ENABLE]",
        "TASKD_PROCESS_ENABLE=off contradicts recover-strategy",
    ),
    (
        "process-recover-off-with-recover",
        RECOVER,
        env("PROCESS_RECOVER", "off"),
        "spec.replicaSpecs.Master.template.spec.containers[0].env[PROCESS_RECOVER]",
        "contradicts the job's recover-strategy: for it the operator sets PROCESS_RECOVER=on",
    ),
    (
        "restart-fault-process-off-with-recover-in-place",
        IN_PLACE,
        env("ENABLE_RESTART_FAULT_PROCESS", "off"),
        "spec.replicaSpecs.Master.template.spec.containers[0].env[ENABLE_RESTART_FAULT_PROCESS]",
        "contradicts the job's recover-strategy: for it the operator sets "
        "ENABLE_RESTART_FAULT_PROCESS=on",
    ),
    (
        "op-retry-max-count-out-of-range",
        RECOVER,
        env("HCCL_OP_RETRY_PARAMS", "MaxCnt:30"),
        "spec.replicaSpecs.Master.template.spec.containers[0].env[HCCL_OP_RETRY_PARAMS]",
        "HCCL_OP_RETRY_PARAMS MaxCnt is 30, out of range: got 'MaxCnt:30'; allowed: MaxCnt 1-10",
    ),
]


def _refused(tmp_path: Path, job: Path, *extra: str | Path) -> list[str]:
    """``unbroken run`` of ``job``: refused (exit 1), nothing on stdout, no traceback, no run
    directory, no process; the lines on stderr."""
    run_dir = tmp_path / "run"
    before = job.read_bytes()
    res = unbroken("run", job, "--run-dir", run_dir, "--quiet", *extra)
    assert res.rc == 1 and res.stdout == "", res.explain()
    assert "Traceback" not in res.stderr, res.explain()
    assert not run_dir.exists(), "a run directory was made for a job that cannot run"
    assert not processes_of(run_dir)
    assert job.read_bytes() == before
    return res.stderr.splitlines()


def _line_of(path: Path, text: str, after: str = "") -> int:
    lines = path.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if after in line) if after else 0
    return next(i for i, line in enumerate(lines[start:], start + 1) if text in line)


@pytest.mark.parametrize(
    ("base", "change", "field", "reason"),
    [pytest.param(*row[1:], id=row[0]) for row in REFUSED],
)
def test_a_combination_the_seed_forbids_is_refused_by_unbroken_run(
    tmp_path: Path, base: Path, change: dict[str, str], field: str, reason: str
) -> None:
    job = write_job(tmp_path / "job.yaml", job=base, replace=change)
    lines = _refused(tmp_path, job)
    [first] = [line for line in lines if line.startswith(f"{job}:") and f": {field}: " in line]
    number = int(first.split(":")[1])
    assert 1 <= number <= len(job.read_text().splitlines()), first
    assert reason in first, lines


def test_graceful_fault_tolerance_with_process_recovery_is_refused_by_unbroken_run(
    tmp_path: Path,
) -> None:
    """``hotReset: 1`` (graceful fault tolerance) in the cluster YAML beside a job with a
    process-level rung: "cannot be enabled simultaneously", refused rather than left to fall
    back to job-level rescheduling as the reference would."""
    job = write_job(tmp_path / "job.yaml", job=RECOVER)
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text("nodes: 3\ndevicesPerNode: 2\ndevicePlugin:\n  hotReset: 1\n")
    lines = _refused(tmp_path, job, "--cluster", cluster)
    line = _line_of(job, "recover-strategy")
    assert lines == [
        f"{cluster}:4: devicePlugin.hotReset: graceful fault tolerance (hotReset=1) cannot be "
        f"combined with process-level recovery (recover-strategy in {job}:{line}); the "
        "reference would silently fall back to job-level rescheduling: got 1; allowed: -1, or 2 "
        "(offline reset, made for process-level recovery)"
    ], lines
