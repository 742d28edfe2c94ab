"""Faults a rank injects into itself at an exact step (``--chaos`` entries keyed by step).

The job manager hands each rank its entries in ``UNBROKEN_CHAOS`` (JSON) and a directory in
``UNBROKEN_CHAOS_DIR``. Before the rank starts step index ``at_step`` (that is, right after it
committed ``at_step`` steps) the entry fires: ``kill`` sends SIGKILL to the process itself,
``hang`` SIGSTOP, ``exception`` raises :class:`InjectedFault` from the training loop. Each entry
fires at most once per run, whatever the number of restarts that replay the step: the first
rank to fire creates ``fired-<index>`` in the chaos directory with O_EXCL.

In a managed rank, SIGUSR1 raises :class:`InjectedFault` in the main thread too, so
``unbroken inject exception`` produces a real Python exception with its traceback.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

CHAOS = "UNBROKEN_CHAOS"
CHAOS_DIR = "UNBROKEN_CHAOS_DIR"


class InjectedFault(RuntimeError):
    """A fault injected on purpose (``unbroken inject exception`` or a chaos entry)."""


@dataclass(frozen=True)
class _Entry:
    index: int
    kind: str
    at_step: int


class RankChaos:
    def __init__(self, rank: int, entries: tuple[_Entry, ...], fired_dir: Path) -> None:
        self.rank = rank
        self.entries = {e.at_step: e for e in entries}
        self.fired_dir = fired_dir

    @staticmethod
    def from_env(rank: int, env: Mapping[str, str]) -> RankChaos | None:
        text, where = env.get(CHAOS), env.get(CHAOS_DIR)
        if not text or not where:
            return None
        entries = tuple(
            _Entry(int(e["index"]), str(e["kind"]), int(e["at_step"]))
            for e in json.loads(text)
            if e.get("rank") == rank and e.get("at_step") is not None
        )
        return RankChaos(rank, entries, Path(where)) if entries else None

    def before_step(self, step: int) -> None:
        entry = self.entries.get(step)
        if entry is None or not self._claim(entry):
            return
        if entry.kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif entry.kind == "hang":
            os.kill(os.getpid(), signal.SIGSTOP)
        elif entry.kind == "exception":
            raise InjectedFault(f"injected exception in rank {self.rank} before step {step}")

    def _claim(self, entry: _Entry) -> bool:
        self.fired_dir.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(self.fired_dir / f"fired-{entry.index}", os.O_CREAT | os.O_EXCL)
        except FileExistsError:
            return False
        os.close(fd)
        return True


def _raise_injected(signum: int, frame: FrameType | None) -> None:
    raise InjectedFault(f"injected exception (signal {signal.Signals(signum).name})")


def install_signal_fault() -> None:
    """SIGUSR1 raises :class:`InjectedFault` in the main thread (managed ranks only)."""
    signal.signal(signal.SIGUSR1, _raise_injected)
