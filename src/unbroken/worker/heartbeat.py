"""The worker's side of the heartbeat: the rank's writer of its record.

The record's format, its fields and the agent's reader are in :mod:`unbroken.protocol.heartbeat`
(imported by both sides; its names are re-exported here). The writer maps the file into memory
and updates fields in place, so an update is a few memory writes and no system call; a daemon
thread ticks the liveness stamp every ``interval_s``. Standard library only.
"""

from __future__ import annotations

import mmap
import os
import struct
import threading
import time
from pathlib import Path

from unbroken.protocol.heartbeat import (
    DEFAULT_INTERVAL_S,
    FIELD_CODES,
    FIELD_OFFSETS,
    MAGIC,
    PHASE_CODES,
    RECORD_SIZE,
    SEQ_OFFSET,
    VERSION,
    HeartbeatFormatError,
    HeartbeatReader,
    HeartbeatRecord,
    Phase,
    StepFailure,
    decode,
    encode,
    pack_op_retry,
    unpack_op_retry,
)

__all__ = [
    "DEFAULT_INTERVAL_S",
    "MAGIC",
    "RECORD_SIZE",
    "VERSION",
    "HeartbeatFormatError",
    "HeartbeatReader",
    "HeartbeatRecord",
    "HeartbeatWriter",
    "Phase",
    "StepFailure",
    "decode",
    "encode",
    "pack_op_retry",
    "unpack_op_retry",
]


class HeartbeatWriter:
    """The worker's side: owns the file, updates it in place, ticks from a daemon thread.

    The file is created under a temporary name and renamed into place, so a reader never sees
    a partial record. Updates from several threads are serialized by a lock.
    """

    def __init__(
        self,
        path: Path | str,
        *,
        rank: int = -1,
        generation: int = -1,
        started_at: float = 0.0,
        interval_s: float = DEFAULT_INTERVAL_S,
    ) -> None:
        if interval_s <= 0:
            raise ValueError(f"heartbeat interval_s must be > 0, got {interval_s}")
        self.path = Path(path)
        self.interval_s = interval_s
        self._lock = threading.Lock()
        self._seq = 0
        self._tick = 0
        now = time.time()
        initial = HeartbeatRecord(
            pid=os.getpid(),
            rank=rank,
            generation=generation,
            tick_at=now,
            started_at=started_at or now,
        )
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, encode(initial))
            self._mm = mmap.mmap(fd, RECORD_SIZE)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="unbroken-heartbeat", daemon=True)
        self._thread.start()

    def update(self, **values: int | float | Phase) -> None:
        """Write the named fields (names of :class:`HeartbeatRecord`) as one update."""
        with self._lock:
            if self._mm.closed:
                return
            self._seq += 1
            struct.pack_into("<Q", self._mm, SEQ_OFFSET, self._seq)
            for name, value in values.items():
                if isinstance(value, Phase):
                    value = PHASE_CODES[value]
                struct.pack_into("<" + FIELD_CODES[name], self._mm, FIELD_OFFSETS[name], value)
            self._seq += 1
            struct.pack_into("<Q", self._mm, SEQ_OFFSET, self._seq)

    def snapshot(self) -> HeartbeatRecord:
        """The record as this process last wrote it."""
        with self._lock:
            return decode(bytes(self._mm))

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._tick += 1
            self.update(tick=self._tick, tick_at=time.time())

    def close(self) -> None:
        """Stop ticking and unmap; the file stays for the agent to read the final record."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join()
        with self._lock:
            if not self._mm.closed:
                self._mm.close()
