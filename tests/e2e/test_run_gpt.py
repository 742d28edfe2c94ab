"""``unbroken run`` with a training loop written the way people write them: the GPT-style
``examples/train_gpt.py`` (a warmup-then-cosine ``LambdaLR`` stepped after the optimizer, a
causal-mask buffer that DDP broadcasts before every forward, dropout, gradient clipping, a
``StatefulDataLoader`` over a shuffling ``DistributedSampler`` whose epochs are 16 steps long),
2 pods x 2 ranks on gloo. Every rung of the ladder, and two faults in one run, end with every
rank's model, optimizer, scheduler and data position bitwise equal to the fault-free run's. A
scheduler the script forgets to register is caught by the replicas' agreement check."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.support.cli_runs import (
    FIXTURES,
    REPO,
    assert_no_processes_left,
    events,
    of_kind,
    run_job,
)
from tests.support.process_helpers import recomputed_steps

pytestmark = pytest.mark.e2e

GPT = FIXTURES / "gpt.yaml"
SCRIPT = REPO / "examples" / "train_gpt.py"
STEPS = 48
RANKS = [0, 1, 2, 3]


def gpt_job(
    path: Path,
    *,
    strategy: str | None = "recover-in-place",
    pod_rescheduling: str = "on",
    args: tuple[str, ...] = (),
) -> Path:
    """A variant of the GPT job: its recovery strategy (None: none), pod rescheduling, and
    extra arguments for the script."""
    text = GPT.read_text().replace("../../../examples/train_gpt.py", str(SCRIPT))
    text = text.replace('pod-rescheduling: "on"', f'pod-rescheduling: "{pod_rescheduling}"')
    if strategy is None:
        text = text.replace('  annotations:\n    recover-strategy: "recover-in-place"\n', "")
    else:
        text = text.replace(
            'recover-strategy: "recover-in-place"', f'recover-strategy: "{strategy}"'
        )
    extra = "".join(f"                - {a}\n" for a in args)
    text = text.replace(
        "                - --result=result.json\n",
        extra + "                - --result=result.json\n",
    )
    path.write_text(text)
    return path


def results(run_dir: Path) -> dict[int, dict[str, Any]]:
    """What each rank wrote at the end: its digests of model, optimizer, scheduler and its
    data position."""
    out = {}
    for rank in RANKS:
        name = "result.json" if rank == 0 else f"result.json.rank{rank}"
        data = json.loads((run_dir / name).read_text())
        out[rank] = {k: data[k] for k in ("steps", "digest", "optimizer", "scheduler", "data")}
    return out


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[int, dict[str, Any]]]:
    """The GPT job without faults: the state every faulted run must end with, on every rank."""
    tmp = tmp_path_factory.mktemp("gpt-fault-free")
    run_dir = tmp / "run"
    res = run_job(run_dir, job=gpt_job(tmp / "job.yaml"))
    assert_no_processes_left(run_dir)
    assert res.rc == 0, res.explain()
    assert "0 fault(s), 0 recovery(ies)" in res.stdout, res.explain()
    final = results(run_dir)
    assert all(final[r] == final[0] for r in RANKS), final
    assert final[0]["steps"] == STEPS and final[0]["data"] == [2, 16], final[0]
    yield final


def chaos(path: Path, *faults: str) -> Path:
    path.write_text("faults:\n" + "".join(f"  - {f}\n" for f in faults))
    return path


def run_faulted(tmp_path: Path, job: Path, *faults: str) -> tuple[str, Path]:
    run_dir = tmp_path / "run"
    res = run_job(run_dir, "--chaos", chaos(tmp_path / "chaos.yaml", *faults), job=job)
    assert_no_processes_left(run_dir)
    assert res.rc == 0, res.explain()
    assert "job e2e-gpt: SUCCEEDED" in res.stdout, res.explain()
    return res.stdout, run_dir


def decided(run_dir: Path) -> list[str]:
    return [e["strategy"] for e in of_kind(events(run_dir), "DecisionMade")]


@pytest.mark.parametrize(
    ("strategy", "fault", "rung"),
    [
        ("retry,recover", "{kind: memory, rank: 2, at_step: 25}", "retry"),
        ("recover-in-place", "{kind: kill, rank: 3, at_step: 25}", "recover-in-place"),
        ("recover", "{kind: node, node: node-1, at_step: 25}", "recover"),
    ],
)
def test_in_process_rungs_end_with_the_fault_free_state_on_every_rank(
    tmp_path: Path, reference: dict[int, dict[str, Any]], strategy: str, fault: str, rung: str
) -> None:
    """The healthy ranks redo step 25 in their processes, their scheduler and data stream put
    back where the step began; a replacement takes scheduler and data position from a
    replica."""
    stdout, run_dir = run_faulted(
        tmp_path, gpt_job(tmp_path / "job.yaml", strategy=strategy), fault
    )
    assert "1 fault(s), 1 recovery(ies)" in stdout, stdout
    assert decided(run_dir) == [rung]
    assert recomputed_steps(run_dir) == 0
    assert results(run_dir) == reference


def test_dump_then_restart_resumes_from_the_last_words(
    tmp_path: Path, reference: dict[int, dict[str, Any]]
) -> None:
    """The last words hold the scheduler and every rank's data position at step 25."""
    job = gpt_job(tmp_path / "job.yaml", strategy="dump")
    _, run_dir = run_faulted(tmp_path, job, "{kind: kill, rank: 3, at_step: 25}")
    saved = [e for e in of_kind(events(run_dir), "CheckpointSaved") if e.get("last_words")]
    assert [e["step"] for e in saved] == [25], saved
    assert recomputed_steps(run_dir) == 0
    assert results(run_dir) == reference


