"""Where runs live: ``runs/<job>-<timestamp>/`` under the current directory by default.

A run directory belongs to one run: it is made, or taken over, mode 0700, and the run holds an
exclusive ``flock`` on its ``run.lock`` for its whole life, so a second ``unbroken run`` on it is
refused and ``unbroken status`` can tell a live run from one whose control plane is gone. An
existing directory is taken over only when it is the user's own and neither group nor others
may write it (:func:`check_own`); the same holds for ``control.json`` when it is read, and for
the token files of ``unbroken serve``. It
holds the ledger (``ledger.db``), the control plane's address and secret while the run is alive
(``control.json``, mode 0600), rank and agent logs (``pods/``), checkpoints (``checkpoints/``)
and the simulated device health (``devices/``).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import stat
import time
from pathlib import Path
from typing import Any

RUNS = Path("runs")
LOCK = "run.lock"
_LOCK_PATIENCE_S = 1.0  # a status probe holds the lock for microseconds; a run, for its life
_MAX_SAME_NAME = 1000


class RunDirError(ValueError):
    pass


class RunLock:
    """The run's hold on its directory, from :func:`claim_run_dir` until :meth:`release`."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the last descriptor releases the flock
            self._fd = None

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _cannot(path: Path, exc: OSError) -> RunDirError:
    return RunDirError(
        f"cannot use run directory {path}: {exc.strerror or exc} (choose another with --run-dir)"
    )


def _make_default(job: str, now: float | None) -> Path:
    """A new directory ``runs/<job>-<time>``, or ``-2``, ``-3``... after it when runs started
    in the same second took the name first (``mkdir`` decides, so two runs never share one)."""
    base = f"{job}-{time.strftime('%Y%m%d-%H%M%S', time.localtime(now))}"
    try:
        RUNS.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _cannot(RUNS / base, exc) from None
    for n in range(1, _MAX_SAME_NAME + 1):
        path = RUNS / (base if n == 1 else f"{base}-{n}")
        try:
            path.mkdir(mode=0o700)
        except FileExistsError:
            continue
        except OSError as exc:
            raise _cannot(path, exc) from None
        return path
    raise RunDirError(
        f"cannot make a run directory: {RUNS / base} and {_MAX_SAME_NAME - 1} more names "
        "after it are taken (choose one with --run-dir)"
    )


def _make_given(path: Path) -> None:
    """``path`` made mode 0700 (its parents too, as needed), or an existing directory of the
    user's own that neither group nor others may write."""
    try:
        path.mkdir(mode=0o700, parents=True)
    except FileExistsError:
        if not path.is_dir():
            raise _cannot(path, NotADirectoryError(errno.ENOTDIR, "Not a directory")) from None
        problem = ownership_problem(os.stat(path))
        if problem:
            raise RunDirError(
                f"run directory {path}: {problem} (choose another with --run-dir)"
            ) from None
    except OSError as exc:
        raise _cannot(path, exc) from None


def ownership_problem(st: os.stat_result) -> str:
    """Why a file or directory with status ``st`` is not the current user's alone to write
    ("" when it is): another user owns it, or group or others may write it."""
    me = os.geteuid()
    if st.st_uid != me:
        return f"owned by uid {st.st_uid}, not by this user (uid {me})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"writable by group or others (mode {stat.S_IMODE(st.st_mode):o})"
    return ""


def check_own(path: Path | None, what: str, missing_ok: bool = False) -> None:
    """Refuse ``path`` (named ``what`` in the one-line error, e.g. ``--secret-file``) unless it
    is the current user's and neither group nor others may write it; None passes, and so
    does a missing file when ``missing_ok`` (it will be made). Raises :class:`RunDirError`."""
    if path is None:
        return
    try:
        st = os.stat(path)
    except FileNotFoundError:
        if missing_ok:
            return
        raise RunDirError(f"{what} {path}: no such file") from None
    except OSError as exc:
        raise RunDirError(f"{what} {path}: {exc.strerror or exc}") from None
    problem = ownership_problem(st)
    if problem:
        raise RunDirError(f"{what} {path}: {problem}")


def _owner(fd: int) -> str:
    with contextlib.suppress(OSError, ValueError):
        return f" (pid {int(os.pread(fd, 32, 0).decode().strip())})"
    return ""


def _lock(path: Path) -> RunLock:
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path / LOCK, flags, 0o600)
    except OSError as exc:
        raise _cannot(path, exc) from None
    deadline = time.monotonic() + _LOCK_PATIENCE_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() > deadline:
                owner = _owner(fd)
                os.close(fd)
                raise RunDirError(
                    f"run directory {path} belongs to a live run{owner} "
                    "(choose another with --run-dir)"
                ) from None
            time.sleep(0.05)
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return RunLock(path, fd)


def claim_run_dir(job: str, given: Path | None, now: float | None = None) -> RunLock:
    """The run's directory, made or taken over, mode 0700, locked for this run.

    A new default name under ``./runs`` when ``given`` is None. Raises :class:`RunDirError`
    (one line) when the directory cannot be made or used, or another live run holds it.
    """
    path = _make_default(job, now) if given is None else given
    if given is not None:
        _make_given(given)
    lock = _lock(path)
    try:
        os.chmod(path, 0o700)
    except OSError as exc:
        lock.release()
        raise _cannot(path, exc) from None
    lock.path = path.resolve()
    return lock


def is_live(run: Path) -> bool:
    """Whether a process still owns the run: it holds ``run.lock`` (or, for a run directory
    without one, the pid in ``control.json`` is alive)."""
    try:
        fd = os.open(run / LOCK, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return _control_pid_alive(run)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # releases the probe's shared lock at once
    return False


def _control_pid_alive(run: Path) -> bool:
    try:
        pid = int(control_of(run).get("pid", 0))
    except (RunDirError, TypeError, ValueError):
        return False
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def find_run(given: Path | None) -> Path:
    """The run directory named, or the newest under ./runs."""
    if given is not None:
        if not (given / "ledger.db").exists():
            raise RunDirError(f"{given} is not a run directory (no ledger.db in it)")
        return given
    candidates = sorted(
        (p for p in RUNS.glob("*") if (p / "ledger.db").exists()),
        key=lambda p: (p / "ledger.db").stat().st_mtime,
    )
    if not candidates:
        raise RunDirError("no run found under ./runs; name one: unbroken status RUN_DIR")
    return candidates[-1]


def control_of(run: Path) -> dict[str, Any]:
    path = run / "control.json"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        raise RunDirError(f"run {run} is not running (no control.json)") from None
    except OSError as exc:
        raise RunDirError(f"{path}: unreadable: {exc}") from None
    with os.fdopen(fd, encoding="utf-8") as f:
        # The control plane's secret, and where to send it: only from a file of this user's
        # that no one else may write.
        problem = ownership_problem(os.fstat(f.fileno()))
        if problem:
            raise RunDirError(f"{path}: {problem}")
        try:
            data = json.load(f)
        except (OSError, ValueError) as exc:
            raise RunDirError(f"{path}: unreadable: {exc}") from None
    if not isinstance(data, dict) or "address" not in data or "secret" not in data:
        raise RunDirError(f"{path}: not a control file of this version")
    return data
