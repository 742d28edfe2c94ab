"""``hotReset: 2`` on GPUs: the operator's reset command, run for one GPU on a thread; a reset
that succeeded is reported, one that failed is said and leaves the GPU out."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from unbroken.devices.gpureset import GpuResetter, reset_argv

pytestmark = pytest.mark.unit


def test_the_gpu_s_index_goes_where_the_command_says() -> None:
    assert reset_argv("nvidia-smi --gpu-reset -i {gpu}", 3) == [
        "nvidia-smi",
        "--gpu-reset",
        "-i",
        "3",
    ]
    assert reset_argv("sh -c 'echo reset {gpu} >> /tmp/x'", 1) == [
        "sh",
        "-c",
        "echo reset 1 >> /tmp/x",
    ]


def test_a_reset_that_succeeds_is_reported_once_per_gpu(tmp_path: Path) -> None:
    log = tmp_path / "resets"
    done: list[int] = []
    said: list[str] = []
    finished = threading.Event()

    def on_done(gpu: int) -> None:
        done.append(gpu)
        finished.set()

    resetter = GpuResetter(f"sh -c 'sleep 0.2; echo {{gpu}} >> {log}'", on_done, said.append)
    first = resetter.reset(2, "XID-48", now=100.0)
    resetter.reset(2, "XID-48", now=100.1)  # the same GPU, while its reset runs: not again
    assert (first.code, first.at, first.until) == ("XID-48", 100.0, 220.0)
    assert finished.wait(10.0)
    resetter.wait(10.0)
    assert done == [2] and said == []
    assert log.read_text().split() == ["2"]


def test_a_reset_that_fails_says_why_and_reports_nothing() -> None:
    done: list[int] = []
    said: list[str] = []
    resetter = GpuResetter("sh -c 'echo no permission >&2; exit 3' {gpu}", done.append, said.append)
    resetter.reset(0, "XID-95", now=0.0)
    resetter.wait(10.0)
    assert done == []
    (line,) = said
    assert "GPU 0 not reset" in line and "exited 3 (no permission)" in line, line
    assert "stays out of the pool" in line


def test_a_command_that_does_not_exist_is_said_too() -> None:
    said: list[str] = []
    resetter = GpuResetter("/nonexistent/reset-gpu {gpu}", lambda g: None, said.append)
    resetter.reset(1, "XID-95", now=0.0)
    resetter.wait(10.0)
    assert len(said) == 1 and "GPU 1 not reset" in said[0], said
