"""The ledger file: typed round trip, filtering, status snapshot, threads, and refusals."""

from __future__ import annotations

import os
import sqlite3
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest

from unbroken.ledger import (
    EVENT_TYPES,
    SCHEMA_VERSION,
    CheckpointSaved,
    CommunicationReady,
    DecisionMade,
    DecodeError,
    DeviceIsolated,
    DeviceMemoryFreed,
    DeviceReset,
    DeviceResetStarted,
    DeviceReturned,
    Event,
    FaultDetected,
    FirstStepCommitted,
    JobFailed,
    JobPhase,
    JobStatus,
    JobStopped,
    JobSubmitted,
    JobSucceeded,
    Ledger,
    LedgerError,
    NodeDeprioritised,
    NodeIsolated,
    PlaneChanged,
    PlaneFailover,
    PlaneSubHealthy,
    PlaneSwitchback,
    PodHotSwitched,
    PodPlaced,
    PodsStopped,
    PodStatus,
    ProcessesStarted,
    ProcessRecoverPaused,
    ProcessRecoverResumed,
    RecoveryCompleted,
    RungsSwitchedOff,
    RungsUnavailable,
    StateLoaded,
    StateSource,
    StepProgress,
    StressLinkResult,
    StressRankResult,
    StressTested,
    StressTestFinished,
)
from unbroken.spec.knobs import Strategy

pytestmark = pytest.mark.unit

ONE_OF_EACH: tuple[Event, ...] = (
    JobSubmitted(
        job="gpt-small",
        pods=("master-0", "worker-0"),
        world_size=4,
        total_steps=200,
        strategies=(Strategy.RETRY, Strategy.RECOVER, Strategy.EXIT),
        spec_path="job.yaml",
    ),
    PodPlaced(pod="worker-0", node="node-1", devices=(0, 1), generation=0),
    ProcessesStarted(pod="worker-0", node="node-1", ranks=(2, 3), pids=(411, 412), generation=0),
    CommunicationReady(generation=0, world_size=4),
    StateLoaded(generation=0, step=0, source=StateSource.INITIAL),
    FirstStepCommitted(generation=0, step=1),
    StepProgress(generation=0, step=50, step_time_s=0.07),
    CheckpointSaved(step=100, path="ckpt/step-100", duration_s=0.15),
    FaultDetected(
        fault_id="f-1",
        source="process",
        code="SIGKILL",
        level="RestartBusiness",
        occurred_at=1000.25,
        step=110,
        pods=("worker-0",),
        nodes=("node-1",),
        ranks=(3,),
        detail="rank 3 exited with -9",
    ),
    DecisionMade(
        fault_id="f-1",
        strategy="recover-in-place",
        commands=("RestartRanks(ranks=(3,))",),
        reason="software fault younger than 60 s",
    ),
    PodsStopped(pods=("worker-0",), graceful=False, generation=0),
    DeviceIsolated(node="node-1", device=0, code="80E01801", reason="code 80E01801"),
    NodeIsolated(node="node-2", reason="agent heartbeats missed for 15 s"),
    DeviceReturned(node="node-1", device=0, reason="healthy again (autoStowing)"),
    NodeDeprioritised(node="node-2", reason="sub-healthy: 80E20207"),
    DeviceResetStarted(node="node-1", device=1, code="80E18005", reset_s=2.0),
    DeviceReset(node="node-1", device=1, took_s=2.4),
    DeviceMemoryFreed(pod="job-worker-0", ranks=(3,), gpus=(1,), waited_s=0.4, freed=True),
    RecoveryCompleted(
        fault_id="f-1", strategy="recover-in-place", generation=1, step=111, phases_s={"x": 1.5}
    ),
    PodHotSwitched(
        fault_id="f-2",
        pod="worker-0",
        from_node="node-1",
        to_node="node-2",
        generation=2,
        step=121,
        prepare_s=0.01,
        switch_s=1.25,
    ),
    StressTested(
        round=1,
        step=130,
        code=2,
        ranks=(
            StressRankResult(
                rank=3,
                pod="worker-0",
                node="node-1",
                device=1,
                device_code=2,
                link_code=0,
                checksum="4b1185d51d034088",
                reason="device checksum differs",
            ),
        ),
        links=(StressLinkResult(a=2, b=3, gbps=0.93, code=0),),
        median_gbps=0.93,
        faulty=(3,),
        stop_s=0.3,
        test_s=0.31,
    ),
    StressTestFinished(
        round=1,
        generation=3,
        step=131,
        code=2,
        paused_s=3.84,
        stop_s=0.3,
        test_s=0.31,
        resume_s=3.22,
        recovered=True,
    ),
    PlaneChanged(node="node-1", plane="a", up=False, changed_at=1700000200.5),
    PlaneSubHealthy(plane="a", comm_s=1.25, baseline_s=0.007, steps=3),
    RungsSwitchedOff(pod="p", ranks=(2, 3), rungs=("retry",), setting="PROCESS_RECOVER=off"),
    ProcessRecoverPaused(fault_id="f2", rescheduling="pod-rescheduling"),
    ProcessRecoverResumed(generation=2, paused_s=4.5),
    PlaneFailover(
        from_plane="a",
        to="b",
        planned=False,
        generation=4,
        step=150,
        pause_s=0.73,
        reason="plane a down on node-1: failover to plane b",
    ),
    PlaneSwitchback(
        from_plane="b",
        to="a",
        planned=True,
        generation=5,
        step=170,
        pause_s=0.74,
        reason="plane a up on every node for 5.0 s (hold 5 s): switchback",
    ),
    JobSucceeded(step=200),
    JobFailed(reason="no healthy node for pod worker-1", step=None),
    JobStopped(signal="SIGINT", step=120),
    RungsUnavailable(
        ranks=(0, 1, 2, 3),
        rungs=("retry", "recover"),
        reason="no Unbroken session (the script does not call unbroken.worker.init)",
    ),
)


