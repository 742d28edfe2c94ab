"""Watching device health: a transition detector and the thread that polls a provider.

:class:`DeviceMonitor` turns successive health snapshots into events: :class:`DeviceFaulted`
when a device goes from healthy (or never seen) to faulty or changes fault code while faulty,
:class:`DeviceRecovered` when a faulty device is healthy again. A device missing from a
snapshot keeps its last known state. The monitor reads no clock: ``now`` is an argument.

:class:`DeviceWatcher` polls a provider every ``listWatchPeriod`` on a thread and hands the
events to a callback. When the provider cannot be read (a malformed state file, a driver
error), or the callback raises, the watcher logs it once, reports it to ``on_error`` and
stops: it does not spin on a broken source. The caller decides what a blind device watch
means for the job.

The period is the device plugin's ``-listWatchPeriod`` (3-1800 s, default 5; the cluster spec,
:class:`unbroken.spec.cluster.DevicePlugin`, checks the range; tests pass shorter periods here).
What the manager does with the events depends on the plugin's ``-autoStowing`` flag: a
``DeviceFaulted`` whose level isolates becomes ``Cluster.isolate_device``; on
``DeviceRecovered`` with ``autoStowing`` on (the default), the device goes back to the pool
(``Cluster.return_device``); with it off, the device stays isolated after it recovers until an
operator returns it (``unbroken release``), as the reference's device plugin does. A device
isolated at ``ManuallySeparate`` stays out whatever the flag says, until released.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping

from unbroken.devices.health import (
    DeviceEvent,
    DeviceFaulted,
    DeviceHealth,
    DeviceRecovered,
    HealthProvider,
)

log = logging.getLogger(__name__)


class DeviceMonitor:
    """Health transitions between successive snapshots (see the module doc)."""

    def __init__(self) -> None:
        self._last: dict[tuple[str, int], DeviceHealth] = {}

    def observe(self, snapshot: Iterable[DeviceHealth], now: float) -> list[DeviceEvent]:
        events: list[DeviceEvent] = []
        for health in snapshot:
            key = (health.node, health.device)
            before = self._last.get(key)
            self._last[key] = health
            was_healthy = before is None or before.healthy
            code_changed = before is not None and before.code != health.code
            if not health.healthy and (was_healthy or code_changed):
                occurred = health.since_at if health.since_at is not None else now
                events.append(
                    DeviceFaulted(
                        health.node, health.device, health.code, health.detail, now, occurred
                    )
                )
            elif health.healthy and not was_healthy:
                events.append(DeviceRecovered(health.node, health.device, now))
        return events

    def current(self) -> Mapping[tuple[str, int], DeviceHealth]:
        """The last known health of every device seen so far."""
        return dict(self._last)


class DeviceWatcher:
    """Polls ``provider`` every ``period_s`` on a thread; see the module doc."""

    def __init__(
        self,
        provider: HealthProvider,
        period_s: float,
        on_event: Callable[[DeviceEvent], None],
        on_error: Callable[[Exception], None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not period_s > 0:
            raise ValueError(f"device poll period must be > 0 s, got {period_s}")
        self._provider = provider
        self._period_s = period_s
        self._on_event = on_event
        self._on_error = on_error
        self._clock = clock
        self._monitor = DeviceMonitor()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: Exception | None = None

    @property
    def error(self) -> Exception | None:
        """Why the watcher stopped on its own, if it did."""
        return self._error

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def poll_once(self) -> list[DeviceEvent]:
        """Poll the provider now and return the transitions (what the thread does each period)."""
        return self._monitor.observe(self._provider.poll(), self._clock())

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("the device watcher was already started")
        self._thread = threading.Thread(target=self._run, name="device-watcher", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        """Poll now rather than at the end of the period (a provider's event arrived)."""
        self._wake.set()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop polling and wait for the thread (at most ``timeout_s``)."""
        self._stop.set()
        self._wake.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)
            if thread.is_alive():
                raise RuntimeError(f"the device watcher did not stop within {timeout_s} s")

    def wait_stopped(self, timeout_s: float) -> bool:
        """Wait until the polling thread has ended (stopped, or failed); True if it has."""
        thread = self._thread
        if thread is None:
            return True
        thread.join(timeout_s)
        return not thread.is_alive()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                for event in self.poll_once():
                    self._on_event(event)
            except Exception as exc:
                self._fail(exc)
                return
            self._wake.wait(self._period_s)
            self._wake.clear()

    def _fail(self, exc: Exception) -> None:
        self._error = exc
        log.error("device health watch stopped: %s", exc)
        if self._on_error is not None:
            try:
                self._on_error(exc)
            except Exception:
                log.exception("device watcher error callback failed")
