"""One training rank as its own OS process, so one rank can be stopped or restarted alone.

A rank's stdout and stderr go to its own log file per incarnation. When a rank exits, a
:class:`RankExit` says how: a signal (SIGKILL from outside, a node loss), a non-zero exit with the
Python traceback taken from the log, or success. A rank that died because a *peer* died (its
collective failed) is marked ``peer_failure`` so the manager can tell the first fault from its
echoes. A rank that uses the worker API says so itself, as data: its exception hook writes an
exit report (:mod:`unbroken.protocol.exitreport`) with the exception's class and whether a
collective failed under it; only for a script without it are the traceback's words read.

A rank starts either as a new Python process or forked from the agent's zygote
(:mod:`unbroken.agent.standby`, torch already imported). A forked rank is the agent's child
too: the agent is a child subreaper and the zygote forks through an intermediate process that
exits at once, so the exit status (negative for a signal, as :class:`subprocess.Popen` says it)
comes from the agent's own ``waitpid`` of that pid, in the rank's watcher thread and nowhere
else; :func:`unbroken.agent.children.reap_orphans` reaps only children no watcher claims.
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from unbroken.agent.children import OwnChild, become_subreaper, claim, pid_exists, release
from unbroken.protocol.exitreport import is_collective_error_text
from unbroken.protocol.kinds import StepFailure

log = logging.getLogger(__name__)


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
    #: What the rank itself said of its end (:mod:`unbroken.protocol.exitreport`, or the failure
    #: of the step it was stopped in): None when it said nothing.
    reported_failure: StepFailure | None = None
    exception: str = ""  # the class of the exception that ended it, as the rank reported it
    device_code: str = ""  # the device error code it carried (``CUDA-710``), as reported

    @property
    def peer_failure(self) -> bool:
        """The rank failed because a collective did (a peer went away): what the rank reported,
        else (a script without the worker API) what its traceback's words say."""
        if not (self.returncode > 0 or self.ended_after_failure):
            return False
        if self.reported_failure is not None:
            return self.reported_failure is StepFailure.COLLECTIVE
        return is_peer_failure(self.traceback)

    def describe(self) -> str:
        if self.succeeded:
            return "exited 0"
        if self.signal_name:
            return f"killed by {self.signal_name}"
        last = self.traceback.strip().splitlines()[-1:] or [""]
        return f"exited {self.returncode}" + (f": {last[0]}" if last[0] else "")


def is_peer_failure(traceback_text: str) -> bool:
    """The fallback for a rank that reported nothing (a script without the worker API): its
    traceback's words are those of a failed collective."""
    return is_collective_error_text(traceback_text)


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


class _Spawn:
    """A rank ordered from a zygote: its pid once forked, None if the zygote could not."""

    def __init__(self) -> None:
        self.pid: int | None = None
        self._done = threading.Event()

    def resolve(self, pid: int | None) -> None:
        self.pid = pid
        self._done.set()

    def wait(self) -> int | None:
        self._done.wait()
        return self.pid

    def forked(self) -> int | None:
        """The pid if the zygote has said it already, else None (no waiting)."""
        return self.pid if self._done.is_set() else None