def test_every_event_class_round_trips(tmp_path: Path) -> None:
    assert {type(e).kind for e in ONE_OF_EACH} == {
        k for k, cls in EVENT_TYPES.items() if cls.__module__ == "unbroken.ledger.events"
    }
    with Ledger(tmp_path / "run" / "ledger.db") as ledger:
        ids = [ledger.record(e, at=100.0 + i) for i, e in enumerate(ONE_OF_EACH)]
        records = ledger.events()
    assert [r.id for r in records] == ids
    assert ids == sorted(ids)
    assert [r.at for r in records] == [100.0 + i for i in range(len(ONE_OF_EACH))]
    assert [r.event() for r in records] == list(ONE_OF_EACH)
    # The stored form is plain JSON: enums as their values, tuples as lists.
    submitted = records[0].data
    assert submitted["strategies"] == ["retry", "recover", "exit"]
    assert records[4].data["source"] == "initial"


def test_records_stay_after_reopening_and_ids_keep_growing(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    with Ledger(path) as ledger:
        first = ledger.record(JobSucceeded(step=3))
    with Ledger(path, create=False) as reader:
        assert [r.event() for r in reader.events()] == [JobSucceeded(step=3)]
        second = reader.record(JobSucceeded(step=4))
        assert second > first
        assert reader.last_id() == second


def test_events_filter_by_since_kind_and_limit(tmp_path: Path) -> None:
    with Ledger(tmp_path / "l.db") as ledger:
        for step in range(1, 6):
            ledger.record(StepProgress(generation=0, step=step))
            ledger.record(CheckpointSaved(step=step, path=f"c{step}", duration_s=0.1))
        steps = ledger.events(kinds=[StepProgress])
        assert [r.data["step"] for r in steps] == [1, 2, 3, 4, 5]
        assert ledger.events(kinds=["CheckpointSaved"], limit=2)[-1].data["step"] == 2
        later = ledger.events(since_id=steps[2].id, kinds=[StepProgress, "CheckpointSaved"])
        assert [(r.kind, r.data["step"]) for r in later] == [
            ("CheckpointSaved", 3),
            ("StepProgress", 4),
            ("CheckpointSaved", 4),
            ("StepProgress", 5),
            ("CheckpointSaved", 5),
        ]
        assert ledger.events(kinds=[]) == []
        assert ledger.last_id() == 10


def test_raw_records_keep_their_data_and_have_no_class(tmp_path: Path) -> None:
    with Ledger(tmp_path / "l.db") as ledger:
        ledger.record_raw("StressTestPassed", {"node": "node-1", "tests": ("hbm", "link")}, at=7.0)
        (rec,) = ledger.events()
    assert rec.kind == "StressTestPassed"
    assert rec.at == 7.0
    assert rec.data == {"node": "node-1", "tests": ["hbm", "link"]}
    assert rec.event() is None


def test_raw_record_that_is_not_json_names_the_kind(tmp_path: Path) -> None:
    with Ledger(tmp_path / "l.db") as ledger:
        with pytest.raises(TypeError, match=r"^Odd event: object value"):
            ledger.record_raw("Odd", {"x": object()})
        assert ledger.events() == []


def test_a_record_that_does_not_fit_its_class_names_the_field(tmp_path: Path) -> None:
    with Ledger(tmp_path / "l.db") as ledger:
        ledger.record_raw("PodPlaced", {"pod": "w-0", "node": 3, "devices": [0], "generation": 0})
        ledger.record_raw("PodPlaced", {"pod": "w-0", "devices": [0], "generation": 0})
        bad_type, missing = ledger.events()
    with pytest.raises(DecodeError, match=r"PodPlaced record: field 'node': expected a string"):
        bad_type.event()
    with pytest.raises(DecodeError, match=r"PodPlaced record: field 'node' is missing"):
        missing.event()


def test_a_kind_can_only_be_defined_once() -> None:
    with pytest.raises(TypeError, match=r"event kind 'PodPlaced' .* is already used by"):

        @dataclass(frozen=True)
        class PodPlaced(Event):  # a second class with the same kind
            pod: str


def test_status_snapshot_round_trips_and_is_replaced(tmp_path: Path) -> None:
    status = JobStatus(
        job="gpt-small",
        phase=JobPhase.RUNNING,
        generation=1,
        step=120,
        total_steps=200,
        pods=(PodStatus("worker-0", "node-3", (0, 1), (2, 3), (901, 902)), PodStatus("master-0")),
        started_at=10.0,
        updated_at=20.0,
        faults=1,
        recoveries=1,
    )
    path = tmp_path / "l.db"
    with Ledger(path) as ledger:
        assert ledger.status() is None
        ledger.set_status(status)
        assert ledger.status() == status
        failed = JobStatus(**{**status.__dict__, "phase": JobPhase.FAILED, "message": "gave up"})
        ledger.set_status(failed)
    with Ledger(path, create=False) as reader:
        snapshot = reader.status()
    assert snapshot == failed
    assert snapshot is not None and snapshot.phase.finished


def test_threads_share_one_ledger(tmp_path: Path) -> None:
    with Ledger(tmp_path / "l.db") as ledger:

        def write(thread: int) -> None:
            for step in range(50):
                ledger.record(StepProgress(generation=thread, step=step))

        threads = [threading.Thread(target=write, args=(t,)) for t in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        records = ledger.events()
    assert len(records) == 200
    assert len({r.id for r in records}) == 200
    for thread in range(4):
        steps = [r.data["step"] for r in records if r.data["generation"] == thread]
        assert steps == list(range(50))


def test_follow_yields_what_is_there_then_stops(tmp_path: Path) -> None:
    stop = threading.Event()
    with Ledger(tmp_path / "l.db") as ledger:
        for step in (1, 2, 3):
            ledger.record(StepProgress(generation=0, step=step))
        seen = []
        for rec in ledger.follow(since_id=1, poll_s=0.01, stop=stop):
            seen.append(rec.data["step"])
            if len(seen) == 2:
                stop.set()
    assert seen == [2, 3]


def test_closed_ledger_says_so(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "l.db")
    ledger.close()
    with pytest.raises(LedgerError, match=r"ledger .*l\.db is closed"):
        ledger.record(JobSucceeded(step=1))


def test_ledger_is_in_wal_mode(tmp_path: Path) -> None:
    Ledger(tmp_path / "l.db").close()
    conn = sqlite3.connect(tmp_path / "l.db")
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.close()


# -- refusals ------------------------------------------------------------------------------


def test_garbage_file_is_not_a_ledger(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    path.write_bytes(os.urandom(4096))
    with pytest.raises(LedgerError, match=r"ledger\.db is not an unbroken ledger: not an SQLite"):
        Ledger(path)
    assert path.stat().st_size == 4096


def test_text_file_is_not_a_ledger(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    path.write_text("job: gpt\n")
    with pytest.raises(LedgerError, match=r"is not an unbroken ledger"):
        Ledger(path, create=False)


def test_another_sqlite_database_is_not_a_ledger(tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE t (x)")
    conn.commit()
    conn.close()
    with pytest.raises(LedgerError, match=r"other\.db is not an unbroken ledger: it is an SQLite"):
        Ledger(path)


def test_ledger_of_a_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    Ledger(path).close()
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    conn.commit()
    conn.close()
    with pytest.raises(
        LedgerError,
        match=rf"l\.db was written by a newer unbroken \(ledger schema {SCHEMA_VERSION + 1}; "
        rf"this version reads schema {SCHEMA_VERSION}\)",
    ):
        Ledger(path)


def test_missing_ledger_is_not_created_for_a_reader(tmp_path: Path) -> None:
    path = tmp_path / "runs" / "ledger.db"
    with pytest.raises(LedgerError, match=r"^no ledger at .*runs/ledger\.db$"):
        Ledger(path, create=False)
    assert not path.parent.exists()


def test_parent_that_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "runs").write_text("")
    with pytest.raises(LedgerError, match=r"cannot create ledger .*: .*runs is not a directory"):
        Ledger(tmp_path / "runs" / "job" / "ledger.db")


def test_path_that_is_a_directory(tmp_path: Path) -> None:
    with pytest.raises(LedgerError, match=r"cannot open ledger .*: it is a directory"):
        Ledger(tmp_path)


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write into any directory")
def test_directory_that_is_not_writable(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        with pytest.raises(LedgerError, match=r"directory .*locked is not writable"):
            Ledger(locked / "ledger.db")
    finally:
        locked.chmod(0o700)
