"""The command channel from the node agent to one rank: a small JSON file, latest command wins.

The agent owns a :class:`MailboxWriter` per rank process; the rank finds its mailbox through
``UNBROKEN_MAILBOX`` and reads it with a :class:`MailboxReader`. A command is one JSON object
with an ``op`` and a sequence number ``seq`` that the writer assigns (1, 2, ...). The writer
replaces the whole file atomically (temporary file, then rename), so a reader never sees a
half-written command; the file holds only the newest command, which supersedes any earlier
one the reader has not seen yet.

A poll costs one ``os.stat`` while nothing changed, so the worker can poll once per training
step; the file is read only when its identity (inode, size, modification time) changed.

Commands (:func:`parse_command` checks them and makes them typed, extra fields ignored;
:func:`encode_command` writes a typed one back):

``{"op": "pause", "seq": n}``
    Stop at the next step boundary, leave the process group and wait for the next command.

``{"op": "rejoin", "seq": n, "generation": g, "master_addr": a, "master_port": p, "rank": r,
"world_size": w, "source": s, "step": k}``
    Leave the current process group, join rendezvous generation ``g`` (its store listens at
    ``a:p``) as rank ``r`` of ``w``, take model, optimizer and data position from rank ``s``
    of the new group where this rank's state differs from it, check that every rank agrees,
    and continue by running step ``k`` (the first step not committed by ``s``).

``{"op": "dump", "seq": n}``
    Last words: a rank stopped at a step boundary (waiting for its next command) writes its
    committed state as a checkpoint of the whole job, alone and atomically, then goes on
    waiting (a stop or a rejoin follows).

``{"op": "stress", "seq": n, "round": t, "master_addr": a, "master_port": p, "rank": r,
"world_size": w}``
    Online stress test ``t``: a rank stopped at a step boundary joins a process group of its
    own for the test (its store at ``a:p``) as rank ``r`` of ``w``, checks its device and its
    links (:mod:`unbroken.protocol.stress`), writes its result to that store, leaves the
    group and goes on waiting (a rejoin follows).

Both ends live here (the agent's :class:`MailboxWriter`, the rank's :class:`MailboxReader`), so
the format is written once; the agent posts typed commands (:meth:`MailboxWriter.send`).
Standard library only: the agent uses it without torch.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from unbroken.protocol.wire import (
    GENERATION_MAX,
    INT64_MAX,
    NAME_MAX,
    RANK_MAX,
    STEP_MAX,
    ProtocolError,
    parse,
    show,
)

#: The environment variable that gives a rank its mailbox path.
MAILBOX = "UNBROKEN_MAILBOX"


class MailboxError(ProtocolError):
    """A mailbox file or command that is not what the protocol says it must be."""


class Op(StrEnum):
    """What a command asks a rank to do."""

    PAUSE = "pause"
    REJOIN = "rejoin"
    DUMP = "dump"
    STRESS = "stress"


@dataclass(frozen=True)
class Pause:
    """Stop at the next step boundary and wait for the next command."""

    seq: int

    @property
    def op(self) -> Op:
        return Op.PAUSE


@dataclass(frozen=True)
class Rejoin:
    """Join rendezvous generation ``generation``, repair from ``source``, run step ``step``."""

    seq: int
    generation: int
    master_addr: str
    master_port: int
    rank: int
    world_size: int
    source: int
    step: int
    #: The interface the new group's collectives use (``GLOO_SOCKET_IFNAME``); "": unchanged.
    ifname: str = ""

    @property
    def op(self) -> Op:
        return Op.REJOIN


@dataclass(frozen=True)
class Dump:
    """Write the last-words checkpoint of this rank's committed state, then keep waiting."""

    seq: int

    @property
    def op(self) -> Op:
        return Op.DUMP


@dataclass(frozen=True)
class Stress:
    """Run stress test ``round`` in a group of its own (store at ``master_addr:master_port``)
    as rank ``rank`` of ``world_size``, then keep waiting."""

    seq: int
    round: int
    master_addr: str
    master_port: int
    rank: int
    world_size: int

    @property
    def op(self) -> Op:
        return Op.STRESS


Command = Pause | Rejoin | Dump | Stress


def _int_field(data: Mapping[str, Any], name: str, low: int, high: int | None = None) -> int:
    if name not in data:
        raise MailboxError(f"mailbox command {data.get('op')!r} has no field {name!r}")
    value = data[name]
    if isinstance(value, bool) or not isinstance(value, int):
        raise MailboxError(f"mailbox command field {name}={show(value)} is not an integer")
    if value < low or (high is not None and value > high):
        allowed = f">= {low}" if high is None else f"in {low}..{high}"
        raise MailboxError(f"mailbox command field {name}={value} is not {allowed}")
    return value


def _ifname(data: Mapping[str, Any]) -> str:
    value = data.get("ifname") or ""
    if not isinstance(value, str) or len(value) > NAME_MAX:
        raise MailboxError(f"mailbox command field ifname={show(value)} is not an interface")
    return value


