"""MindSpore's dynamic cluster as the agent sets it up (unbroken.agent.mindspore): the workers'
variables, as msrun gives them, and the generation's Scheduler, a real process of the script
with ``MS_ROLE=MS_SCHED`` that the agent ends."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from unbroken.agent.launcher import parse_launch_args
from unbroken.agent.mindspore import (
    LAST_WORDS_S,
    SchedulerSlot,
    is_mindspore,
    last_words_grace_s,
    last_words_hold_s,
    worker_env,
)

pytestmark = pytest.mark.unit


def _args(script: str = "t.py", *script_args: str) -> object:
    return parse_launch_args(
        [
            "--nproc_per_node=2",
            "--nnodes=2",
            "--node_rank=1",
            "--master_addr=127.0.0.1",
            "--master_port=28555",
            script,
            *script_args,
        ]
    )


MS = {"UNBROKEN_FRAMEWORK": "mindspore"}


@pytest.mark.parametrize(
    ("env", "hold"),
    [
        # MindSpore's CPU collective gives up on a dead peer after 30 s unless told otherwise.
        ({**MS, "MS_ENABLE_TFT": "{TTP:1,UCE:1}"}, 32.0),
        ({**MS, "MS_ENABLE_TFT": "{TTP:1}", "MS_CPU_COMM_OP_TIMEOUT": "8"}, 10.0),
        ({**MS, "MS_ENABLE_TFT": "{TTP:1}", "MS_CPU_COMM_OP_TIMEOUT": "-3"}, 32.0),
        ({**MS, "MS_ENABLE_TFT": "{TTP:0,UCE:1}"}, 0.0),
        ({**MS, "MS_ENABLE_TFT": ""}, 0.0),
        ({**MS, "MS_ENABLE_TFT": "{TTP"}, 0.0),  # malformed: the rank says so
        (MS, 0.0),
        ({"MS_ENABLE_TFT": "{TTP:1}"}, 0.0),  # a torch job: its last words are asked for
    ],
)
def test_a_restart_leaves_mindspore_ranks_time_for_last_words_only_with_ttp(
    env: dict[str, str], hold: float
) -> None:
    # A rank blocked in a collective is left until the collective gives up on the dead peer;
    # then it has LAST_WORDS_S to write them.
    assert last_words_hold_s(env) == hold
    assert last_words_grace_s(env) == (hold + LAST_WORDS_S if hold else None)


def test_a_worker_gets_msruns_variables() -> None:
    env = worker_env(_args(), rank=3, local_rank=1)  # type: ignore[arg-type]
    assert {k: env[k] for k in env if k != "MS_TOPO_TIMEOUT"} == {
        "MS_SCHED_HOST": "127.0.0.1",
        "MS_SCHED_PORT": "28555",
        "MS_WORKER_NUM": "4",
        "MS_ROLE": "MS_WORKER",
        "MS_NODE_ID": "3",
        "RANK_ID": "3",
        "RANK_SIZE": "4",
        "DEVICE_ID": "1",
    }


def test_only_a_mindspore_jobs_agent_is_told_so() -> None:
    assert is_mindspore({"UNBROKEN_FRAMEWORK": "mindspore"})
    assert not is_mindspore({})


def test_the_scheduler_runs_the_script_as_ms_sched_and_ends_with_its_generation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("UNBROKEN_SECRET", "s")  # the agent's: never a child's
    monkeypatch.setenv("UNBROKEN_HEARTBEAT_FILE", str(tmp_path / "hb"))
    script = tmp_path / "sched.py"
    out = tmp_path / "env.json"
    script.write_text(
        "import json, os, sys, time\n"
        "keys = ('MS_ROLE', 'MS_SCHED_HOST', 'MS_SCHED_PORT', 'MS_WORKER_NUM', 'MS_NODE_ID',\n"
        "        'UNBROKEN_HEARTBEAT_FILE', 'UNBROKEN_SECRET')\n"
        f"open({str(out)!r}, 'w').write(json.dumps({{k: os.environ.get(k) for k in keys}}))\n"
        "time.sleep(60)\n"
    )
    slot = SchedulerSlot()
    args = parse_launch_args(
        ["--nproc_per_node=1", "--master_port=28556", "--no_python", sys.executable, str(script)]
    )
    slot.restart(args, tmp_path / "pod")
    first = slot.current
    assert first is not None
    deadline = time.monotonic() + 30
    while not out.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert json.loads(out.read_text()) == {
        "MS_ROLE": "MS_SCHED",
        "MS_SCHED_HOST": "127.0.0.1",
        "MS_SCHED_PORT": "28556",
        "MS_WORKER_NUM": "1",
        "MS_NODE_ID": None,
        "UNBROKEN_HEARTBEAT_FILE": None,
        "UNBROKEN_SECRET": None,
    }
    slot.restart(args, tmp_path / "pod")  # the next generation: a new Scheduler
    assert not first.alive and slot.current is not first
    second = slot.current
    assert second is not None
    slot.stop()
    assert not second.alive and slot.current is None
    assert (tmp_path / "pod" / "logs" / "scheduler.log").exists()
