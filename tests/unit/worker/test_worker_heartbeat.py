"""The heartbeat record format, and its writer and reader over a real file (no torch)."""

from __future__ import annotations

import os
import struct
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from unbroken.worker.heartbeat import (
    MAGIC,
    RECORD_SIZE,
    VERSION,
    HeartbeatFormatError,
    HeartbeatReader,
    HeartbeatRecord,
    HeartbeatWriter,
    Phase,
    decode,
    encode,
)

pytestmark = pytest.mark.unit

_int64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
_stamp = st.floats(allow_nan=False, allow_infinity=False)


def _wait_for(predicate: object, deadline_s: float = 5.0) -> None:
    assert callable(predicate)
    deadline = time.monotonic() + deadline_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached before the deadline"
        time.sleep(0.01)


def test_phases_are_the_documented_spellings() -> None:
    assert [p.value for p in Phase] == [
        "starting",
        "comm-ready",
        "state-loaded",
        "training",
        "stopping",
        "done",
        "failed",
    ]


def test_a_full_record_round_trips() -> None:
    record = HeartbeatRecord(
        pid=4321,
        rank=3,
        generation=2,
        phase=Phase.TRAINING,
        tick=99,
        tick_at=1700000000.25,
        step=41,
        step_at=1700000000.5,
        committed=41,
        committed_at=1700000000.125,
        step_time_s=0.07,
        start_step=20,
        ckpt_step=40,
        ckpt_at=1699999999.0,
        started_at=1699999990.0,
        comm_ready_at=1699999992.0,
        state_loaded_at=1699999993.0,
        first_commit_at=1699999994.0,
    )
    buf = encode(record, seq=6)
    assert len(buf) == RECORD_SIZE
    assert buf[:4] == MAGIC
    assert decode(buf) == record


@given(
    pid=st.integers(min_value=0, max_value=2**31),
    phase=st.sampled_from(list(Phase)),
    step=_int64,
    committed=_int64,
    tick_at=_stamp,
    step_time_s=_stamp,
)
def test_any_record_round_trips(
    pid: int, phase: Phase, step: int, committed: int, tick_at: float, step_time_s: float
) -> None:
    record = HeartbeatRecord(
        pid=pid,
        phase=phase,
        step=step,
        committed=committed,
        tick_at=tick_at,
        step_time_s=step_time_s,
    )
    assert decode(encode(record)) == record


def test_decode_names_what_is_wrong() -> None:
    good = encode(HeartbeatRecord(pid=1))
    with pytest.raises(HeartbeatFormatError, match=r"magic b'XXXX', expected b'UBHB'"):
        decode(b"XXXX" + good[4:])
    with pytest.raises(
        HeartbeatFormatError, match=f"format version 9, this reader knows {VERSION}"
    ):
        decode(good[:4] + struct.pack("<H", 9) + good[6:])
    with pytest.raises(HeartbeatFormatError, match="is 20 bytes"):
        decode(good[:20])
    bad_phase = bytearray(good)
    struct.pack_into("<q", bad_phase, 16 + 3 * 8, 77)  # the phase field
    with pytest.raises(HeartbeatFormatError, match="unknown phase code 77"):
        decode(bytes(bad_phase))


def test_reader_returns_none_before_the_file_exists(tmp_path: Path) -> None:
    assert HeartbeatReader(tmp_path / "hb").read() is None


def test_writer_updates_and_ticks_and_reader_sees_it(tmp_path: Path) -> None:
    path = tmp_path / "rank0.hb"
    writer = HeartbeatWriter(path, rank=0, generation=5, started_at=123.0, interval_s=0.01)
    reader = HeartbeatReader(path)
    try:
        first = reader.read()
        assert first is not None
        assert (first.pid, first.rank, first.generation) == (os.getpid(), 0, 5)
        assert (first.phase, first.step, first.committed) == (Phase.STARTING, -1, 0)
        assert first.started_at == 123.0
        writer.update(phase=Phase.TRAINING, step=7, step_at=2.5)
        writer.update(committed=8, committed_at=3.0, step_time_s=0.5)
        record = reader.read()
        assert record is not None
        assert (record.phase, record.step, record.committed) == (Phase.TRAINING, 7, 8)
        assert (record.step_at, record.committed_at, record.step_time_s) == (2.5, 3.0, 0.5)
        _wait_for(lambda: (r := reader.read()) is not None and r.tick >= first.tick + 3)
    finally:
        writer.close()
    stopped = reader.read()
    assert stopped is not None
    time.sleep(0.05)  # several intervals: a closed writer no longer ticks
    assert reader.read() == stopped


def test_a_restarted_writer_replaces_the_file(tmp_path: Path) -> None:
    path = tmp_path / "rank1.hb"
    old = HeartbeatWriter(path, generation=0)
    old.update(committed=10)
    old.close()
    reader = HeartbeatReader(path)
    new = HeartbeatWriter(path, generation=1)
    try:
        record = reader.read()
        assert record is not None
        assert (record.generation, record.committed) == (1, 0)
    finally:
        new.close()
    assert not list(tmp_path.glob(".*.tmp"))


def test_reader_accepts_a_writer_stopped_mid_update(tmp_path: Path) -> None:
    path = tmp_path / "hb"
    path.write_bytes(encode(HeartbeatRecord(pid=9, step=3), seq=5))  # odd: update in progress
    record = HeartbeatReader(path).read()
    assert record is not None
    assert (record.pid, record.step) == (9, 3)


def test_reader_rejects_a_file_that_is_not_a_heartbeat(tmp_path: Path) -> None:
    path = tmp_path / "hb"
    path.write_bytes(b"not a heartbeat at all")
    with pytest.raises(HeartbeatFormatError, match="magic"):
        HeartbeatReader(path).read()


def test_writer_rejects_a_non_positive_interval(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="interval_s must be > 0, got 0"):
        HeartbeatWriter(tmp_path / "hb", interval_s=0)
