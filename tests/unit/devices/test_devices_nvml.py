"""The ``nvml`` provider over a scripted NVML (tests/support/fakenvml): what each GPU condition
and Xid event reports, for which device slots, and what is not watched."""

from __future__ import annotations

import threading
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from tests.support import nvmlscript

from unbroken.devices import DeviceFaulted, DeviceRecovered, DeviceStateError, DeviceWatcher
from unbroken.devices.nvml import (
    NvmlProvider,
    gpu_of_slot,
    load_nvml,
    machine_gpus,
    slots_on_gpus,
)
from unbroken.faults import CodeTable

pytestmark = pytest.mark.unit


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "nvml.json"
    monkeypatch.setenv("FAKE_NVML_STATE", str(path))
    write(path, gpus=2)
    return path


@pytest.fixture
def nvml(state: Path) -> ModuleType:
    return nvmlscript.load("fake_pynvml_under_test")


def write(path: Path, **state: Any) -> None:
    nvmlscript.write_state(path, **state)


def provider(
    nvml: ModuleType, slots: dict[int, list[tuple[str, int]]] | None = None
) -> NvmlProvider:
    clock = iter(float(t) for t in range(1000, 100000, 10))
    return NvmlProvider(
        slots or {0: [("node-0", 0)], 1: [("node-1", 0)]},
        CodeTable.load().judge,
        nvml,
        clock=lambda: next(clock),
    )


def faults(p: NvmlProvider) -> dict[tuple[str, int], str | None]:
    return {(h.node, h.device): h.code for h in p.poll() if not h.healthy}


def test_slots_are_laid_over_the_gpus_in_turn() -> None:
    placed = slots_on_gpus(("a", "b"), 2, (0,))
    assert placed == {0: [("a", 0), ("a", 1), ("b", 0), ("b", 1)]}  # four ranks share one GPU
    placed = slots_on_gpus(("a", "b", "c"), 2, (0, 1, 2, 3))
    assert placed[0] == [("a", 0), ("c", 0)] and placed[3] == [("b", 1)]
    assert gpu_of_slot(2, 1, 2, (0, 1, 2, 3)) == 1
    assert slots_on_gpus(("a",), 2, (5, 7)) == {5: [("a", 0)], 7: [("a", 1)]}
    with pytest.raises(ValueError):
        slots_on_gpus(("a",), 1, ())


def test_the_run_s_gpus_are_those_cuda_visible_devices_lists_else_nvml_s_else_none() -> None:
    assert machine_gpus({"CUDA_VISIBLE_DEVICES": "2, 3"}, nvml_count=8) == (2, 3)
    assert machine_gpus({"CUDA_VISIBLE_DEVICES": ""}, nvml_count=8) == ()
    assert machine_gpus({}, nvml_count=4) == (0, 1, 2, 3)
    with pytest.raises(ValueError, match="is no GPU index"):
        machine_gpus({"CUDA_VISIBLE_DEVICES": "GPU-8a1f"})


def test_a_healthy_machine_reports_every_slot_healthy(nvml: ModuleType) -> None:
    p = provider(nvml)
    assert [(h.node, h.healthy) for h in p.poll()] == [("node-0", True), ("node-1", True)]


@pytest.mark.parametrize(
    ("device", "code"),
    [
        ({"lost": True}, "GPU-LOST"),
        ({"remapped_rows": [0, 1, 0, 1]}, "GPU-ROW-REMAP-FAILURE"),
        ({"remapped_rows": [0, 1, 1, 0]}, "GPU-ROW-REMAP-PENDING"),
        ({"clock_reasons": 0x8}, "GPU-THROTTLE-HW-SLOWDOWN"),
        ({"clock_reasons": 0x40}, "GPU-THROTTLE-THERMAL"),
        ({"clock_reasons": 0x80 | 0x8}, "GPU-THROTTLE-POWER-BRAKE"),
    ],
)
def test_each_polled_condition_has_its_code(
    nvml: ModuleType, state: Path, device: dict[str, Any], code: str
) -> None:
    p = provider(nvml)
    write(state, gpus=2, devices={"1": device})
    assert faults(p) == {("node-1", 0): code}
    assert CodeTable.load().lookup(code) is not None


def test_a_power_cap_is_not_a_fault(nvml: ModuleType, state: Path) -> None:
    p = provider(nvml)
    write(state, gpus=2, devices={"0": {"clock_reasons": 0x4}})  # software power cap: normal
    assert faults(p) == {}


def test_counters_count_from_the_first_reading_and_report_a_rise_once(
    nvml: ModuleType, state: Path
) -> None:
    write(state, gpus=2, devices={"0": {"ecc_uncorrected": 5, "pcie_replays": 100}})
    p = provider(nvml)
    assert faults(p) == {}  # counts already there when watching began are no new fault
    write(state, gpus=2, devices={"0": {"ecc_uncorrected": 6, "pcie_replays": 100}})
    assert faults(p) == {("node-0", 0): "GPU-ECC-UNCORRECTED"}
    assert faults(p) == {}
    write(state, gpus=2, devices={"0": {"ecc_uncorrected": 6, "pcie_replays": 200}})
    assert faults(p) == {("node-0", 0): "GPU-PCIE-REPLAY"}  # 100 in 10 s: 600 a minute


