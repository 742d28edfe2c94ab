"""The ledger: a run's events and status snapshot in one SQLite file.

The file is in WAL mode, so ``unbroken status`` and ``unbroken events`` in other processes read
while the run writes, without blocking it. One :class:`Ledger` may be shared by the threads of
a process (calls are serialised on a lock). Records are append-only; ids are increasing and
never reused, so a reader resumes with ``events(since_id=last_seen)``.

A file is recognised as a ledger by its SQLite ``application_id`` and carries its schema
version in ``user_version``; anything else is refused with a message that names the path.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from unbroken.ledger.codec import DecodeError, decode, encode, from_data, to_json_value
from unbroken.ledger.events import Event
from unbroken.ledger.status import JobStatus

log = logging.getLogger(__name__)

#: Version of the tables below; a file with a higher version is refused.
SCHEMA_VERSION = 1
#: SQLite ``application_id`` of a ledger file ("Unbr").
APPLICATION_ID = 0x556E6272
_SQLITE_HEADER = b"SQLite format 3\x00"

_SCHEMA = """
CREATE TABLE events (
    id   INTEGER PRIMARY KEY AUTOINCREMENT,
    at   REAL NOT NULL,
    kind TEXT NOT NULL,
    data TEXT NOT NULL
);
CREATE INDEX events_kind ON events (kind, id);
CREATE TABLE status (
    id   INTEGER PRIMARY KEY CHECK (id = 1),
    data TEXT NOT NULL
);
"""


class LedgerError(RuntimeError):
    """The ledger cannot be opened, read or written; the message names the path and why."""


@dataclass(frozen=True)
class Record:
    """One stored event: ``at`` is when it was recorded (wall clock), ``data`` its fields."""

    id: int
    at: float
    kind: str
    data: dict[str, Any]

    def event(self) -> Event | None:
        """The typed event, or None for a kind written with ``record_raw`` and no class."""
        return decode(self.kind, self.data)


KindFilter = Iterable[str | type[Event]]


class Ledger:
    """The event store of one run (see the module doc).

    ``create=False`` opens an existing ledger only (what a reader wants): a missing file is an
    error instead of a new empty ledger.
    """

    def __init__(self, path: Path | str, *, create: bool = True) -> None:
        self._path = Path(path)
        self._lock = threading.RLock()
        self._conn: sqlite3.Connection | None = _open(self._path, create)

    @property
    def path(self) -> Path:
        return self._path

    # -- writing ---------------------------------------------------------------------------

    def record(self, event: Event, at: float | None = None) -> int:
        """Append a typed event; return its id. ``at`` defaults to now (wall clock)."""
        return self._insert(event.kind, encode(event), at)

    def record_raw(self, kind: str, data: Mapping[str, Any], at: float | None = None) -> int:
        """Append an event that has no class here; ``data`` must be JSON-ready."""
        if not kind:
            raise ValueError("an event kind must be a non-empty string")
        try:
            payload = to_json_value(data)
        except TypeError as exc:
            raise TypeError(f"{kind} event: {exc}") from None
        return self._insert(kind, payload, at)

    def set_status(self, status: JobStatus) -> None:
        """Replace the status snapshot."""
        self.set_status_text(json.dumps(encode_status(status), separators=(",", ":")))

    def set_status_text(self, text: str) -> None:
        """Replace the status snapshot with ``text``, a status already encoded as
        :meth:`set_status` encodes it (:class:`unbroken.manager.snapshot.StatusText`)."""
        with self._lock:
            self._execute("INSERT OR REPLACE INTO status (id, data) VALUES (1, ?)", (text,))

    # -- reading ---------------------------------------------------------------------------

    def events(
        self, since_id: int = 0, kinds: KindFilter | None = None, limit: int | None = None
    ) -> list[Record]:
        """Records with id > ``since_id``, oldest first, optionally of some kinds only."""
        sql = "SELECT id, at, kind, data FROM events WHERE id > ?"
        params: list[Any] = [since_id]
        if kinds is not None:
            names = sorted({k if isinstance(k, str) else k.kind for k in kinds})
            if not names:
                return []
            sql += f" AND kind IN ({', '.join('?' * len(names))})"
            params.extend(names)
        sql += " ORDER BY id"
        if limit is not None:
            sql += " LIMIT ?"
            params.append(limit)
        with self._lock:
            rows = self._execute(sql, params).fetchall()
        return [self._record(row) for row in rows]

    def kinds(self) -> set[str]:
        """The kinds of the records stored."""
        with self._lock:
            rows = self._execute("SELECT DISTINCT kind FROM events").fetchall()
        return {str(row[0]) for row in rows}

    def last_id(self) -> int:
        """Id of the newest record (0 when there is none)."""
        with self._lock:
            row = self._execute("SELECT COALESCE(MAX(id), 0) FROM events").fetchone()
        return int(row[0])

    def follow(
        self,
        since_id: int = 0,
        kinds: KindFilter | None = None,
        *,
        poll_s: float = 0.2,
        stop: threading.Event | None = None,
    ) -> Iterator[Record]:
        """Yield records as they are written, until ``stop`` is set (or the caller stops)."""
        kind_list = None if kinds is None else list(kinds)
        stopped = stop if stop is not None else threading.Event()
        last = since_id
        while not stopped.is_set():
            batch = self.events(since_id=last, kinds=kind_list, limit=1000)
            for rec in batch:
                last = rec.id
                yield rec
            if not batch:
                stopped.wait(poll_s)

    def status(self) -> JobStatus | None:
        """The status snapshot, or None before the first ``set_status``."""
        with self._lock:
            row = self._execute("SELECT data FROM status WHERE id = 1").fetchone()
        if row is None:
            return None
        try:
            return from_data(JobStatus, json.loads(row[0]))
        except (ValueError, DecodeError) as exc:
            raise LedgerError(f"ledger {self._path}: unreadable status snapshot: {exc}") from None

    # -- lifetime --------------------------------------------------------------------------

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals -------------------------------------------------------------------------

    def _insert(self, kind: str, data: Any, at: float | None) -> int:
        text = json.dumps(data, separators=(",", ":"), allow_nan=False)
        stamp = time.time() if at is None else at
        with self._lock:
            cur = self._execute(
                "INSERT INTO events (at, kind, data) VALUES (?, ?, ?)", (stamp, kind, text)
            )
        rowid = cur.lastrowid
        assert rowid is not None
        return rowid

    def _execute(self, sql: str, params: Iterable[Any] = ()) -> sqlite3.Cursor:
        if self._conn is None:
            raise LedgerError(f"ledger {self._path} is closed")
        try:
            return self._conn.execute(sql, tuple(params))
        except sqlite3.Error as exc:
            raise LedgerError(f"ledger {self._path}: {exc}") from exc

    def _record(self, row: tuple[Any, ...]) -> Record:
        rid, at, kind, text = row
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise LedgerError(f"ledger {self._path}: record {rid} is not JSON: {exc}") from None
        if not isinstance(data, dict):
            raise LedgerError(f"ledger {self._path}: record {rid} is not a JSON object")
        return Record(id=int(rid), at=float(at), kind=str(kind), data=data)


def encode_status(status: JobStatus) -> dict[str, Any]:
    data = to_json_value(status)
    assert isinstance(data, dict)
    return data


def _open(path: Path, create: bool) -> sqlite3.Connection:
    if path.is_dir():
        raise LedgerError(f"cannot open ledger {path}: it is a directory")
    if path.exists():
        _check_header(path)
    elif not create:
        raise LedgerError(f"no ledger at {path}")
    else:
        _prepare_directory(path)
    try:
        conn = sqlite3.connect(
            str(path), timeout=30.0, isolation_level=None, check_same_thread=False
        )
    except sqlite3.Error as exc:
        raise LedgerError(f"cannot open ledger {path}: {exc}") from None
    try:
        _check_or_create_schema(conn, path, create)
    except sqlite3.Error as exc:
        conn.close()
        code = getattr(exc, "sqlite_errorcode", None)
        if code in (sqlite3.SQLITE_NOTADB, sqlite3.SQLITE_CORRUPT):
            raise LedgerError(f"{path} is not an unbroken ledger: {exc}") from None
        raise LedgerError(f"cannot open ledger {path}: {exc}") from None
    except BaseException:
        conn.close()
        raise
    return conn


def _check_header(path: Path) -> None:
    try:
        with path.open("rb") as f:
            head = f.read(len(_SQLITE_HEADER))
    except OSError as exc:
        raise LedgerError(f"cannot read ledger {path}: {exc.strerror or exc}") from None
    if head and head != _SQLITE_HEADER[: len(head)]:
        raise LedgerError(f"{path} is not an unbroken ledger: not an SQLite database")


def _prepare_directory(path: Path) -> None:
    parent = path.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise LedgerError(
            f"cannot create ledger {path}: {_first_non_directory(parent)} is not a directory"
        ) from None
    except OSError as exc:
        raise LedgerError(
            f"cannot create ledger {path}: cannot create directory {parent}: {exc.strerror or exc}"
        ) from None
    if not os.access(parent, os.W_OK | os.X_OK):
        raise LedgerError(f"cannot create ledger {path}: directory {parent} is not writable")


def _first_non_directory(path: Path) -> Path:
    for candidate in reversed((path, *path.parents)):
        if candidate.exists() and not candidate.is_dir():
            return candidate
    return path


def _check_or_create_schema(conn: sqlite3.Connection, path: Path, create: bool) -> None:
    app_id, version, tables = _identity(conn, "BEGIN")
    if app_id == 0 and version == 0 and not tables:
        if not create:
            raise LedgerError(f"{path} is not an unbroken ledger: it is an empty database")
        # Another process may be creating the same ledger: decide again under the write lock.
        app_id, version, tables = _identity(conn, "BEGIN IMMEDIATE", keep_open=True)
        try:
            if app_id == 0 and version == 0 and not tables:
                for statement in _SCHEMA.split(";"):
                    if statement.strip():
                        conn.execute(statement)
                conn.execute(f"PRAGMA application_id={APPLICATION_ID}")
                conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
                app_id, version = APPLICATION_ID, SCHEMA_VERSION
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
    if app_id != APPLICATION_ID:
        raise LedgerError(
            f"{path} is not an unbroken ledger: it is an SQLite database of another application"
        )
    if version > SCHEMA_VERSION:
        raise LedgerError(
            f"{path} was written by a newer unbroken (ledger schema {version}; "
            f"this version reads schema {SCHEMA_VERSION}); upgrade unbroken to read it"
        )
    if version < 1:
        raise LedgerError(f"{path} is not an unbroken ledger: unknown schema version {version}")
    if create:
        mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            log.warning("ledger %s: journal mode is %s, not wal; readers may wait", path, mode)
    conn.execute("PRAGMA synchronous=NORMAL")


def _identity(
    conn: sqlite3.Connection, begin: str, keep_open: bool = False
) -> tuple[int, int, list[str]]:
    """Application id, schema version and tables, read in one transaction (one snapshot)."""
    conn.execute(begin)
    try:
        app_id = int(conn.execute("PRAGMA application_id").fetchone()[0])
        version = int(conn.execute("PRAGMA user_version").fetchone()[0])
        rows = conn.execute("SELECT name FROM sqlite_master WHERE type='table'").fetchall()
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    if not keep_open:
        conn.execute("COMMIT")
    return app_id, version, [str(r[0]) for r in rows]
