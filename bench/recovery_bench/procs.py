"""Child processes of a run: every descendant tracked to be killed by pid, output lines
time-stamped on arrival."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO


def _proc_table() -> dict[int, tuple[int, int]]:
    """pid -> (ppid, start time in clock ticks), from /proc."""
    table: dict[int, tuple[int, int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        table[int(entry.name)] = (int(fields[1]), int(fields[19]))
    return table


class Tracker:
    """Remembers every descendant of the processes it is given, so that all of them can be
    killed by pid at the end, orphans included (torchrun starts workers in their own sessions).
    A pid is only signalled while its start time is still the remembered one."""

    def __init__(self) -> None:
        self.roots: list[int] = []
        self.seen: dict[int, int] = {}  # pid -> start time
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def add_root(self, pid: int) -> None:
        with self._lock:
            self.roots.append(pid)
        self.scan()

    def scan(self) -> None:
        table = _proc_table()
        children: dict[int, list[int]] = {}
        for pid, (ppid, _) in table.items():
            children.setdefault(ppid, []).append(pid)
        with self._lock:
            todo = list(self.roots)
            while todo:
                pid = todo.pop()
                if pid in table:
                    self.seen.setdefault(pid, table[pid][1])
                todo.extend(children.get(pid, ()))

    def _watch(self) -> None:
        while not self._stop.wait(0.2):
            self.scan()

    def alive(self) -> list[int]:
        table = _proc_table()
        with self._lock:
            return [p for p, st in self.seen.items() if table.get(p, (0, -1))[1] == st]

    def kill_all(self, deadline_s: float = 10.0) -> list[int]:
        """SIGKILL every remembered process still alive; the pids that were."""
        self.scan()
        self._stop.set()
        self._thread.join()
        victims = [p for p in self.alive() if p != os.getpid()]
        for pid in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        end = time.monotonic() + deadline_s
        while self.alive() and time.monotonic() < end:
            time.sleep(0.05)
        return victims


class Tapped:
    """A child process whose output lines are time-stamped on arrival and saved to a log."""

    def __init__(self, cmd: Sequence[str], log: Path, env: dict[str, str], cwd: Path) -> None:
        self.lines: list[tuple[float, str]] = []
        self._log: TextIO = open(log, "w")  # noqa: SIM115
        self.proc = subprocess.Popen(
            list(cmd),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=cwd,
            text=True,
            errors="replace",
            start_new_session=True,
        )
        self._thread = threading.Thread(target=self._pump, daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            now = time.time()
            self.lines.append((now, line.rstrip("\n")))
            self._log.write(f"{now:.6f} {line}")
        self._log.flush()

    def close(self) -> None:
        self._thread.join(timeout=5)
        self._log.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def base_env() -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("BENCH_KILL", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE")
        and not k.startswith(("UNBROKEN_", "TORCHELASTIC_"))
    }
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    return env
