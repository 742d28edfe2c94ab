"""``unbroken run`` with a MindSpore job: ``examples/train_ms_gpt.py`` (a small GPT written the
way MindFormers' models are, compiled forward and backward, ``AdamWeightDecay`` on a warm-up
then cosine schedule, gradient clipping) launched with ``msrun`` in 2 pods x 1 rank, on
MindSpore's own dynamic cluster (a Scheduler beside node rank 0's ranks) and its own
``AllReduce``, reading a shuffled, sharded ``mindspore.dataset`` pipeline through the session.
One run takes a fault for each rung a MindSpore job has (HCCE and UCE retry in process, TTP
last words of a healthy rank when a peer is killed, RSC: a pod moved off a failed device, every
rank restarted) and ends bitwise equal to the fault-free run, its data and registered state
included."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.support.cli_runs import (
    FIXTURES,
    assert_no_processes_left,
    events,
    of_kind,
    run_job,
)

pytest.importorskip("mindspore", reason="MindSpore is not installed (unbroken[mindspore])")

pytestmark = pytest.mark.e2e

JOB = FIXTURES / "ms-job.yaml"
FAULTS = FIXTURES / "ms-faults.yaml"
STEPS = 24  # long enough for the device plugin's poll (3 s) to see a fault


def result(run_dir: Path) -> dict[str, object]:
    data: dict[str, object] = json.loads((run_dir / "result.json").read_text())
    return data


@pytest.fixture(scope="module")
def fault_free(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    run_dir = tmp_path_factory.mktemp("ms-fault-free") / "run"
    res = run_job(run_dir, job=JOB)
    assert_no_processes_left(run_dir)
    assert res.rc == 0, res.explain()
    assert "job e2e-ms: SUCCEEDED" in res.stdout, res.explain()
    assert "0 fault(s), 0 recovery(ies)" in res.stdout, res.explain()
    # The Scheduler ran beside node rank 0's ranks, as msrun runs it.
    scheduler_log = run_dir / "pods" / "e2e-ms-master-0" / "logs" / "scheduler.log"
    assert "Cluster is successfully initialized" in scheduler_log.read_text()
    return result(run_dir)


def test_the_fault_free_run_trains_every_step(fault_free: dict[str, object]) -> None:
    assert fault_free["steps"] == STEPS
    assert fault_free["world_size"] == 2
    assert fault_free["start_step"] == 0


def test_retry_last_words_and_rescheduling_end_with_the_fault_free_state(
    tmp_path: Path, fault_free: dict[str, object]
) -> None:
    run_dir = tmp_path / "run"
    # The device plugin polls every 3 s: the failed device is seen a few steps later.
    cluster = FIXTURES / "cluster-fast-watch.yaml"
    res = run_job(run_dir, "--cluster", cluster, "--chaos", FAULTS, job=JOB)
    assert_no_processes_left(run_dir)
    assert res.rc == 0, res.explain()
    assert f"step {STEPS}/{STEPS}" in res.stdout, res.explain()
    evs = events(run_dir)
    # HCCE and UCE: the steps were redone in the running processes, no fault for the policy.
    redone = of_kind(evs, "StepRedone")
    assert [(e["rank"], e["step"], e["failure"]) for e in redone] == [
        (0, 1, "link"),
        (1, 3, "device memory"),
    ], res.explain()
    # Two faults left, each a restart of every rank: rank 1 killed (an in-pod restart from the
    # healthy rank 0's last words of step 5, nothing recomputed) and the failed device (its pod
    # moved off it, from the newest checkpoint or last words).
    assert "2 fault(s), 2 recovery(ies)" in res.stdout, res.explain()
    decisions = of_kind(evs, "DecisionMade")
    assert [d["strategy"] for d in decisions] == ["process-restart", "pod-rescheduling"]
    assert all(
        "MindSpore ranks cannot leave a broken communicator" in d["reason"] for d in decisions
    )
    last_words = [e["step"] for e in of_kind(evs, "CheckpointSaved") if e["last_words"]]
    assert last_words[0] == 5, res.explain()
    loaded = [e["step"] for e in of_kind(evs, "StateLoaded") if e["generation"] > 0]
    assert len(loaded) == 2 and loaded[0] == 5 and loaded[1] >= 8, res.explain()
    # Each restart resumed at the newest step saved: a checkpoint (every 2) or last words.
    assert loaded[1] % 2 == 0 or loaded[1] in last_words, res.explain()
    # The result: bit for bit the fault-free run's, from processes that resumed at a checkpoint.
    final = result(run_dir)
    assert final["start_step"] == loaded[1]
    assert final["digest"] == fault_free["digest"]
    # The data resumed where each checkpoint left it, the registered state too (the redone
    # steps' tokens counted once).
    assert final["data_position"] == fault_free["data_position"] == [1, 8]
    assert final["tokens_seen"] == fault_free["tokens_seen"] == STEPS * 4 * 32
