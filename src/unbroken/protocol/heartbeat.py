"""The heartbeat record: what a training process tells its node agent, through a small file.

The format and the agent's reader live here; the worker's writer
(:class:`unbroken.worker.heartbeat.HeartbeatWriter`) maps the file and updates it in place.

Each rank owns one file (its path is ``UNBROKEN_HEARTBEAT_FILE``) holding one fixed-size binary
record. The worker maps the file into memory and updates fields in place, so an update is a few
memory writes and no system call. The agent reads the file whenever it polls.

Liveness: a daemon thread in the worker increments ``tick`` and stamps ``tick_at`` every
``interval_s``. A SIGSTOPped process stops ticking; a healthy rank blocked inside a gloo
collective keeps ticking (gloo releases the GIL while it waits), so a stalled tick means a
stopped or wedged interpreter, and a stalled ``step`` with a live tick means a hang in the
training itself (a peer gone, a collective that never completes).

Progress: ``step`` is the index of the step in progress (-1 before the first), ``committed`` the
number of steps whose optimizer update has finished, which is also the index of the next step to
run; ``committed == step + 1`` between a commit and the next step's start. ``ckpt_step`` is the
``committed`` count of the last checkpoint this rank finished writing (-1: none).

Recovery without a restart (:mod:`unbroken.worker.recovery`): a rank whose step failed, or that
a ``pause`` command stopped, reports ``stopping`` with ``failed_step``/``failed_at`` while it
waits for a command; ``command_seq`` is the mailbox command it last acted on. Rejoining, it
stamps ``comm_ready_at`` (phase ``comm-ready``) when the new process group is up and
``state_loaded_at`` (``state-loaded``, ``committed`` = the step it resumes at) when its state
is repaired and verified, then counts ``recoveries`` and reports ``training`` again when the
redone step starts. ``generation`` and ``rank`` follow the group it joined. A stopped rank
asked for last words (``dump``) stamps ``dumped_step``/``dumped_at`` once its checkpoint is
committed, or ``dump_failed_at`` when it could not write one.

Layout (little endian, ``RECORD_SIZE`` bytes): a 16-byte header (``MAGIC``, ``VERSION``, record
size, sequence number) followed by 8-byte fields in the order of :data:`_FIELDS`, then zero
padding reserved for later fields. Writers bump the sequence number to an odd value before an
update and to the next even value after it; readers retry until they see the same even value
before and after reading (a seqlock). Wall stamps are ``time.time()`` seconds, 0.0 meaning "not
yet". This module imports the standard library only: the agent uses it without torch.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, fields
from enum import StrEnum
from pathlib import Path

from unbroken.protocol.kinds import StepFailure

MAGIC = b"UBHB"
VERSION = 3
RECORD_SIZE = 512
DEFAULT_INTERVAL_S = 0.1

HEADER = struct.Struct("<4sHHQ")  # magic, version, record size, sequence number
SEQ_OFFSET = 8


class Phase(StrEnum):
    """Where a training process is in its life, in order."""

    STARTING = "starting"
    COMM_READY = "comm-ready"  # the process group is initialized
    STATE_LOADED = "state-loaded"  # model, optimizer, data position and RNG restored (or fresh)
    TRAINING = "training"  # the first step has started
    STOPPING = "stopping"  # a stop was requested; the process leaves at the next step boundary
    DONE = "done"  # training finished and the session closed
    FAILED = "failed"  # an exception escaped the training script


PHASE_CODES: dict[Phase, int] = {phase: code for code, phase in enumerate(Phase)}
_CODE_PHASES: dict[int, Phase] = {code: phase for phase, code in PHASE_CODES.items()}


def pack_op_retry(step: int, attempt: int, level: int) -> int:
    """``op_retry_last``: ``step * 1000 + attempt * 10 + level`` (attempt 1-10, level 0-2), so
    the number reads as it is written: 12011 is step 12, attempt 1, level L1."""
    if step < 0 or not 1 <= attempt <= 99 or not 0 <= level <= 9:
        raise ValueError(f"cannot pack op retry step {step}, attempt {attempt}, level {level}")
    return step * 1000 + attempt * 10 + level


def unpack_op_retry(value: int) -> tuple[int, int, int]:
    """(step, attempt, level) of an ``op_retry_last`` value."""
    return value // 1000, value % 1000 // 10, value % 10


class HeartbeatFormatError(ValueError):
    """A heartbeat file that is not a record of this format (wrong magic, version or size)."""


@dataclass(frozen=True)
class HeartbeatRecord:
    """One snapshot of a rank's heartbeat file."""

    pid: int
    rank: int = -1
    generation: int = -1
    phase: Phase = Phase.STARTING
    tick: int = 0
    tick_at: float = 0.0
    step: int = -1
    step_at: float = 0.0  # when ``step`` started
    committed: int = 0
    committed_at: float = 0.0
    step_time_s: float = 0.0  # EWMA of step start -> commit; 0.0 before the first commit
    start_step: int = -1  # the step this process started (resumed) at; -1 until state loaded
    ckpt_step: int = -1
    ckpt_at: float = 0.0
    started_at: float = 0.0  # process start
    comm_ready_at: float = 0.0
    state_loaded_at: float = 0.0
    first_commit_at: float = 0.0  # first step committed by this process
    # In-process recovery (format version 2):
    failed_step: int = -1  # the step that failed or was paused before; -1 once recovered
    failed_at: float = 0.0  # when it failed
    recoveries: int = 0  # in-process recoveries completed by this process
    command_seq: int = 0  # the last mailbox command this process acted on
    recoverable: int = 0  # 1: this rank can regroup and be repaired in process (has a mailbox)
    failure: int = 0  # why ``failed_step`` failed: a :class:`StepFailure` code
    # Op retry (in version 2's reserved padding: a record by an older writer reads zeros):
    op_retries: int = 0  # op retries (re-executions) that succeeded in this process
    op_retry_at: float = 0.0  # when the last re-execution succeeded
    op_retry_last: int = 0  # the last one's step, attempt and level: see :func:`pack_op_retry`
    # Last words (``dump``):
    dumped_step: int = -1  # the step of the last-words checkpoint this rank wrote; -1: none
    dumped_at: float = 0.0  # when it was committed (its manifest written)
    dump_failed_at: float = 0.0  # when this rank's last attempt at last words failed
    # Stragglers (format version 3): the part of a step this rank computes alone
    compute_time_s: float = 0.0  # step ``committed - 1``: start -> gradient collective; 0: unknown
    # Network planes (in version 3's reserved padding: a record by an older writer reads 0.0)
    comm_time_s: float = 0.0  # step ``committed - 1``: its last gradient bucket -> all reduced


