"""``unbroken launch`` (no control plane) given something wrong: one line, exit 1, no ranks."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from tests.support.cli_runs import processes_of, unbroken

pytestmark = pytest.mark.e2e


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def test_missing_script_is_named_once_not_restarted(tmp_path: Path) -> None:
    res = unbroken(
        "launch",
        "--nproc_per_node=2",
        f"--master_port={_free_port()}",
        "--log_dir",
        tmp_path / "logs",
        "no_such_train.py",
        cwd=tmp_path,
        timeout_s=30.0,
    )
    assert res.rc == 1, res.explain()
    assert res.stderr == (
        f"unbroken launch: training script 'no_such_train.py' not found (looked in {tmp_path})\n"
    ), res.explain()
    assert not (tmp_path / "logs").exists()
    assert not processes_of(tmp_path)
