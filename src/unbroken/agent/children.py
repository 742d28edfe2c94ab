"""This process's own children: the handle of one it forked, and the reaping of the rest.

:class:`OwnChild` is a child started by ``fork`` (not :mod:`subprocess`), with the part of
``Popen``'s interface the agents and the manager use; :func:`pid_exists` says whether a pid
names a process at all. An agent is a child subreaper (:func:`become_subreaper`): a rank its
zygote forks through an intermediate process that exits at once comes to the agent as its
child. A watcher that waits for a child by pid claims it (:func:`claim`); any other child that
exits is an orphaned descendant, and :func:`reap_orphans` reaps it. Standard library only.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import IO

_PR_SET_CHILD_SUBREAPER = 36
_subreaper: bool | None = None

#: Children of this process that a watcher waits for (ranks, zygotes); any other child that
#: exits is an orphaned descendant come to this subreaper, and :func:`reap_orphans` reaps it.
_waited: set[int] = set()
_orphans_seen: set[int] = set()


class OwnChild:
    """A child of this process started by ``fork`` (not :mod:`subprocess`), with the part of
    ``Popen``'s interface the agents and the manager use."""

    poll_s = 0.005  # how often wait() polls for the exit

    def __init__(self, pid: int, stdin: IO[bytes] | None = None) -> None:
        self.pid = pid
        self.stdin = stdin
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                self.returncode = -1  # reaped elsewhere: its status is unknown
                return self.returncode
            if pid == self.pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(str(self.pid), timeout or 0.0)
            time.sleep(self.poll_s)
        return code

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def pid_exists(pid: int) -> bool:
    """Whether a process (a zombie too) has the pid ``pid``."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def become_subreaper() -> bool:
    """Make this process a child subreaper (Linux): orphaned descendants become its children,
    so a rank the zygote forks (and whose parent exits at once) is this process's child. False
    where that is not possible."""
    global _subreaper
    if _subreaper is None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            _subreaper = libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
        except (OSError, AttributeError):
            _subreaper = False
    return _subreaper


def claim(pid: int) -> None:
    """A watcher waits for the child ``pid``: :func:`reap_orphans` leaves it alone."""
    _waited.add(pid)


def release(pid: int) -> None:
    """No watcher waits for ``pid`` any more (it was reaped, or is not to be waited for)."""
    _waited.discard(pid)


def _children() -> set[int]:
    out: set[int] = set()
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError), open(f"/proc/self/task/{tid}/children") as f:
            out.update(int(p) for p in f.read().split())
    return out


def reap_orphans() -> int:
    """Reap exited children nobody waits for: descendants of ranks whose parent died, which
    come to this process as their subreaper. A child must be seen exited and unclaimed on two
    calls first, since a rank the zygote forks is this process's child a moment before it
    hears the rank's pid. The number reaped."""
    global _orphans_seen
    if not _subreaper:
        return 0
    try:
        unclaimed = _children() - _waited
    except OSError:
        return 0
    exited = set()
    for pid in unclaimed:
        with contextlib.suppress(OSError, IndexError):
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                exited.add(pid)
    reaped = 0
    for pid in exited & _orphans_seen:
        with contextlib.suppress(ChildProcessError):
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                reaped += 1
    _orphans_seen = exited - _orphans_seen
    return reaped
