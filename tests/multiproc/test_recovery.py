"""Recovery without restarting healthy processes, with real faults on real gloo groups.

The test plays agent and manager: one store per generation, a mailbox and heartbeat file per
process, replacements started with ``UNBROKEN_JOIN=1``, rejoin commands posted with
:class:`MailboxWriter`. Every run that recovers must end bitwise equal to a fault-free run;
every repair that cannot be trusted must fail loudly.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from tests.support.recovery_job import Job, Rank, wait_for

from unbroken.checkpoint import find_latest_good, step_dir, verify
from unbroken.protocol.exitreport import read_exit_report
from unbroken.protocol.kinds import StepFailure
from unbroken.worker import Phase

pytestmark = [pytest.mark.multiproc, pytest.mark.timeout(120)]

STEPS = 16
KILL_AT = 9


def fault_free_digest(root: Path, *args: str) -> str:
    """The final model digest of a fault-free run (plain torchrun-like, no agent)."""
    job = Job(root, 3, ["--steps", str(STEPS), *args])
    try:
        job.start_all(managed=False)
        job.expect_success()
        digests = {job.result(rank)["digest"] for rank in range(3)}
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

    def make(*args: str) -> Job:
        job = Job(tmp_path, 3, ["--steps", str(STEPS), *args])
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
def test_survivors_rejoin_and_a_replacement_takes_the_lost_rank(
    jobs: Callable[..., Job], mode: str, request: pytest.FixtureRequest
) -> None:
    per_parameter = mode == "per-parameter"
    reference = request.getfixturevalue("reference_per_parameter" if per_parameter else "reference")
    job = jobs("--die-in-backward", f"2:{KILL_AT}", *(["--per-parameter"] if per_parameter else []))
    first = job.start_all()
    survivors = {r.rank: r.proc.pid for r in first[:2]}
    lost = first[2]
    assert lost.proc.wait(timeout=60) == -signal.SIGKILL, job.logs()

    wait_for(stopped(first[:2]), "the survivors to stop and wait for a command")
    for r in first[:2]:
        record = r.record()
        assert (record.failed_step, record.committed) == (KILL_AT, KILL_AT)
        assert record.failed_at > 0
    job.rejoin(source=0, step=KILL_AT, replace=[2])
    job.expect_success()

    results = {rank: job.result(rank) for rank in range(3)}
    assert {rank: results[rank]["pid"] for rank in (0, 1)} == survivors
    assert results[2]["pid"] == job.ranks[2].proc.pid != lost.proc.pid
    assert {res["digest"] for res in results.values()} == {reference}
    assert {res["steps"] for res in results.values()} == {STEPS}

    # No committed step ran twice: the survivors redid only the interrupted step, the
    # replacement started there.
    for rank, pid in survivors.items():
        assert job.steps_run(rank, pid) == [*range(KILL_AT + 1), *range(KILL_AT, STEPS)]
    assert job.steps_run(2, lost.proc.pid) == list(range(KILL_AT + 1))
    assert job.steps_run(2, results[2]["pid"]) == list(range(KILL_AT, STEPS))

    for rank in (0, 1):
        record = job.ranks[rank].record()
        assert record.phase is Phase.DONE
        assert (record.generation, record.recoveries, record.failed_step) == (1, 1, -1)
        assert record.command_seq == 1
        assert record.failed_at <= record.comm_ready_at <= record.state_loaded_at
        assert record.state_loaded_at <= record.committed_at
    joined = job.ranks[2].record()
    assert (joined.generation, joined.start_step, joined.recoveries) == (1, KILL_AT, 1)
    assert "repairing rank(s) 2 from rank 0 at step 9" in job.ranks[0].log()


def test_a_failed_optimizer_update_is_repaired_from_a_rank_that_finished_it(
    jobs: Callable[..., Job], reference: str
) -> None:
    job = jobs("--fail-update", f"1:{KILL_AT}")
    ranks = job.start_all()
    wait_for(stopped(ranks), "every rank to stop")
    records = {r.rank: r.record() for r in ranks}
    # Rank 1's update failed halfway: it left at once, so the others, which committed the
    # step, failed in the next one instead of waiting for a timeout.
    assert (records[1].failed_step, records[1].committed) == (KILL_AT, KILL_AT)
    for rank in (0, 2):
        assert (records[rank].failed_step, records[rank].committed) == (KILL_AT + 1, KILL_AT + 1)
    job.rejoin(source=2, step=KILL_AT + 1)
    job.expect_success()

    results = {rank: job.result(rank) for rank in range(3)}
    assert {res["digest"] for res in results.values()} == {reference}
    assert {rank: res["pid"] for rank, res in results.items()} == {
        r.rank: r.proc.pid for r in ranks
    }
    assert "the optimizer update of step 9 failed (injected: uncorrectable memory error" in (
        ranks[1].log()
    )
    assert "repairing rank(s) 1 from rank 2 at step 10 (rank 1: 9 steps" in ranks[2].log()
    assert "rank 1: recovered into generation 1 at step 10 (state from rank 2)" in ranks[1].log()
    assert "rank 0: recovered into generation 1 at step 10 (own state kept)" in ranks[0].log()
    steps = job.steps_run(1, ranks[1].proc.pid)
    assert steps == [*range(KILL_AT + 1), *range(KILL_AT + 1, STEPS)]


def test_a_suspect_rank_is_refused_as_replica_source(jobs: Callable[..., Job]) -> None:
    job = jobs("--fail-update", f"1:{KILL_AT}")
    ranks = job.start_all()
    wait_for(stopped(ranks), "every rank to stop")
    job.rejoin(source=1, step=KILL_AT)
    assert set(job.wait().values()) == {1}, job.logs()
    reason = (
        f"rank 1 cannot be the replica source for resuming at step {KILL_AT}: it has suspect "
        "state (an optimizer update failed midway, or its memory was corrupted)"
    )
    for r in ranks:
        log = r.log()
        assert "RecoveryFailed" in log and reason in log, log
        assert r.record().phase is Phase.FAILED
        assert max(job.steps_run(r.rank, r.proc.pid)) == KILL_AT + (r.rank != 1)


def test_the_source_dying_mid_transfer_fails_the_repair(jobs: Callable[..., Job]) -> None:
    job = jobs("--die-in-backward", f"2:{KILL_AT}", "--die-in-transfer")
    first = job.start_all()
    wait_for(stopped(first[:2]), "the survivors to stop")
    job.rejoin(source=0, step=KILL_AT, replace=[2])
    codes = job.wait()
    assert codes[0] == -signal.SIGKILL, job.logs()
    assert (codes[1], codes[2]) == (1, 1), job.logs()
    replacement = job.ranks[2]
    log = replacement.log()
    assert (
        f"rank 2: recovery into generation 1 (replica source rank 0, step {KILL_AT}) failed:"
    ) in log, log
    assert "Connection reset by peer" in log or "Connection closed by peer" in log, log
    # It never trained on what it had received.
    assert not (job.out / f"steps-rank2-pid{replacement.proc.pid}").exists()
    assert replacement.record().phase is Phase.FAILED
    assert "rank 1: recovery into generation 1" in first[1].log()


def manager_decision(ranks: list[Rank]) -> tuple[int, int]:
    """What the manager decides from the heartbeats: the source is a rank with the most
    committed steps, and the job resumes at that step."""
    records = {r.rank: r.record() for r in ranks}
    step = max(rec.committed for rec in records.values())
    source = min(rank for rank, rec in records.items() if rec.committed == step)
    return source, step


def test_a_paused_job_rejoins_with_every_process_kept(
    jobs: Callable[..., Job], reference: str
) -> None:
    job = jobs("--step-sleep", "0.05")
    ranks = job.start_all()
    wait_for(lambda: (r := ranks[0].heartbeat.read()) is not None and r.committed >= 4, "step 4")
    for r in ranks:
        r.mailbox.post({"op": "pause"})
    wait_for(stopped(ranks), "every rank to stop")
    wait_for(lambda: all(r.record().command_seq == 1 for r in ranks), "every rank to see it")
    source, step = manager_decision(ranks)
    for r in ranks:
        record = r.record()
        assert record.committed == step, "a pause never splits the committed step"
        assert record.failed_step == step
    job.rejoin(source=source, step=step)
    job.expect_success()

    assert {job.result(r)["digest"] for r in range(3)} == {reference}
    for r in ranks:
        assert job.result(r.rank)["pid"] == r.proc.pid
        run = job.steps_run(r.rank, r.proc.pid)
        assert sorted(set(run)) == list(range(STEPS))
        assert len(run) - STEPS <= 1  # at most the step a departing peer interrupted
        assert r.record().command_seq == 2


def test_a_hung_rank_killed_by_the_manager_unblocks_the_others(
    jobs: Callable[..., Job], reference: str
) -> None:
    job = jobs("--step-sleep", "0.05", "--ckpt-dir", "ckpt", "--ckpt-every", "4")
    ranks = job.start_all()
    wait_for(lambda: (r := ranks[2].heartbeat.read()) is not None and r.committed >= 5, "step 5")
    hung = ranks[2]
    hung.proc.send_signal(signal.SIGSTOP)
    # The others block in the next step's all-reduce; their heartbeats keep ticking.
    blocked = {r.rank: r.record().tick for r in ranks[:2]}
    wait_for(
        lambda: all(r.record().tick > blocked[r.rank] + 3 for r in ranks[:2]),
        "the blocked ranks to keep ticking",
    )
    assert all(r.record().phase is Phase.TRAINING for r in ranks[:2])
    hung.proc.send_signal(signal.SIGKILL)
    assert hung.proc.wait(timeout=30) == -signal.SIGKILL
    wait_for(stopped(ranks[:2]), "the survivors to stop")
    for r in ranks[:2]:
        assert "Timed out" not in r.log(), "the kill, not the timeout, ended the collective"
    source, step = manager_decision(ranks[:2])
    job.rejoin(source=source, step=step, replace=[2])
    job.expect_success()
    assert {job.result(r)["digest"] for r in range(3)} == {reference}
    assert [job.result(r)["pid"] for r in (0, 1)] == [r.proc.pid for r in ranks[:2]]
    # Checkpoints after the recovery are written by the new group, replacement included.
    assert find_latest_good(job.root / "ckpt") == (12, step_dir(job.root / "ckpt", 12))
    assert verify(step_dir(job.root / "ckpt", 12)).world_size == 3


def test_without_a_command_the_survivors_give_up_with_a_clear_reason(
    jobs: Callable[..., Job],
) -> None:
    job = jobs("--die-in-backward", f"2:{KILL_AT}", "--command-timeout", "2")
    ranks = job.start_all()
    codes = job.wait()
    assert codes == {0: 1, 1: 1, 2: -signal.SIGKILL}, job.logs()
    for r in ranks[:2]:
        log = r.log()
        assert f"rank {r.rank}: step {KILL_AT} failed (RuntimeError: " in log, log
        assert f"no rejoin command arrived in {job.root}/mb/rank{r.rank}-g0 within 2 s" in log
        record = r.record()
        assert (record.phase, record.failed_step, record.recoveries) == (Phase.FAILED, KILL_AT, 0)
        # Why it ended, as data for its agent: the exception's class, and that a collective
        # failed under it (an echo of rank 2's death, not a fault of its own).
        report = read_exit_report(r.heartbeat.path, r.proc.pid)
        assert report is not None, log
        assert (report.exception, report.failure) == ("RecoveryFailed", StepFailure.COLLECTIVE)


def test_without_a_decision_the_survivors_give_up_at_mindio_wait_mindx_time(
    tmp_path: Path,
) -> None:
    """UNBROKEN_DECISION_WAIT_S (the job's MINDIO_WAIT_MINDX_TIME) bounds the wait for the
    manager's decision, however long the rung's own timeout: no order ever comes, so both
    survivors give up after 2 s, not the 60 s of the command timeout."""
    args = ["--steps", str(STEPS), "--die-in-backward", f"2:{KILL_AT}", "--command-timeout", "60"]
    job = Job(tmp_path, 3, args, env={"UNBROKEN_DECISION_WAIT_S": "2"})
    try:
        ranks = job.start_all()
        codes = job.wait(deadline_s=45.0)
    finally:
        job.close()
    assert codes == {0: 1, 1: 1, 2: -signal.SIGKILL}, job.logs()
    for r in ranks[:2]:
        log = r.log()
        assert f"rank {r.rank}: step {KILL_AT} failed (RuntimeError: " in log, log
        assert (
            "no decision from the job manager within 2 s (MINDIO_WAIT_MINDX_TIME), giving up"
        ) in log, log
        record = r.record()
        assert (record.phase, record.failed_step) == (Phase.FAILED, KILL_AT)


def test_a_rank_without_an_agent_fails_the_step_loudly(jobs: Callable[..., Job]) -> None:
    job = jobs("--die-in-backward", f"2:{KILL_AT}")
    job.start_all(managed=False)
    codes = job.wait()
    assert codes == {0: 1, 1: 1, 2: -signal.SIGKILL}, job.logs()
    for rank in (0, 1):
        log = job.ranks[rank].log()
        assert "RecoveryFailed" in log, log
        assert (
            f"rank {rank}: step {KILL_AT} failed (RuntimeError: " in log
            and "this process has no recovery command channel (UNBROKEN_MAILBOX is not set: "
            "it was not launched by an Unbroken agent)"
            in log
        ), log