def parse_command(data: Mapping[str, Any]) -> Command:
    """The typed command of a decoded mailbox object; raises :class:`MailboxError`."""
    op = data.get("op")
    seq = _int_field(data, "seq", 1, INT64_MAX)
    if op == Op.PAUSE:
        return Pause(seq=seq)
    if op == Op.DUMP:
        return Dump(seq=seq)
    if op not in (Op.REJOIN, Op.STRESS):
        raise MailboxError(
            f"mailbox command op {show(op)} is not one of {', '.join(o.value for o in Op)}"
        )
    addr = data.get("master_addr")
    if not isinstance(addr, str) or not addr or len(addr) > NAME_MAX:
        raise MailboxError(f"mailbox command field master_addr={show(addr)} is not a host name")
    world_size = _int_field(data, "world_size", 1, RANK_MAX + 1)
    if op == Op.STRESS:
        return Stress(
            seq=seq,
            round=_int_field(data, "round", 1, GENERATION_MAX),
            master_addr=addr,
            master_port=_int_field(data, "master_port", 1, 65535),
            rank=_int_field(data, "rank", 0, world_size - 1),
            world_size=world_size,
        )
    return Rejoin(
        seq=seq,
        generation=_int_field(data, "generation", 0, GENERATION_MAX),
        master_addr=addr,
        master_port=_int_field(data, "master_port", 1, 65535),
        rank=_int_field(data, "rank", 0, world_size - 1),
        world_size=world_size,
        source=_int_field(data, "source", 0, world_size - 1),
        step=_int_field(data, "step", 0, STEP_MAX),
        ifname=_ifname(data),
    )


def encode_command(command: Command) -> dict[str, Any]:
    """The wire object of a typed command: ``op`` and every field (``seq`` too), so that
    ``parse_command(encode_command(c)) == c``."""
    return {"op": command.op.value, **dataclasses.asdict(command)}


def _read(path: Path) -> dict[str, Any] | None:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    try:
        data = parse(text, "its text")
    except ProtocolError as e:
        raise MailboxError(f"mailbox {path} does not hold a JSON command: {e}") from None
    if not isinstance(data, dict):
        raise MailboxError(f"mailbox {path} holds {type(data).__name__}, not a JSON object")
    return data


def _seq_of(path: Path, data: Mapping[str, Any]) -> int:
    seq = data.get("seq")
    if isinstance(seq, bool) or not isinstance(seq, int) or seq < 1:
        raise MailboxError(
            f"mailbox {path} holds a command with seq={show(seq)}, not an integer >= 1"
        )
    return seq


class MailboxWriter:
    """The agent's side: posts commands to one rank's mailbox file.

    Sequence numbers continue from a command already in the file, so a writer created again
    for the same mailbox (an agent that restarted) never reuses one.
    """

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        existing = _read(self.path)
        self._seq = 0 if existing is None else _seq_of(self.path, existing)

    @property
    def seq(self) -> int:
        """The sequence number of the last command posted (0: none)."""
        return self._seq

    @property
    def next_seq(self) -> int:
        """The sequence number of the next command posted."""
        return self._seq + 1

    def post(self, command: Mapping[str, Any]) -> int:
        """Write ``command`` (without ``seq``: the writer assigns it); returns its ``seq``.

        The command is checked with :func:`parse_command` first; a bad one raises
        :class:`MailboxError` and leaves the mailbox as it was.
        """
        if "seq" in command:
            raise MailboxError("a posted mailbox command must not carry 'seq': the writer sets it")
        return self._write({**command, "seq": self.next_seq})

    def send(self, command: Command) -> int:
        """Write the typed ``command`` in its wire form (:func:`encode_command`); its ``seq``
        must be :attr:`next_seq`. Returns its ``seq``.

        Checked as :meth:`post` checks a command: a bad one raises :class:`MailboxError` and
        leaves the mailbox as it was.
        """
        if command.seq != self.next_seq:
            raise MailboxError(
                f"mailbox command seq={command.seq} is not the next one, {self.next_seq}"
            )
        return self._write(encode_command(command))

    def _write(self, data: dict[str, Any]) -> int:
        """Check the wire object ``data`` (numbered :attr:`next_seq`) and replace the file's
        command with it; returns its ``seq``."""
        seq = parse_command(data).seq
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, sort_keys=True) + "\n", encoding="utf-8")
        os.replace(tmp, self.path)
        self._seq = seq
        return seq


class MailboxReader:
    """The rank's side: returns each command once, when its ``seq`` advanced.

    ``skip_existing=True`` treats a command already in the file as seen (a rank started
    normally must not act on a command meant for a process it replaced); a replacement
    process reads with ``skip_existing=False`` because its agent may post the command before
    the process starts.
    """

    def __init__(self, path: Path | str, *, skip_existing: bool = True) -> None:
        self.path = Path(path)
        self._identity: tuple[int, int, int] | None = None
        self._seen = 0
        if skip_existing:
            existing = _read(self.path)
            self._seen = 0 if existing is None else _seq_of(self.path, existing)

    @property
    def seen(self) -> int:
        """The ``seq`` of the newest command returned or skipped (0: none)."""
        return self._seen

    def poll(self) -> dict[str, Any] | None:
        """The newest command if it is newer than the last one returned, else None.

        Raises :class:`MailboxError` for a file that does not hold a command.
        """
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        identity = (st.st_ino, st.st_size, st.st_mtime_ns)
        if identity == self._identity:
            return None
        data = _read(self.path)
        if data is None:  # replaced between stat and read: the next poll sees the new file
            return None
        self._identity = identity
        seq = _seq_of(self.path, data)
        if seq <= self._seen:
            return None
        self._seen = seq
        return data
