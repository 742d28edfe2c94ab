"""Device health as values: what a provider reports, and the transitions a monitor sees."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


class DeviceStateError(RuntimeError):
    """A provider cannot read device health; the message names the source and what is wrong."""


@dataclass(frozen=True)
class DeviceHealth:
    """One device's health at one poll.

    ``code`` is the device fault code when unhealthy (``"80E01801"``), None when healthy or
    unknown. ``since_at`` is when the current condition began, when the provider knows it
    (wall clock); detection latency is measured from it.
    """

    node: str
    device: int
    healthy: bool
    code: str | None = None
    detail: str = ""
    since_at: float | None = None


class HealthProvider(Protocol):
    """A source of device health (``sim``: injected faults; a real one reads the driver)."""

    def poll(self) -> tuple[DeviceHealth, ...]:
        """Every device's health now. Raises :class:`DeviceStateError` when it cannot tell."""
        ...


@dataclass(frozen=True)
class DeviceFaulted:
    """A device turned unhealthy, or its fault code changed.

    ``at`` is when the monitor saw it; ``occurred_at`` when it happened (the provider's
    ``since_at``, else ``at``).
    """

    node: str
    device: int
    code: str | None
    detail: str
    at: float
    occurred_at: float


@dataclass(frozen=True)
class DeviceRecovered:
    """A faulty device reports healthy again (seen at ``at``)."""

    node: str
    device: int
    at: float


DeviceEvent = DeviceFaulted | DeviceRecovered