def test_rising_nvlink_counters_on_an_active_link_are_sub_health(
    nvml: ModuleType, state: Path
) -> None:
    write(state, gpus=2, devices={"0": {"nvlink": [[1, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0]]}})
    p = provider(nvml)
    assert faults(p) == {}
    write(state, gpus=2, devices={"0": {"nvlink": [[1, 0, 0, 4, 0, 0], [0, 9, 0, 0, 0, 0]]}})
    assert faults(p) == {("node-0", 0): "GPU-NVLINK-ERRORS"}  # link 1 is down: not counted


def test_not_supported_is_not_watched_and_never_a_fault(
    nvml: ModuleType, state: Path, caplog: pytest.LogCaptureFixture
) -> None:
    unsupported = ["pcie_replays", "remapped_rows", "ecc_uncorrected", "clock_reasons"]
    write(state, gpus=2, devices={"0": {"unsupported": unsupported}})
    with caplog.at_level("INFO", logger="unbroken.devices.nvml"):
        p = provider(nvml)
        for _ in range(3):
            assert faults(p) == {}
    said = [r.getMessage() for r in caplog.records if "not supported" in r.getMessage()]
    on_0 = [m for m in said if m.startswith("GPU 0:")]
    assert len(on_0) == 5  # four counters and NVLink, each said once over three polls


def test_the_worst_condition_of_a_gpu_is_reported_for_every_slot_on_it(
    nvml: ModuleType, state: Path
) -> None:
    p = provider(nvml, {0: [("a", 0), ("a", 1), ("b", 0)]})
    write(state, gpus=1, devices={"0": {"clock_reasons": 0x40, "remapped_rows": [0, 1, 0, 1]}})
    codes = faults(p)
    assert codes == {
        ("a", 0): "GPU-ROW-REMAP-FAILURE",
        ("a", 1): "GPU-ROW-REMAP-FAILURE",
        ("b", 0): "GPU-ROW-REMAP-FAILURE",
    }  # SeparateNPU over SubHealth


def test_an_xid_event_wakes_the_watcher_within_a_second(nvml: ModuleType, state: Path) -> None:
    p = NvmlProvider({0: [("node-0", 0)], 1: [("node-1", 0)]}, CodeTable.load().judge, nvml)
    events: list[object] = []
    got = threading.Event()

    def on_event(event: object) -> None:
        events.append(event)
        got.set()

    watcher = DeviceWatcher(p, 600.0, on_event)  # a poll period far longer than the test
    watcher.start()
    p.listen(watcher.wake)
    try:
        write(state, gpus=2, xids=[{"gpu": 1, "xid": 79}])
        assert got.wait(2.0)
    finally:
        p.close()
        watcher.stop()
    (event,) = events
    assert isinstance(event, DeviceFaulted)
    assert (event.node, event.device, event.code) == ("node-1", 0, "XID-79")


def test_an_xid_that_leaves_the_gpu_in_service_is_reported_once_one_that_isolates_stays(
    nvml: ModuleType, state: Path
) -> None:
    p = provider(nvml)
    p._on_xid(0, 13, 1.0)  # an application's graphics exception: RestartBusiness
    p._on_xid(1, 79, 1.0)  # fallen off the bus: SeparateNPU
    assert faults(p) == {("node-0", 0): "XID-13", ("node-1", 0): "XID-79"}
    assert faults(p) == {("node-1", 0): "XID-79"}
    p.reset(1)
    assert faults(p) == {}


def test_the_watcher_sees_a_fault_and_its_recovery(nvml: ModuleType, state: Path) -> None:
    p = provider(nvml)
    seen: list[object] = []
    watcher = DeviceWatcher(p, 1.0, seen.append, clock=lambda: 5.0)
    write(state, gpus=2, devices={"0": {"clock_reasons": 0x40}})
    seen.extend(watcher.poll_once())
    write(state, gpus=2)
    seen.extend(watcher.poll_once())
    assert [type(e) for e in seen] == [DeviceFaulted, DeviceRecovered]


def test_gpus_the_machine_lacks_are_refused(nvml: ModuleType) -> None:
    with pytest.raises(DeviceStateError, match="NVML sees 2 GPU"):
        provider(nvml, {0: [("a", 0)], 5: [("b", 0)]})


def test_without_the_binding_the_message_says_what_to_install() -> None:
    with pytest.raises(DeviceStateError, match=r"unbroken\[nvml\]"):
        load_nvml("pynvml_that_is_not_installed")


def test_without_a_driver_the_message_says_nvml_cannot_start(
    nvml: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("FAKE_NVML_STATE")
    import sys

    monkeypatch.setitem(sys.modules, "fake_pynvml_loaded", nvml)
    with pytest.raises(DeviceStateError, match="NVML cannot start on this machine"):
        load_nvml("fake_pynvml_loaded")


def test_the_scripted_nvml_speaks_the_real_bindings_names_and_values(nvml: ModuleType) -> None:
    """Every constant and call of the stand-in is the real ``pynvml``'s, with the same value."""
    real = pytest.importorskip("pynvml")
    for name in dir(nvml):
        if name.startswith(("NVML_", "nvmlEventType", "nvmlClocksEventReason")):
            assert getattr(real, name) == getattr(nvml, name), name
        elif name.startswith("nvml") and callable(getattr(nvml, name)):
            assert callable(getattr(real, name, None)), name