class Zygote:
    """The agent's side of a zygote (:mod:`unbroken.agent.standby`): orders go out on its
    stdin from a writer thread (the agent never blocks on a zygote still importing), replies
    come back on a pipe to a reader thread, one per order, in order."""

    def __init__(self, proc: subprocess.Popen[bytes] | OwnChild, replies: int) -> None:
        self.proc = proc
        self.pid = proc.pid
        self._replies = replies
        self._lock = threading.Lock()
        self._pending: collections.deque[_Spawn] = collections.deque()
        self._outbox: queue.Queue[bytes | None] = queue.Queue()
        self._ready = threading.Event()
        self._gone = False
        threading.Thread(target=self._write, name="zygote-orders", daemon=True).start()
        threading.Thread(target=self._read, name="zygote-replies", daemon=True).start()

    @property
    def alive(self) -> bool:
        return not self._gone and self.proc.poll() is None

    @property
    def ready(self) -> bool:
        """Its imports are done: an order now is forked in milliseconds."""
        return self._ready.is_set() and self.alive

    def wait_ready(self, timeout_s: float | None = None) -> bool:
        return self._ready.wait(timeout_s) and self.alive

    def order(self, order: Mapping[str, object]) -> _Spawn:
        spawn = _Spawn()
        with self._lock:
            if self._gone:
                spawn.resolve(None)
            else:
                self._pending.append(spawn)
                self._outbox.put((json.dumps(order) + "\n").encode())
        return spawn

    def _write(self) -> None:
        stdin = self.proc.stdin
        assert stdin is not None
        while (line := self._outbox.get()) is not None:
            try:
                stdin.write(line)
                stdin.flush()
            except (OSError, ValueError):
                break  # the zygote is gone; its reply pipe says so
        with contextlib.suppress(OSError, ValueError):
            stdin.close()

    def _read(self) -> None:
        with os.fdopen(self._replies, "rb") as replies:
            for raw in replies:
                line = raw.decode(errors="replace").strip()
                if line == "ready":
                    self._ready.set()
                    continue
                pid = int(line[4:]) if line.startswith("pid ") and line[4:].isdigit() else None
                if pid is not None:
                    claim(pid)
                with self._lock:
                    spawn = self._pending.popleft() if self._pending else None
                if spawn is not None:
                    spawn.resolve(pid)
                if line.startswith("error"):
                    log.warning("zygote %d: %s", self.pid, line)
        with self._lock:
            self._gone = True
            pending, self._pending = list(self._pending), collections.deque()
        for spawn in pending:
            spawn.resolve(None)

    def close(self, timeout_s: float = 2.0) -> None:
        """Let the zygote go: end of its input, and it exits. One that still has orders to
        serve would fork ranks nobody waits for: it is killed at once, with its process group
        (an intermediate process it is forking with)."""
        self._outbox.put(None)
        with self._lock:
            pending = bool(self._pending)
        try:
            self.proc.wait(0.0 if pending else timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signal.SIGKILL)
            self.proc.wait()
        release(self.pid)


def _end_group(pid: int) -> None:
    """Once the rank ``pid`` exited, and before it is reaped (while its pid still names its
    process group): kill what it left in its group. A rank's data loader workers are forked
    with its gloo sockets, and while one lives on, the peers never see the dead rank's links
    close: they would wait out the collective's timeout instead of failing at once. A rank is
    a session leader, so its group holds its own descendants only."""
    try:
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
    except ChildProcessError:
        return  # not this process's child: its group is not ours to end
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