@pytest.mark.parametrize(
    ("pod_rescheduling", "rung"), [("on", "pod-rescheduling"), ("off", "job-rescheduling")]
)
def test_rescheduling_resumes_scheduler_and_data_from_the_checkpoint(
    tmp_path: Path, reference: dict[int, dict[str, Any]], pod_rescheduling: str, rung: str
) -> None:
    """A lost node without process-level recovery: every rank restarts from the checkpoint of
    step 20 (scheduler, per-rank data positions, plain loader with a worker process)."""
    job = gpt_job(
        tmp_path / "job.yaml",
        strategy=None,
        pod_rescheduling=pod_rescheduling,
        args=("--loader=plain", "--workers=1"),
    )
    _, run_dir = run_faulted(tmp_path, job, "{kind: node, node: node-1, at_step: 25}")
    assert decided(run_dir) == [rung]
    assert recomputed_steps(run_dir) >= 5  # the node dies once step 25 is committed
    assert results(run_dir) == reference


def test_two_faults_in_one_run_across_an_epoch_boundary(
    tmp_path: Path, reference: dict[int, dict[str, Any]]
) -> None:
    """A device memory error retried online in epoch 0, then a killed rank replaced in place
    in epoch 1 (the replacement starts its loader, with a worker process, mid-epoch)."""
    job = gpt_job(tmp_path / "job.yaml", strategy="retry,recover-in-place", args=("--workers=1",))
    stdout, run_dir = run_faulted(
        tmp_path,
        job,
        "{kind: memory, rank: 1, at_step: 12}",
        "{kind: kill, rank: 0, at_step: 21}",
    )
    assert "2 fault(s), 2 recovery(ies)" in stdout, stdout
    assert decided(run_dir) == ["retry", "recover-in-place"]
    assert results(run_dir) == reference


def test_an_unregistered_scheduler_is_caught_by_the_agreement_check(
    tmp_path: Path, reference: dict[int, dict[str, Any]]
) -> None:
    """The script leaves its scheduler out of ``state=``: after the in-place recovery of step
    25 the healthy ranks' scheduler has stepped once more than a fault-free run's, the
    replacement's starts afresh. The check at step 32 finds the replicas apart, names the
    ranks and what differs, and the job resumes every rank from the newest checkpoint
    instead of training on: never a clean success over diverged replicas."""
    job = gpt_job(tmp_path / "job.yaml", args=("--unregistered-scheduler",))
    _, run_dir = run_faulted(tmp_path, job, "{kind: kill, rank: 3, at_step: 25}")
    evs = events(run_dir)
    faults = of_kind(evs, "FaultDetected")
    # Every rank's check finds the replicas apart; each rank's exit may be read as a fault of
    # its own, joined to the same incident, or as a rank the incident stopped.
    codes = [f["code"] for f in faults]
    assert codes[0] == "signal:SIGKILL" and len(codes) >= 2, faults
    assert set(codes[1:]) == {"ReplicasDiverged"}, faults
    diverged = faults[1]
    assert (
        "replicas diverged at step 32: rank(s) 3 differ from rank 0 in model, optimizer"
        in (diverged["detail"])
    ), diverged
    decisions = of_kind(evs, "DecisionMade", fault_id=diverged["fault_id"])
    assert decisions, evs
    assert all(d["strategy"] == "process-restart" for d in decisions), decisions
    assert "process-level rungs off: replicas diverged" in decisions[0]["reason"], decisions
    after = evs[[e["id"] for e in evs].index(faults[1]["id"]) :]
    loaded = of_kind(after, "StateLoaded")
    assert loaded and all(e["source"] == "checkpoint" for e in loaded), loaded
    final = results(run_dir)
    assert all(final[r] == final[0] for r in RANKS), final
    assert final[0] != reference[0]
