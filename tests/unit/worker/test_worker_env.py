"""Reading the launch context of a rank from its environment."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from unbroken.worker.env import WorkerEnv, WorkerEnvError, process_started_at

pytestmark = pytest.mark.unit


def test_plain_torchrun_is_unmanaged() -> None:
    env = WorkerEnv.from_environ(
        {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "TORCHELASTIC_RESTART_COUNT": "3"}
    )
    assert env == WorkerEnv(rank=1, local_rank=1, world_size=2, generation=3)
    assert not env.managed


def test_unbroken_launch_is_managed() -> None:
    env = WorkerEnv.from_environ(
        {
            "RANK": "3",
            "LOCAL_RANK": "1",
            "WORLD_SIZE": "4",
            "TORCHELASTIC_RESTART_COUNT": "2",
            "UNBROKEN_JOB_ID": "job-7",
            "UNBROKEN_GENERATION": "2",
            "UNBROKEN_HEARTBEAT_FILE": "hb/rank3",
            "UNBROKEN_CKPT_DIR": "ckpt",
        }
    )
    assert env.managed
    assert (env.rank, env.world_size, env.generation, env.job_id) == (3, 4, 2, "job-7")
    assert env.heartbeat_file == Path("hb/rank3")
    assert env.ckpt_dir == Path("ckpt")


def test_a_bad_integer_names_the_variable() -> None:
    with pytest.raises(WorkerEnvError, match=r"environment variable RANK='one' is not an integer"):
        WorkerEnv.from_environ({"RANK": "one"})


def test_process_start_is_in_the_past() -> None:
    started_at = process_started_at()
    assert 0.0 < started_at <= time.time()