class RankProcess:
    """A started rank. ``on_exit`` is called once, from a watcher thread, when it exits.

    With a ``zygote`` the rank is forked from it and comes to this process as an orphan (this
    process is a child subreaper); until the zygote says its pid (milliseconds, or the rest of
    the zygote's imports) the rank is *pending*: ``pid`` is 0. A pending rank that is signalled
    never runs: it counts as ended by that signal at once (``pid`` 0 in its exit) and its
    process, when it comes, is killed. If the zygote dies before forking it, the rank is started
    as a new process instead."""

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
        zygote: Zygote | None = None,
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
        self._argv, self._env = argv, dict(env)
        self._lock = threading.Lock()
        self._exited = threading.Event()
        self._ended_pending: signal.Signals | None = None
        self._returncode: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._spawn: _Spawn | None = None
        self.pid = 0
        if zygote is not None and zygote.alive:
            module = "-m" in argv[:3]
            rest = argv[3:] if module else argv[2:]
            self._spawn = zygote.order(
                {
                    "argv": rest,
                    "module": module,
                    "env": self._env,
                    "cwd": os.getcwd(),
                    "log": str(log_path),
                }
            )
        else:
            self._start_cold()
        self._on_exit = on_exit
        self._watcher = threading.Thread(target=self._watch, name=f"rank{rank}-watch", daemon=True)
        self._watcher.start()

    def _start_cold(self) -> None:
        self._proc = subprocess.Popen(
            self._argv,
            env=self._env,
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        claim(self._proc.pid)
        self.pid = self._proc.pid

    @property
    def pending(self) -> bool:
        """Ordered from a zygote that has not said the rank's pid yet."""
        with self._lock:
            self._take_forked_pid()
            return self.pid == 0 and self._ended_pending is None and not self._exited.is_set()

    def _take_forked_pid(self) -> None:
        """With the lock held: the pid the zygote said, before the watcher thread takes it (a
        rank whose pid is known is never treated as pending)."""
        if self.pid == 0 and self._spawn is not None and self._ended_pending is None:
            self.pid = self._spawn.forked() or 0

    def _watch(self) -> None:
        if self._spawn is not None:
            pid = self._spawn.wait()
            with self._lock:
                ended = self._ended_pending
                if ended is None and pid is not None:
                    self.pid = pid
                elif ended is None:
                    log.warning("rank %d: the zygote is gone; starting it anew", self.rank)
                    try:
                        self._start_cold()
                    except OSError as exc:
                        self._log_file.write(f"cannot start the rank: {exc}\n".encode())
                        self._report(1)
                        return
            if ended is not None:
                if pid is not None:  # too late: it was ended before it came
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                    with contextlib.suppress(ChildProcessError):
                        os.waitpid(pid, 0)
                    release(pid)
                return
        _end_group(self._proc.pid if self._proc is not None else self.pid)
        returncode = self._proc.wait() if self._proc is not None else self._reap(self.pid)
        release(self.pid)
        self._report(returncode)

    def _reap(self, pid: int) -> int:
        """Wait for a forked rank (this process's child by reparenting) and reap it; no
        signal is sent to its pid once it is reaped."""
        try:
            os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
            with self._lock:
                _, status = os.waitpid(pid, 0)
                self._returncode = os.waitstatus_to_exitcode(status)
                return self._returncode
        except ChildProcessError:  # not this process's child: no subreaper after all
            log.error("rank %d (pid %d) is not this process's child", self.rank, pid)
            while pid_exists(pid):
                time.sleep(0.1)
            with self._lock:
                self._returncode = 1
                return 1

    def _report(self, returncode: int) -> None:
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
        self._exited.set()

    @property
    def alive(self) -> bool:
        if self._exited.is_set() or self._ended_pending is not None:
            return False
        if self._proc is not None:
            return self._proc.poll() is None
        return self._returncode is None

    def signal(self, sig: signal.Signals) -> None:
        with self._lock:
            if self._ended_pending is not None:
                return
            self._take_forked_pid()
            if self.pid == 0:  # pending: it never runs
                self._ended_pending = sig
            elif self._proc is None:
                if self._returncode is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(self.pid, sig)
                return
        if self._ended_pending is not None:
            self._report(-int(sig))
        elif self.alive:
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
        return self._exited.wait(timeout_s)


#: A zygote forked with this agent from the node's image (:mod:`unbroken.agent.image`), and
#: the log it writes to, until :func:`start_zygote` takes it over.
_prestarted: tuple[Zygote, Path] | None = None


def prestarted(proc: OwnChild, replies: int, log_path: Path) -> None:
    """Keep the zygote ``proc`` (orders on its stdin, replies on ``replies``) that this
    process forked from itself with torch already imported, for :func:`start_zygote`."""
    global _prestarted
    claim(proc.pid)
    _prestarted = (Zygote(proc, replies), log_path)


def start_zygote(
    env: Mapping[str, str], log_path: Path, *, background: bool = False
) -> Zygote | None:
    """A zygote (torch imported, forking ranks on order: :mod:`unbroken.agent.standby`) that
    logs to ``log_path``; ``background``: it warms up at the lowest priority. None where this
    process cannot be the parent of the ranks it forks (no child subreaper). The zygote this
    agent was forked with from the node's image is taken when it logs to ``log_path``."""
    global _prestarted
    if _prestarted is not None:
        zygote, path = _prestarted
        _prestarted = None
        if path.resolve() == log_path.resolve() and zygote.alive:
            return zygote
        zygote.close()
    if not become_subreaper():
        log.warning("no child subreaper here: ranks start without a zygote")
        return None
    log_path.parent.mkdir(parents=True, exist_ok=True)
    replies, reply_end = os.pipe()
    try:
        with log_path.open("ab") as out:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-u",
                    "-m",
                    "unbroken.agent.standby",
                    "--reply-fd",
                    str(reply_end),
                    *(["--background"] if background else []),
                ],
                env=dict(env),
                stdin=subprocess.PIPE,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                pass_fds=(reply_end,),
            )
    except OSError:
        os.close(replies)
        raise
    finally:
        os.close(reply_end)
    claim(proc.pid)
    return Zygote(proc, replies)


def rank_argv(
    script: str, script_args: tuple[str, ...], module: bool, no_python: bool
) -> list[str]:
    if no_python:
        return [script, *script_args]
    if module:
        return [sys.executable, "-u", "-m", script, *script_args]
    return [sys.executable, "-u", script, *script_args]
