"""The GPU check's jobs and faults (bench/gpu_check.py) are ones ``unbroken run`` takes: each
case's job is the example job with the device and the case's ladder, each fault a valid chaos
entry for it. Nothing runs."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

BENCH = Path(__file__).resolve().parents[3] / "bench"
sys.path.insert(0, str(BENCH))

import gpu_check  # noqa: E402

from unbroken.chaos import parse_chaos  # noqa: E402
from unbroken.spec import load_job  # noqa: E402

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("case", gpu_check.CASES, ids=lambda c: c.name)
@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_each_case_is_a_job_and_a_fault_unbroken_run_takes(
    tmp_path: Path, case: gpu_check.Case, device: str
) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(gpu_check.job_yaml(device, case.strategy))
    job = load_job(path)
    assert (job.world_size, job.nodes) == (4, 2)
    strategies = [str(s) for s in job.fault_handling.strategies]
    assert strategies == [*case.strategy.split(","), "exit"]  # exit: always the last rung
    text = path.read_text()
    assert text.count(f"--device={device}") == 2 and text.count("--steps=60") == 2, text
    if case.chaos:
        entries = yaml.safe_load(f"faults:\n  - {case.chaos}\n")["faults"]
        pods = ["gpt-master-0", "gpt-worker-0"]
        (fault,) = parse_chaos(entries, "chaos.yaml", 4, pods, ["node-0", "node-1", "node-2"])
        assert fault.index == 0


def test_the_table_says_each_case_s_rung_mttr_and_equality() -> None:
    rows = gpu_check.table(
        [
            gpu_check.Outcome(
                "SIGKILL rank 3", 0, 8.0, "signal:SIGKILL", "recover-in-place", 0.35, "", True
            ),
            gpu_check.Outcome("node-1 lost", 1, 9.0, detail="failed"),
        ]
    ).splitlines()
    assert rows[2].startswith("| SIGKILL rank 3 | signal:SIGKILL | recover-in-place | 0.35 s |")
    assert "| - (failed) |" in rows[3]