# Field name -> struct code, in file order. Integers are signed 64-bit, stamps are doubles.
_FIELDS: tuple[tuple[str, str], ...] = tuple(
    (f.name, "d" if f.type in ("float", float) else "q") for f in fields(HeartbeatRecord)
)
_BODY = struct.Struct("<" + "".join(code for _, code in _FIELDS))
FIELD_OFFSETS: dict[str, int] = {}
_offset = HEADER.size
for _name, _code in _FIELDS:
    FIELD_OFFSETS[_name] = _offset
    _offset += struct.calcsize("<" + _code)
assert _offset <= RECORD_SIZE, "heartbeat record outgrew RECORD_SIZE"
FIELD_CODES: dict[str, str] = dict(_FIELDS)


def _field_value(record: HeartbeatRecord, name: str) -> int | float:
    value = getattr(record, name)
    if isinstance(value, Phase):
        return PHASE_CODES[value]
    assert isinstance(value, int | float)
    return value


def encode(record: HeartbeatRecord, seq: int = 0) -> bytes:
    """The ``RECORD_SIZE`` bytes of ``record`` with sequence number ``seq``."""
    buf = bytearray(RECORD_SIZE)
    HEADER.pack_into(buf, 0, MAGIC, VERSION, RECORD_SIZE, seq)
    _BODY.pack_into(buf, HEADER.size, *(_field_value(record, name) for name, _ in _FIELDS))
    return bytes(buf)


def decode(buf: bytes) -> HeartbeatRecord:
    """Parse a record; raises :class:`HeartbeatFormatError` when ``buf`` is not one."""
    if len(buf) < HEADER.size:
        raise HeartbeatFormatError(
            f"heartbeat record is {len(buf)} bytes, expected {RECORD_SIZE} (truncated file?)"
        )
    magic, version, size, _seq = HEADER.unpack_from(buf, 0)
    if magic != MAGIC:
        raise HeartbeatFormatError(f"heartbeat record has magic {magic!r}, expected {MAGIC!r}")
    if version != VERSION:
        raise HeartbeatFormatError(
            f"heartbeat record has format version {version}, this reader knows {VERSION}"
        )
    if size != RECORD_SIZE or len(buf) < RECORD_SIZE:
        raise HeartbeatFormatError(
            f"heartbeat record is {len(buf)} bytes (header says {size}), expected {RECORD_SIZE}"
        )
    values = dict(
        zip((name for name, _ in _FIELDS), _BODY.unpack_from(buf, HEADER.size), strict=True)
    )
    code = int(values["phase"])
    if code not in _CODE_PHASES:
        raise HeartbeatFormatError(f"heartbeat record has unknown phase code {code}")
    values["phase"] = _CODE_PHASES[code]
    return HeartbeatRecord(**values)


def _sequence(buf: bytes) -> int:
    (seq,) = struct.unpack_from("<Q", buf, SEQ_OFFSET)
    return int(seq)


class HeartbeatReader:
    """The agent's view of one rank's heartbeat file.

    Each :meth:`read` opens the file afresh, so a restarted process that replaced the file is
    seen at once. Never imports torch.
    """

    def __init__(self, path: Path | str, attempts: int = 100) -> None:
        self.path = Path(path)
        self._attempts = attempts

    def read(self) -> HeartbeatRecord | None:
        """The current record, or None when the file does not exist (yet).

        Raises :class:`HeartbeatFormatError` for a file that is not a heartbeat record.
        """
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            first = os.pread(fd, RECORD_SIZE, 0)
            for _ in range(self._attempts):
                if len(first) < RECORD_SIZE:
                    break
                again = os.pread(fd, RECORD_SIZE, 0)
                seq = _sequence(first)
                if seq == _sequence(again) and (seq % 2 == 0 or first == again):
                    # The same even sequence number before and after ``first`` was copied: a
                    # consistent snapshot. An odd one that stays put with nothing changing means
                    # the writer stopped mid-update (SIGSTOP, SIGKILL); each field is written
                    # whole, so that snapshot is usable too.
                    return decode(first)
                first = again
            return decode(first)
        finally:
            os.close(fd)


__all__ = [
    "DEFAULT_INTERVAL_S",
    "FIELD_CODES",
    "FIELD_OFFSETS",
    "HEADER",
    "MAGIC",
    "PHASE_CODES",
    "RECORD_SIZE",
    "SEQ_OFFSET",
    "VERSION",
    "HeartbeatFormatError",
    "HeartbeatReader",
    "HeartbeatRecord",
    "Phase",
    "StepFailure",
    "decode",
    "encode",
    "pack_op_retry",
    "unpack_op_retry",
]
