"""``unbroken validate`` and ``unbroken plan``: exit codes and messages, in process and as a real
subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from unbroken.cli import main

pytestmark = pytest.mark.unit

SEED = Path(__file__).resolve().parents[2] / "fixtures" / "seed"
GOOD = SEED / "process-recover.yaml"


def bad_job(tmp_path: Path) -> Path:
    text = (
        GOOD.read_text()
        .replace('"recover"', '"recover,bogus"')
        .replace(
            'fault-scheduling: "grace"', 'fault-scheduling: "grace"\n    fault-retry-times: "-1"'
        )
    )
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    return path


def test_validate_ok(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(GOOD), str(SEED / "last-words-vcjob.yaml")]) == 0
    out, err = capsys.readouterr()
    assert (
        out == f"{GOOD}: valid (0 warnings)\n{SEED / 'last-words-vcjob.yaml'}: valid (0 warnings)\n"
    )
    assert err == ""


def test_validate_reports_every_error_of_every_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = bad_job(tmp_path)
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert main(["validate", str(bad), str(GOOD), str(empty)]) == 1
    out, err = capsys.readouterr()
    assert out == f"{GOOD}: valid (0 warnings)\n"
    assert err.splitlines() == [
        f"{bad}:8: metadata.labels.fault-retry-times: fault-retry-times is out of range: got "
        "'-1'; allowed: >= 0",
        f"{bad}:10: metadata.annotations.recover-strategy: unknown recovery strategy: got "
        "'bogus'; allowed: retry, recover-in-place, recover, elastic-training, dump, exit",
        f"{empty}: the file is empty",
    ]


def test_validate_with_a_cluster(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text("devicePlugin:\n  hotReset: 1\n")
    assert main(["validate", str(GOOD), "--cluster", str(cluster)]) == 1
    _, err = capsys.readouterr()
    assert "graceful fault tolerance (hotReset=1) cannot be combined with process-level" in err
    job_level = SEED / "job-rescheduling.yaml"
    assert main(["validate", str(job_level), "--cluster", str(cluster)]) == 0
    out, err = capsys.readouterr()
    assert out == f"{job_level}: valid (1 warning)\n"
    assert err.startswith(f"warning: {cluster}:2: devicePlugin.hotReset: hotReset=1")


def test_validate_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["validate"])
    assert exit_.value.code == 2
    assert "the following arguments are required: FILE" in capsys.readouterr().err


def test_plan_text(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(SEED / "last-words-vcjob.yaml")]) == 0
    out = capsys.readouterr().out
    assert "recovery ladder (tried in this order):" in out
    assert "  1. retry\n  2. recover  (waits 120 s for the replacement pod)\n  3. dump\n" in out
    # Which of them run in process depends on the parallelism the ranks declare when they start.
    assert "  retry, recover, dump: in process only where every rank's state has a replica" in out
    assert (
        "  6. job-rescheduling  (fault-scheduling grace, 600 s grace; fault-retry-times 2)" in out
    )
    assert "  last-words-worker-1  (Worker, node rank 2, 2 devices)" in out
    assert (
        "    launch: torchrun --nproc_per_node=2 --nnodes=3 --node_rank=2 "
        "--master_addr=last-words-master-0 --master_port=29500 --max_restarts=32767 "
        "--monitor_interval=1 train.py --steps=200" in out
    )
    assert "      HCCL_ASYNC_ERROR_HANDLING=0\n" in out
    assert "    ports: 9601/taskd-port, 9602/lastwords-port" in out
    assert "warnings: none" in out


def test_plan_of_a_mindspore_job_says_what_its_rungs_do_and_launches_msrun(
    capsys: pytest.CaptureFixture[str],
) -> None:
    jobs = Path(__file__).resolve().parents[3] / "examples" / "jobs"
    assert main(["plan", str(jobs / "mindspore.yaml")]) == 0
    out = capsys.readouterr().out
    assert "  1. retry\n  2. dump\n  3. exit\n  4. pod-rescheduling" in out
    assert "  retry: MindSpore ranks redo a step whose device memory (UCE) or link (HCCE)" in out
    assert "  dump: when a rank fails, a healthy MindSpore rank (stopped by the restart" in out
    assert "in process only where" not in out  # the PyTorch note is not theirs
    assert (
        "    launch: msrun --worker_num=4 --local_worker_num=2 --node_rank=1 "
        f"--master_addr=ms-gpt-master-0 --master_port=8118 --join=True "
        f"{jobs}/../train_ms_gpt.py --steps=40" in out
    )
    assert "      MS_ENABLE_TFT={TTP:1,UCE:1,HCCE:1,RSC:1}\n" in out


def test_plan_json_and_warnings(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(SEED / "job-rescheduling.yaml"), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["ladder"] == ["exit", "job-rescheduling"]
    assert [p["name"] for p in data["pods"]] == [
        "job-rescheduling-master-0",
        "job-rescheduling-worker-0",
    ]
    assert "fault-retry-times: not set" in data["warnings"][0]


def test_plan_warns_when_hot_switching_cannot_act(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A hotSwitch job on a cluster without a free node: the backup pod has nowhere to run."""
    assert main(["plan", str(SEED / "hot-switch.yaml"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["warnings"] == []
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text("nodes: 2\ndevicesPerNode: 2\n")
    assert main(["plan", str(SEED / "hot-switch.yaml"), "--cluster", str(cluster), "--json"]) == 0
    (warning,) = json.loads(capsys.readouterr().out)["warnings"]
    assert "hotSwitch needs a free node for the backup pod" in warning, warning
    assert "all run the job's 2 pod(s)" in warning, warning


def test_plan_of_a_bad_job_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(bad_job(tmp_path))]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert "unknown recovery strategy: got 'bogus'" in err


def test_validate_as_a_subprocess(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    bad = bad_job(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-m", "unbroken", "validate", str(bad)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert f"{bad}:10: metadata.annotations.recover-strategy: unknown recovery strategy" in (
        proc.stderr
    )
    proc = subprocess.run(
        [sys.executable, "-m", "unbroken", "plan", str(GOOD), "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["ladder"] == ["recover", "exit", "job-rescheduling"]


def test_shipped_example_jobs_are_valid(capsys: pytest.CaptureFixture[str]) -> None:
    jobs = Path(__file__).resolve().parents[3] / "examples" / "jobs"
    assert (
        main(["validate", str(jobs / "recover.yaml"), "--cluster", str(jobs / "cluster.yaml")]) == 0
    )
    assert main(["validate", str(jobs / "mindspore.yaml")]) == 0
    assert capsys.readouterr().err == ""
