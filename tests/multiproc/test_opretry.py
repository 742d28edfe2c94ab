"""Op retry with real link faults: the kernel resets a rank's TCP links to its peers mid-run.

Four ranks as 2 pods x 2 (``LOCAL_WORLD_SIZE=2``, so the gradient group is L1), gloo on
loopback. With ``HCCL_OP_RETRY_ENABLE`` on for L1 the failed all-reduce is re-executed over a
new group and training goes on: no recovery, no step redone, the model bitwise equal to a
fault-free run. With op retry off, or its attempts exhausted, the step fails and the ranks wait
for the manager's recovery command, as before.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from tests.support.recovery_job import Job, Rank, wait_for

from unbroken.worker import Phase
from unbroken.worker.heartbeat import StepFailure, unpack_op_retry

pytestmark = [pytest.mark.multiproc, pytest.mark.timeout(120)]

WORLD = 4
STEPS = 10
LINK_AT = 6
ON_L1 = {"HCCL_OP_RETRY_ENABLE": "L0:0, L1:1, L2:1", "LOCAL_WORLD_SIZE": "2"}


def link_fault(root: Path, rank: int, step: int) -> dict[str, str]:
    """The chaos entry ``{kind: link, rank: R, at_step: N}``, as the manager hands it over."""
    entry = {"index": 0, "kind": "link", "rank": rank, "at_step": step}
    return {"UNBROKEN_CHAOS": json.dumps([entry]), "UNBROKEN_CHAOS_DIR": str(root / "chaos")}


def fault_free_digest(root: Path, *args: str) -> str:
    job = Job(root, WORLD, ["--steps", str(STEPS), *args], env={"LOCAL_WORLD_SIZE": "2"})
    try:
        job.start_all(managed=False)
        job.expect_success()
        digests = {job.result(rank)["digest"] for rank in range(WORLD)}
    finally:
        job.close()
    assert len(digests) == 1
    return digests.pop()


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> str:
    return fault_free_digest(tmp_path_factory.mktemp("reference"))


@pytest.fixture(scope="module")
def reference_per_parameter(tmp_path_factory: pytest.TempPathFactory) -> str:
    return fault_free_digest(tmp_path_factory.mktemp("reference"), "--per-parameter")


@pytest.fixture
def jobs(tmp_path: Path) -> Iterator[Callable[..., Job]]:
    started: list[Job] = []

    def make(env: dict[str, str], *args: str) -> Job:
        job = Job(tmp_path, WORLD, ["--steps", str(STEPS), *args], env=env)
        started.append(job)
        return job

    yield make
    for job in started:
        job.close()


def stopped(ranks: list[Rank]) -> Callable[[], bool]:
    def all_stopped() -> bool:
        records = [r.heartbeat.read() for r in ranks]
        return all(rec is not None and rec.phase is Phase.STOPPING for rec in records)

    return all_stopped


@pytest.mark.parametrize("mode", ["fixed-buckets", "per-parameter"])
def test_a_reset_link_is_re_executed_without_recovery_and_bitwise_equal(
    jobs: Callable[..., Job], tmp_path: Path, mode: str, request: pytest.FixtureRequest
) -> None:
    per_parameter = mode == "per-parameter"
    reference = request.getfixturevalue("reference_per_parameter" if per_parameter else "reference")
    env = {
        **ON_L1,
        "HCCL_OP_RETRY_PARAMS": "MaxCnt:3, HoldTime:50, IntervalTime:50",
        **link_fault(tmp_path, 2, LINK_AT),
    }
    job = jobs(env, *(["--per-parameter"] if per_parameter else []))
    ranks = job.start_all()
    job.expect_success()

    assert "link fault injected before step 6" in ranks[2].log(), job.logs()
    for r in ranks:
        result = job.result(r.rank)
        assert (result["pid"], result["steps"]) == (r.proc.pid, STEPS)
        assert result["digest"] == reference
        assert job.steps_run(r.rank, r.proc.pid) == list(range(STEPS))  # no step redone
        record = r.record()
        assert (record.phase, record.generation, record.recoveries) == (Phase.DONE, 0, 0)
        assert record.op_retries == 1
        step, attempt, level = unpack_op_retry(record.op_retry_last)
        assert (step, level) == (LINK_AT, 1)
        assert 1 <= attempt <= 3
        assert f"gradient all-reduce of step {LINK_AT} re-executed (op retry" in r.log()


def test_an_attempt_failed_by_one_rank_alone_is_retried_by_all_together(
    jobs: Callable[..., Job], tmp_path: Path, reference: str
) -> None:
    # Rank 1's first attempt fails before its new group's rendezvous, while the others wait in
    # it (until the 4 s group timeout): every rank learns that the attempt failed, and all meet
    # again in the second, which succeeds. Rank 1 must not go on to the second attempt's
    # meeting alone and time out there while its peers still wait in the first.
    env = {
        **ON_L1,
        "HCCL_OP_RETRY_PARAMS": "MaxCnt:3, HoldTime:0, IntervalTime:0",
        **link_fault(tmp_path, 2, LINK_AT),
    }
    job = jobs(env, "--fail-retry-group", "1", "--comm-timeout", "4")
    ranks = job.start_all()
    job.expect_success()
    assert "injected: the new group's rendezvous failed here" in ranks[1].log(), job.logs()
    for r in ranks:
        assert job.result(r.rank)["digest"] == reference
        record = r.record()
        assert (record.phase, record.generation, record.recoveries) == (Phase.DONE, 0, 0)
        assert record.op_retries == 1
        step, attempt, _ = unpack_op_retry(record.op_retry_last)
        assert (step, attempt) == (LINK_AT, 2), r.log()


def test_without_op_retry_the_link_fault_fails_the_step_and_recovery_repairs_it(
    jobs: Callable[..., Job], tmp_path: Path, reference: str
) -> None:
    # L1 is off: the job's gradient group is L1 (two pods), so nothing is re-executed.
    env = {
        "HCCL_OP_RETRY_ENABLE": "L0:1, L1:0",
        "LOCAL_WORLD_SIZE": "2",
        **link_fault(tmp_path, 1, LINK_AT),
    }
    job = jobs(env)
    ranks = job.start_all()
    wait_for(stopped(ranks), "every rank to fail the step and wait for a command")
    for r in ranks:
        record = r.record()
        assert (record.failed_step, record.failure) == (LINK_AT, StepFailure.COLLECTIVE)
        assert record.op_retries == 0
    job.rejoin(source=0, step=LINK_AT)
    job.expect_success()
    assert {job.result(rank)["digest"] for rank in range(WORLD)} == {reference}
    assert all("op retry 1/" not in r.log() for r in ranks)  # no attempt made


def test_exhausted_op_retry_fails_the_step_with_the_reason(jobs: Callable[..., Job]) -> None:
    # Rank 3 dies in its backward: no attempt can meet it, and no command comes to stop the
    # retries, so both fail and the step goes to recovery (the ranks wait for its command).
    env = {**ON_L1, "HCCL_OP_RETRY_PARAMS": "MaxCnt:2, HoldTime:0, IntervalTime:0"}
    job = jobs(env, "--die-in-backward", f"3:{LINK_AT}", "--comm-timeout", "2")
    ranks = job.start_all()
    assert ranks[3].proc.wait(timeout=60) == -signal.SIGKILL, job.logs()
    survivors = ranks[:3]
    wait_for(stopped(survivors), "the survivors to exhaust op retry and stop")
    for r in survivors:
        record = r.record()
        assert (record.failed_step, record.failure) == (LINK_AT, StepFailure.COLLECTIVE)
        assert record.op_retries == 0
        log = r.log()
        assert "op retry 2/2 of step 6 failed" in log
        assert f"step {LINK_AT} failed (OpRetryExhausted: op retry exhausted: 2 re-execution" in log


def test_a_recovery_command_stops_the_retries_at_once(
    jobs: Callable[..., Job], reference: str
) -> None:
    # A dead peer is the manager's to handle: its pause ends the (here 60 s) hold at once.
    env = {**ON_L1, "HCCL_OP_RETRY_PARAMS": "MaxCnt:10, HoldTime:60000, IntervalTime:60000"}
    job = jobs(env, "--die-in-backward", f"3:{LINK_AT}")
    ranks = job.start_all()
    assert ranks[3].proc.wait(timeout=60) == -signal.SIGKILL, job.logs()
    survivors = ranks[:3]
    wait_for(lambda: all("op retry 1/10" in r.log() for r in survivors), "the survivors to hold")
    for r in survivors:
        r.mailbox.post({"op": "pause"})
    wait_for(stopped(survivors), "the survivors to stop retrying", deadline_s=30.0)
    for r in survivors:
        assert "stopped: a recovery command arrived" in r.log()
        assert r.record().command_seq == 1
    job.rejoin(source=0, step=LINK_AT, replace=[3])
    job.expect_success()
    assert {job.result(rank)["digest"] for rank in range(WORLD)} == {reference}
