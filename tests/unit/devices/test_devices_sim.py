"""The sim provider's state files: inject, clear, restart, and the errors users see."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from unbroken.devices import (
    DeviceHealth,
    DeviceStateError,
    SimProvider,
    clear_device_fault,
    inject_device_fault,
    read_node_state,
    state_path,
)

pytestmark = pytest.mark.unit

NODES = {"node-0": 2, "node-1": 2}


def test_a_new_provider_reports_every_device_healthy(tmp_path: Path) -> None:
    provider = SimProvider(tmp_path / "devices", NODES)
    assert provider.poll() == (
        DeviceHealth("node-0", 0, True),
        DeviceHealth("node-0", 1, True),
        DeviceHealth("node-1", 0, True),
        DeviceHealth("node-1", 1, True),
    )
    assert sorted(p.name for p in (tmp_path / "devices").glob("*.json")) == [
        "node-0.json",
        "node-1.json",
    ]


def test_inject_and_clear(tmp_path: Path) -> None:
    provider = SimProvider(tmp_path, NODES)
    inject_device_fault(tmp_path, "node-1", 0, "80E01801", detail="uce at 0x1f", at=12.5)
    health = {(h.node, h.device): h for h in provider.poll()}
    assert health[("node-1", 0)] == DeviceHealth(
        "node-1", 0, False, "80E01801", "uce at 0x1f", since_at=12.5
    )
    assert all(h.healthy for k, h in health.items() if k != ("node-1", 0))
    inject_device_fault(tmp_path, "node-1", 0, "80E18005", at=13.0)
    assert read_node_state(tmp_path, "node-1").faults[0].code == "80E18005"
    assert clear_device_fault(tmp_path, "node-1", 0) is True
    assert clear_device_fault(tmp_path, "node-1", 0) is False
    assert all(h.healthy for h in provider.poll())
    assert [p.name for p in tmp_path.iterdir() if p.suffix == ".tmp"] == []


def test_faults_injected_before_a_restart_are_kept(tmp_path: Path) -> None:
    SimProvider(tmp_path, NODES)
    inject_device_fault(tmp_path, "node-0", 1, "80E01801", at=1.0)
    again = SimProvider(tmp_path, NODES)
    assert [h.device for h in again.poll() if not h.healthy] == [1]


def test_a_changed_device_count_is_refused(tmp_path: Path) -> None:
    SimProvider(tmp_path, NODES)
    with pytest.raises(
        DeviceStateError,
        match=r"node-0\.json: simulated node node-0 has 2 devices, but the cluster gives it 4",
    ):
        SimProvider(tmp_path, {"node-0": 4})


def test_unknown_node_and_device_are_named(tmp_path: Path) -> None:
    with pytest.raises(DeviceStateError, match=r"no simulated node 'node-0' .*is the run started"):
        inject_device_fault(tmp_path, "node-0", 0, "X")
    SimProvider(tmp_path, NODES)
    with pytest.raises(
        DeviceStateError,
        match=r"no simulated node 'node-7' under .* \(simulated nodes: node-0, node-1\)",
    ):
        inject_device_fault(tmp_path, "node-7", 0, "X")
    with pytest.raises(ValueError, match="node node-1 has devices 0-1; there is no device 2"):
        clear_device_fault(tmp_path, "node-1", 2)
    with pytest.raises(ValueError, match="a device fault code must be a non-empty word"):
        inject_device_fault(tmp_path, "node-1", 0, "")
    with pytest.raises(ValueError, match=r"node name '\.\./etc' is not usable"):
        state_path(tmp_path, "../etc")


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("{not json", r"Expecting property name"),
        ("[]", r"expected a JSON object"),
        ('{"format": "other"}', r"'format' is 'other', expected 'unbroken-sim-devices'"),
        (
            '{"format": "unbroken-sim-devices", "version": 1, "node": "node-0", "devices": 2,'
            ' "faults": {"5": {"code": "X", "at": 1}}}',
            r"fault key '5' is not a device index below 2",
        ),
        (
            '{"format": "unbroken-sim-devices", "version": 1, "node": "node-0", "devices": 2,'
            ' "faults": {"1": {"code": "X"}}}',
            r"fault of device 1: 'at' is None, expected a time",
        ),
        (
            '{"format": "unbroken-sim-devices", "version": 2, "node": "node-0"}',
            r"'version' is 2, this unbroken reads 1",
        ),
    ],
)
def test_a_malformed_state_file_is_a_clear_error(
    tmp_path: Path, content: str, problem: str
) -> None:
    provider = SimProvider(tmp_path, {"node-0": 2})
    (tmp_path / "node-0.json").write_text(content)
    with pytest.raises(DeviceStateError) as err:
        provider.poll()
    message = str(err.value)
    assert message.startswith(f"{tmp_path / 'node-0.json'}: malformed simulated device state (")
    assert message.endswith("); fix it or delete the file")
    assert re.search(problem, message), message
    with pytest.raises(DeviceStateError, match="malformed simulated device state"):
        inject_device_fault(tmp_path, "node-0", 0, "X")


def test_the_file_format_is_readable_json(tmp_path: Path) -> None:
    SimProvider(tmp_path, {"node-0": 2})
    inject_device_fault(tmp_path, "node-0", 1, "80E01801", detail="d", at=3.0)
    assert json.loads((tmp_path / "node-0.json").read_text()) == {
        "format": "unbroken-sim-devices",
        "version": 1,
        "node": "node-0",
        "devices": 2,
        "faults": {"1": {"code": "80E01801", "detail": "d", "at": 3.0}},
    }


def test_a_silent_fault_leaves_the_health_good_and_only_the_device_knows(tmp_path: Path) -> None:
    from unbroken.devices import inject_silent_fault, silent_fault

    provider = SimProvider(tmp_path, {"node-1": 2})
    inject_silent_fault(tmp_path, "node-1", 1, "SDC", at=5.0)
    assert all(h.healthy for h in provider.poll())
    fault = silent_fault(tmp_path, "node-1", 1)
    assert fault is not None and (fault.code, fault.at) == ("SDC", 5.0)
    assert silent_fault(tmp_path, "node-1", 0) is None
    assert silent_fault(tmp_path, "node-9", 0) is None  # not a simulated node
    # A visible fault on the same node keeps the silent one; clearing the device ends both.
    inject_device_fault(tmp_path, "node-1", 0, "80E01801")
    assert silent_fault(tmp_path, "node-1", 1) is not None
    assert clear_device_fault(tmp_path, "node-1", 1) is True
    assert silent_fault(tmp_path, "node-1", 1) is None
    assert "silent" not in json.loads((tmp_path / "node-1.json").read_text())
    with pytest.raises(ValueError, match="there is no device 2"):
        inject_silent_fault(tmp_path, "node-1", 2, "SDC")
