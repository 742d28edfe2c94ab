"""SIGTERM as a stop request: leave at the next step boundary, or be gone within a deadline.

The Python-level handler only sets a flag. A Python handler alone has a trap: it runs on the
main thread between bytecodes, so a rank blocked inside a gloo collective (a peer has died)
would not even see the signal until the collective times out, holding the stop for minutes.
So the signal is also delivered through ``signal.set_wakeup_fd`` to a watcher thread, which
sees it at once, records it, and starts the deadline: if the process has not exited
``timeout_s()`` seconds later, the watcher ends it with ``os._exit(128 + SIGTERM)``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from types import FrameType

logger = logging.getLogger(__name__)

#: The exit status of a rank that stopped on SIGTERM (the shell's convention for "terminated"),
#: whether at a step boundary or forced at the deadline. Never 0: a rank that stops early has
#: not finished training, and a launcher must not count it as a success.
STOP_EXIT_CODE = 128 + signal.SIGTERM
_SENTINEL = 0  # written to the wakeup socket by uninstall() to end the watcher


class StopSignal:
    """Installs the SIGTERM handler and its watcher; call from the main thread."""

    def __init__(
        self,
        on_request: Callable[[], None],
        timeout_s: Callable[[], float],
        needed: Callable[[], bool] | None = None,
    ) -> None:
        self._on_request = on_request
        self._timeout_s = timeout_s
        # Polled while a stop waits for its boundary: False ends the process at once (it has
        # nothing left to do; a MindSpore rank whose last words another rank writes).
        self._needed = needed
        self._requested = threading.Event()
        self._exiting = threading.Event()
        self._previous_handler: Callable[[int, FrameType | None], object] | int | None = None
        self._previous_fd = -1
        self._read: socket.socket | None = None
        self._write: socket.socket | None = None
        self._watcher: threading.Thread | None = None
        self._installed = False

    @property
    def requested(self) -> bool:
        return self._requested.is_set()

    def request(self) -> None:
        """Ask for a stop at the next step boundary (what SIGTERM does, without a deadline)."""
        if not self._requested.is_set():
            self._requested.set()
            self._on_request()

    def install(self) -> bool:
        """Take over SIGTERM; False (and nothing changed) when not on the main thread."""
        if threading.current_thread() is not threading.main_thread():
            logger.warning("not on the main thread: SIGTERM keeps its default action")
            return False
        self._read, self._write = socket.socketpair()
        self._write.setblocking(False)
        self._previous_handler = signal.signal(signal.SIGTERM, self._handle)
        self._previous_fd = signal.set_wakeup_fd(self._write.fileno(), warn_on_full_buffer=False)
        if self._previous_fd != -1:
            # Someone else (an asyncio loop on this thread) owns the wakeup fd: give it back
            # and rely on the Python handler alone.
            signal.set_wakeup_fd(self._previous_fd)
            logger.warning(
                "signal wakeup fd already in use: a SIGTERM during a blocked collective waits "
                "for the collective"
            )
        else:
            self._watcher = threading.Thread(
                target=self._watch, name="unbroken-sigterm", daemon=True
            )
            self._watcher.start()
        self._installed = True
        return True

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self._requested.set()

    def _watch(self) -> None:
        assert self._read is not None
        while True:
            try:
                data = self._read.recv(64)
            except OSError:
                return
            if not data or _SENTINEL in data:
                return
            if signal.SIGTERM in data:
                break
        self.request()
        timeout_s = self._timeout_s()
        logger.info("SIGTERM: stopping at the next step boundary (deadline %.1f s)", timeout_s)
        deadline = time.monotonic() + timeout_s
        while not self._exiting.wait(max(0.0, min(0.2, deadline - time.monotonic()))):
            if time.monotonic() >= deadline:
                logger.error(
                    "SIGTERM: no step boundary reached within %.1f s; exiting with status %d",
                    timeout_s,
                    STOP_EXIT_CODE,
                )
                os._exit(STOP_EXIT_CODE)
            if self._needed is not None and not self._needed():
                logger.warning(
                    "SIGTERM: nothing left for this process to do; exiting with status %d",
                    STOP_EXIT_CODE,
                )
                os._exit(STOP_EXIT_CODE)

    def uninstall(self, *, exiting: bool = False) -> None:
        """Restore SIGTERM's previous handling.

        With ``exiting=True`` a stop already under way keeps its deadline armed until the
        process is gone (the exit itself may still block, e.g. joining a hung save thread).
        """
        if not self._installed:
            return
        self._installed = False
        if self._watcher is not None:
            signal.set_wakeup_fd(-1)
        previous = self._previous_handler
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)
        if not (exiting and self._requested.is_set()):
            self._exiting.set()
            if self._write is not None:
                with contextlib.suppress(OSError):
                    self._write.send(bytes([_SENTINEL]))
            if self._watcher is not None:
                self._watcher.join()
            for sock in (self._read, self._write):
                if sock is not None:
                    sock.close()
