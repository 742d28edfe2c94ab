"""The seed's manager.py as it is (examples/taskd/manager.py), as its own process: errors
on stderr without a traceback, and inside a live run it waits until the run ends. The module
stays light enough to run beside training (no torch, no grpc)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from unbroken.ledger import JobSubmitted, Ledger

pytestmark = pytest.mark.unit

MANAGER_PY = Path(__file__).resolve().parents[3] / "examples" / "taskd" / "manager.py"


def clean_env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("UNBROKEN_") and k not in ("MINDX_TASK_ID", "RANK")
    }
    return {**env, **extra}


def run_manager(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(MANAGER_PY)], env=env, capture_output=True, text=True, timeout=60
    )


def test_without_mindx_task_id_both_calls_say_why_on_stderr() -> None:
    done = run_manager(clean_env())
    assert done.returncode == 0  # the seed's manager.py ignores the results
    assert "Traceback" not in done.stderr
    assert done.stderr.splitlines() == [
        "init_taskd_manager: job_id=None: expected a non-empty string, the job's id (manager.py "
        "reads it from MINDX_TASK_ID, which Unbroken sets in every pod)",
        "start_taskd_manager: call init_taskd_manager({'job_id': ..., 'node_nums': ..., "
        "'proc_per_node': ...}) first (it was not called, or it failed)",
    ]


def test_outside_a_run_it_says_the_manager_is_part_of_unbroken_run() -> None:
    done = run_manager(clean_env(MINDX_TASK_ID="mlp"))
    assert done.returncode == 0
    assert done.stderr.splitlines() == [
        "start_taskd_manager: job 'mlp': this process is not inside an Unbroken run "
        "(UNBROKEN_RUN_DIR is not set): in Unbroken the job manager is part of the control "
        "plane that `unbroken run JOB.yaml` starts, outside the training pods; start the job "
        "with `unbroken run JOB.yaml` (a manager.py started inside one of its pods then waits "
        "for the run to end)"
    ]


@pytest.mark.timeout(60)
def test_inside_a_live_run_it_waits_for_the_run_to_end(tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as port:  # the control plane's listening port
        port.settimeout(30.0)
        address = f"127.0.0.1:{port.getsockname()[1]}"
        control = tmp_path / "control.json"
        control.write_text(json.dumps({"address": address, "secret": "s", "pid": 1, "job": "mlp"}))
        with Ledger(tmp_path / "ledger.db") as ledger:
            ledger.record(
                JobSubmitted(job="mlp", pods=("mlp-master-0", "mlp-worker-0"), world_size=4)
            )
        env = clean_env(MINDX_TASK_ID="mlp", UNBROKEN_RUN_DIR=str(tmp_path))
        proc = subprocess.Popen(
            [sys.executable, str(MANAGER_PY)], env=env, stderr=subprocess.PIPE, text=True
        )
        try:
            try:
                conn, _ = port.accept()  # manager.py checks that the control plane answers
                conn.close()
            except TimeoutError:
                proc.kill()
                pytest.fail(f"manager.py never probed the control plane: {proc.communicate()[1]}")
            assert proc.poll() is None  # still waiting: the run is alive
            control.unlink()  # the job manager's last act when the run ends
            _, stderr = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert proc.returncode == 0
    assert stderr == ""


def test_the_module_imports_neither_torch_nor_grpc() -> None:
    code = "import sys, unbroken.compat.taskd\nprint(' '.join(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=60
    ).stdout.split()
    assert [m for m in out if m.split(".")[0] in ("torch", "grpc", "yaml")] == []
