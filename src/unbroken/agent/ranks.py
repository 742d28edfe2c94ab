"""One training rank as its own OS process, so one rank can be stopped or restarted alone.

A rank's stdout and stderr go to its own log file per incarnation. When a rank exits, a
:class:`RankExit` says how: a signal (SIGKILL from outside, a node loss), a non-zero exit with the
Python traceback taken from the log, or success. A rank that died because a *peer* died (gloo
reports the closed connection) is marked ``peer_failure`` so the manager can tell the first fault
from its echoes.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

#: Phrases with which gloo/c10d report that the failure came from another rank.
_PEER_FAILURE_MARKERS = (
    "Connection closed by peer",
    "Connection reset by peer",
    "Broken pipe",
    "Socket closed",
    "Connection refused",
    "connectFullMesh",
    "Timed out waiting",
    "Gloo",
    "ProcessGroupGloo",
    "DistBackendError",
    "DistNetworkError",
)


@dataclass(frozen=True)
class RankExit:
    rank: int
    local_rank: int
    pid: int
    generation: int
    returncode: int
    at: float
    traceback: str = ""

    @property
    def signal_name(self) -> str | None:
        if self.returncode < 0:
            try:
                return signal.Signals(-self.returncode).name
            except ValueError:
                return f"signal {-self.returncode}"
        return None

    @property
    def succeeded(self) -> bool:
        return self.returncode == 0

    ended_after_failure: bool = False  # its agent killed it once its training loop had failed

    @property
    def peer_failure(self) -> bool:
        """The rank failed because a peer did (its traceback is a collective/network error)."""
        return (self.returncode > 0 or self.ended_after_failure) and is_peer_failure(self.traceback)

    def describe(self) -> str:
        if self.succeeded:
            return "exited 0"
        if self.signal_name:
            return f"killed by {self.signal_name}"
        last = self.traceback.strip().splitlines()[-1:] or [""]
        return f"exited {self.returncode}" + (f": {last[0]}" if last[0] else "")


def is_peer_failure(traceback_text: str) -> bool:
    last_lines = "\n".join(traceback_text.strip().splitlines()[-6:])
    return any(marker in last_lines for marker in _PEER_FAILURE_MARKERS)


def extract_traceback(log_path: Path, max_bytes: int = 64 * 1024, start: int = 0) -> str:
    """The last Python traceback in a log file after byte ``start`` (or the tail when there
    is none)."""
    try:
        with log_path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(start, size - max_bytes))
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    start = text.rfind("Traceback (most recent call last):")
    if start >= 0:
        return text[start:].strip()
    return "\n".join(text.strip().splitlines()[-20:])


class RankProcess:
    """A started rank. ``on_exit`` is called once, from a watcher thread, when it exits."""

    def __init__(
        self,
        *,
        rank: int,
        local_rank: int,
        generation: int,
        argv: list[str],
        env: Mapping[str, str],
        log_path: Path,
        on_exit: Callable[[RankExit], None],
        standby: subprocess.Popen[bytes] | None = None,
    ) -> None:
        self.rank = rank
        self.local_rank = local_rank
        self.generation = generation
        self.log_path = log_path
        self.started_at = time.time()
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log_file = log_path.open("ab")
        self._log_file.write(
            f"=== rank {rank} generation {generation} started at {self.started_at:.3f}\n".encode()
        )
        self._log_file.flush()
        self.log_start = self._log_file.tell()  # this incarnation's output starts here
        if standby is not None and standby.poll() is None and standby.stdin is not None:
            # A warm process with torch imported takes the rank (see unbroken.agent.standby).
            module = "-m" in argv[:3]
            rest = argv[3:] if module else argv[2:]
            order = {
                "argv": rest,
                "module": module,
                "env": dict(env),
                "cwd": os.getcwd(),
                "log": str(log_path),
            }
            standby.stdin.write((json.dumps(order) + "\n").encode())
            standby.stdin.close()
            self._proc = standby
        else:
            self._proc = subprocess.Popen(
                argv,
                env=dict(env),
                stdin=subprocess.DEVNULL,
                stdout=self._log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.pid = self._proc.pid
        self._on_exit = on_exit
        self._watcher = threading.Thread(target=self._watch, name=f"rank{rank}-watch", daemon=True)
        self._watcher.start()

    def _watch(self) -> None:
        returncode = self._proc.wait()
        at = time.time()
        self._log_file.close()
        text = "" if returncode == 0 else extract_traceback(self.log_path, start=self.log_start)
        self._on_exit(
            RankExit(
                rank=self.rank,
                local_rank=self.local_rank,
                pid=self.pid,
                generation=self.generation,
                returncode=returncode,
                at=at,
                traceback=text,
            )
        )

    @property
    def alive(self) -> bool:
        return self._proc.poll() is None

    def signal(self, sig: signal.Signals) -> None:
        if self.alive:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)

    def traceback(self) -> str:
        """The traceback this incarnation has printed so far ("" when none)."""
        text = extract_traceback(self.log_path, start=self.log_start)
        return text if text.startswith("Traceback") else ""

    def wait(self, timeout_s: float | None = None) -> bool:
        """Wait for the exit to be observed (and reported); True if it exited in time."""
        self._watcher.join(timeout_s)
        return not self._watcher.is_alive()


def start_standby(
    env: Mapping[str, str], log_path: Path, *, background: bool = False
) -> subprocess.Popen[bytes]:
    """A warm standby process (torch imported, waiting on stdin to become a rank);
    ``background``: it warms up at the lowest priority (see :mod:`unbroken.agent.standby`)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        return subprocess.Popen(
            [
                sys.executable,
                "-u",
                "-m",
                "unbroken.agent.standby",
                *(["--background"] if background else []),
            ],
            env=dict(env),
            stdin=subprocess.PIPE,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def rank_argv(
    script: str, script_args: tuple[str, ...], module: bool, no_python: bool
) -> list[str]:
    if no_python:
        return [script, *script_args]
    if module:
        return [sys.executable, "-u", "-m", script, *script_args]
    return [sys.executable, "-u", script, *script_args]
