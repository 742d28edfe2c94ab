"""The seed's TaskD worker API: arguments checked, PyTorch only, and ``start_taskd_worker`` true
only under an Unbroken agent, whose session hooks do the worker's work."""

from __future__ import annotations

import logging

import pytest

from unbroken.compat import taskd
from unbroken.compat.taskd import (
    TaskdWorkerConfig,
    init_taskd_worker,
    start_taskd_worker,
    worker_config,
)

pytestmark = pytest.mark.unit

LOGGER = "unbroken.compat.taskd"
AGENT_ENV = {
    "RANK": "3",
    "LOCAL_RANK": "1",
    "WORLD_SIZE": "4",
    "UNBROKEN_JOB_ID": "mlp",
    "UNBROKEN_GENERATION": "0",
    "UNBROKEN_HEARTBEAT_FILE": "runs/mlp/pods/mlp-worker-0/rank-3.hb",
}


@pytest.fixture(autouse=True)
def _fresh(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(taskd, "_worker", None)
    caplog.set_level(logging.INFO, logger=LOGGER)


def logged(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == level]


def test_the_seeds_arguments_are_kept() -> None:
    assert init_taskd_worker(3, 5000, "pt") is True
    assert worker_config() == TaskdWorkerConfig(
        rank=3, upper_limit_of_disk_in_mb=5000, framework="pt"
    )


def test_the_seeds_mindspore_call_is_kept() -> None:
    assert init_taskd_worker(1, 5000, "ms") is True
    assert worker_config() == TaskdWorkerConfig(
        rank=1, upper_limit_of_disk_in_mb=5000, framework="ms"
    )


RANK = "expected an integer >= 0, the global rank"
DISK = "expected an integer > 0 (megabytes, e.g. 5000)"
FRAMEWORK = "expected 'pt' (PyTorch) or 'ms' (MindSpore)"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((-1, 5000, "pt"), f"rank=-1: {RANK}"),
        (("0", 5000, "pt"), f"rank='0': {RANK}"),
        ((True, 5000, "pt"), f"rank=True: {RANK}"),
        ((None, 5000, "pt"), f"rank=None: {RANK}"),
        ((0, 0, "pt"), f"upper_limit_of_disk_in_mb=0: {DISK}"),
        ((0, -5, "pt"), f"upper_limit_of_disk_in_mb=-5: {DISK}"),
        ((0, 5000.0, "pt"), f"upper_limit_of_disk_in_mb=5000.0: {DISK}"),
        ((0, "5000", "pt"), f"upper_limit_of_disk_in_mb='5000': {DISK}"),
        ((0, 5000, "tf"), f"framework='tf': {FRAMEWORK}"),
        ((0, 5000, "PT"), f"framework='PT': {FRAMEWORK}"),
        ((0, 5000, None), f"framework=None: {FRAMEWORK}"),
        ((0, 5000, ["pt"]), f"framework=['pt']: {FRAMEWORK}"),
    ],
)
def test_a_bad_argument_is_refused_with_its_reason(
    args: tuple[object, object, object], message: str, caplog: pytest.LogCaptureFixture
) -> None:
    assert init_taskd_worker(*args) is False  # type: ignore[arg-type]
    assert logged(caplog, logging.ERROR) == [f"init_taskd_worker: {message}"]
    assert worker_config() is None


def test_every_bad_argument_is_reported_and_the_last_good_ones_forgotten(
    caplog: pytest.LogCaptureFixture,
) -> None:
    assert init_taskd_worker(0, 5000, "pt")
    assert not init_taskd_worker(-2, 0, "ms")  # the seed's MindSpore call, with bad numbers
    assert logged(caplog, logging.ERROR) == [
        f"init_taskd_worker: rank=-2: {RANK}",
        f"init_taskd_worker: upper_limit_of_disk_in_mb=0: {DISK}",
    ]
    assert worker_config() is None


def test_start_before_init_is_refused(caplog: pytest.LogCaptureFixture) -> None:
    assert start_taskd_worker(environ=AGENT_ENV) is False
    assert logged(caplog, logging.ERROR) == [
        "start_taskd_worker: call init_taskd_worker(rank, upper_limit_of_disk_in_mb, 'pt') "
        "first (it was not called, or it failed)"
    ]


def test_under_an_unbroken_agent_the_session_hooks_take_over(
    caplog: pytest.LogCaptureFixture,
) -> None:
    assert init_taskd_worker(3, 5000, "pt")
    assert start_taskd_worker(environ=AGENT_ENV) is True
    assert logged(caplog, logging.ERROR) == []
    assert logged(caplog, logging.WARNING) == []
    assert logged(caplog, logging.INFO) == [
        "start_taskd_worker: rank 3 of job mlp: the session hooks of unbroken.worker.init(...) "
        "take over (heartbeat, step commit, stop at a step boundary, recovery)"
    ]


def test_a_mindspore_worker_is_told_its_session(caplog: pytest.LogCaptureFixture) -> None:
    assert init_taskd_worker(3, 5000, "ms")
    assert start_taskd_worker(environ=AGENT_ENV) is True
    assert logged(caplog, logging.INFO) == [
        "start_taskd_worker: rank 3 of job mlp: the session hooks of unbroken.mindspore.init(...) "
        "take over (heartbeat, step commit, stop at a step boundary, recovery)"
    ]


def test_under_plain_torchrun_there_is_no_worker_to_start(
    caplog: pytest.LogCaptureFixture,
) -> None:
    assert init_taskd_worker(1, 5000, "pt")
    torchrun_env = {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2"}
    assert start_taskd_worker(environ=torchrun_env) is False
    assert logged(caplog, logging.ERROR) == [
        "start_taskd_worker: rank 1 is not running under an Unbroken agent "
        "(UNBROKEN_HEARTBEAT_FILE is not set: plain torchrun?), so there is no worker to start; "
        "launch the job with `unbroken run JOB.yaml` (pods run `unbroken launch`, a drop-in for "
        "torchrun)"
    ]


def test_a_rank_other_than_the_agents_is_warned_about(caplog: pytest.LogCaptureFixture) -> None:
    assert init_taskd_worker(0, 5000, "pt")
    assert start_taskd_worker(environ=AGENT_ENV) is True
    assert logged(caplog, logging.WARNING) == [
        "start_taskd_worker: rank 0 given, but the agent started this process as rank 3"
    ]


def test_a_malformed_launch_environment_is_refused(caplog: pytest.LogCaptureFixture) -> None:
    assert init_taskd_worker(3, 5000, "pt")
    assert start_taskd_worker(environ={**AGENT_ENV, "RANK": "three"}) is False
    assert logged(caplog, logging.ERROR) == [
        "start_taskd_worker: rank 3: environment variable RANK='three' is not an integer"
    ]
