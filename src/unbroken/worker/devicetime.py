"""A step's compute time on the device: CUDA events, read once they have completed.

On a GPU the host runs ahead of the device (kernels are queued, not waited for), so the host's
time from a step's start to its gradients' collective is the time to queue the work, not to run
it. A rank that trains on a GPU records an event on its current stream where each step begins
(:meth:`DeviceClock.begin`) and one where the backward pass has queued its last gradient (the
gradient hook's last bucket: :func:`mark`), and takes the step's compute time on the device from
the pair once the second has completed (``Event.query``, never a wait: the loop is not slowed to
measure it). The straggler detector compares ranks by it (:mod:`unbroken.manager.straggler`);
the step time that bounds a hang stays the host's.

Without CUDA in the rank there is nothing to measure: :meth:`DeviceClock.take` gives None and
the session keeps the host's clock.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import torch

#: Steps whose events may wait to complete (the host is at most a few steps ahead).
_PENDING = 8

#: The clock of this process's session, which :func:`mark` records on.
_active: DeviceClock | None = None


class DeviceClock:
    """The device compute times of this rank's steps (see the module doc)."""

    def __init__(self) -> None:
        self._start: Any = None
        self._pending: deque[tuple[Any, Any]] = deque(maxlen=_PENDING)

    def activate(self) -> None:
        global _active
        _active = self

    def begin(self) -> None:
        """A step begins: an event on the current stream, if this rank uses CUDA."""
        self._start = None
        if torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
            self._start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            self._start.record()

    def mark(self) -> None:
        """The backward pass has queued its last gradient: the step's compute ends here."""
        if self._start is None:
            return
        done = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        done.record()
        self._pending.append((self._start, done))
        self._start = None

    def take(self) -> float | None:
        """The compute time (seconds) of the newest step whose events have completed, dropping
        the older ones; None when none has (or there is no CUDA)."""
        found = None
        while self._pending and self._pending[0][1].query():
            start, done = self._pending.popleft()
            found = start.elapsed_time(done) / 1000.0
        return found


def mark() -> None:
    """Mark the end of the current step's compute on the active session's clock."""
    if _active is not None:
        _active.mark()
