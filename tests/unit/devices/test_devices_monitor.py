"""Device health transitions: faulted, code changed, recovered."""

from __future__ import annotations

import pytest

from unbroken.devices import DeviceFaulted, DeviceHealth, DeviceMonitor, DeviceRecovered

pytestmark = pytest.mark.unit


def _ok(device: int, node: str = "node-0") -> DeviceHealth:
    return DeviceHealth(node, device, healthy=True)


def _bad(device: int, code: str, since_at: float | None = None) -> DeviceHealth:
    return DeviceHealth("node-0", device, False, code, "hbm error", since_at)


def test_healthy_devices_produce_no_events() -> None:
    monitor = DeviceMonitor()
    assert monitor.observe([_ok(0), _ok(1)], now=1.0) == []
    assert monitor.observe([_ok(0), _ok(1)], now=2.0) == []


def test_fault_code_change_and_recovery() -> None:
    monitor = DeviceMonitor()
    monitor.observe([_ok(0), _ok(1)], now=1.0)
    assert monitor.observe([_ok(0), _bad(1, "80E01801", since_at=1.5)], now=2.0) == [
        DeviceFaulted("node-0", 1, "80E01801", "hbm error", at=2.0, occurred_at=1.5)
    ]
    assert monitor.observe([_ok(0), _bad(1, "80E01801", since_at=1.5)], now=3.0) == []
    assert monitor.observe([_ok(0), _bad(1, "80E18005")], now=4.0) == [
        DeviceFaulted("node-0", 1, "80E18005", "hbm error", at=4.0, occurred_at=4.0)
    ]
    assert monitor.observe([_ok(0), _ok(1)], now=5.0) == [DeviceRecovered("node-0", 1, at=5.0)]
    assert monitor.observe([_ok(0), _ok(1)], now=6.0) == []


def test_a_device_faulty_at_the_first_poll_is_reported() -> None:
    monitor = DeviceMonitor()
    events = monitor.observe([_ok(0), _bad(1, "80E01801", since_at=0.5)], now=1.0)
    assert events == [DeviceFaulted("node-0", 1, "80E01801", "hbm error", 1.0, 0.5)]


def test_a_device_missing_from_a_snapshot_keeps_its_state() -> None:
    monitor = DeviceMonitor()
    monitor.observe([_bad(0, "X"), _ok(1)], now=1.0)
    assert monitor.observe([_ok(1)], now=2.0) == []
    assert monitor.current()[("node-0", 0)] == _bad(0, "X")
    assert monitor.observe([_ok(0)], now=3.0) == [DeviceRecovered("node-0", 0, 3.0)]


def test_devices_of_different_nodes_are_tracked_apart() -> None:
    monitor = DeviceMonitor()
    monitor.observe([_ok(0, "node-0"), _ok(0, "node-1")], now=1.0)
    events = monitor.observe(
        [_ok(0, "node-0"), DeviceHealth("node-1", 0, False, None, "no code")], now=2.0
    )
    assert events == [DeviceFaulted("node-1", 0, None, "no code", 2.0, 2.0)]
