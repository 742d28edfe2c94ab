"""A replacement on a GPU waits for the device memory of the processes it replaces, through a
scripted NVML (tests/support/fakenvml): until the driver no longer lists them, at most a bound."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest
from tests.support import nvmlscript

from unbroken.agent.gpumem import GpuMemory, pod_gpus
from unbroken.protocol.messages import DeviceWait

pytestmark = pytest.mark.unit


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "nvml.json"
    monkeypatch.setenv("FAKE_NVML_STATE", str(path))
    return path


@pytest.fixture
def nvml(state: Path) -> ModuleType:
    return nvmlscript.load("fake_pynvml_gpumem")


def write(path: Path, processes: dict[str, list[int]]) -> None:
    devices = {gpu: {"processes": pids} for gpu, pids in processes.items()}
    nvmlscript.write_state(path, gpus=2, devices=devices)


class Clock:
    """A clock the waits move: each sleep advances it, and at ``free_at`` the driver lets the
    dead process go."""

    def __init__(self, state: Path, free_at: float | None) -> None:
        self.now = 0.0
        self.state, self.free_at = state, free_at

    def sleep(self, s: float) -> None:
        self.now += s
        if self.free_at is not None and self.now >= self.free_at:
            write(self.state, {"1": [77]})  # 77 lives on; 4242 is gone


def memory(nvml: ModuleType, clock: Clock, gpus: tuple[int, ...] = (1,)) -> GpuMemory:
    return GpuMemory(gpus, nvml, clock=lambda: clock.now, wall=lambda: 1000.0, sleep=clock.sleep)


def test_the_successor_waits_until_the_dead_process_no_longer_holds_memory(
    nvml: ModuleType, state: Path
) -> None:
    write(state, {"1": [4242, 77]})
    clock = Clock(state, free_at=0.5)
    waited = memory(nvml, clock).wait_freed([4242])
    assert waited == DeviceWait(gpus=(1,), freed_at=1000.0, waited_s=waited.waited_s, freed=True)
    assert 0.5 <= waited.waited_s < 0.6


def test_the_wait_is_bounded_and_says_the_memory_was_not_freed(
    nvml: ModuleType, state: Path
) -> None:
    write(state, {"1": [4242]})
    waited = memory(nvml, Clock(state, free_at=None)).wait_freed([4242], bound_s=2.0)
    assert waited is not None and not waited.freed and 2.0 <= waited.waited_s < 2.1


def test_nothing_to_wait_for(nvml: ModuleType, state: Path) -> None:
    write(state, {"0": [4242]})  # on another GPU than the pod's
    clock = Clock(state, free_at=None)
    assert memory(nvml, clock).wait_freed([4242]) is None
    assert memory(nvml, clock, gpus=()).wait_freed([4242]) is None  # a pod without GPUs
    assert memory(nvml, clock).wait_freed([]) is None


def test_without_nvml_a_successor_starts_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FAKE_NVML_STATE", raising=False)
    assert GpuMemory((0,)).wait_freed([4242]) is None  # the real binding finds no driver here


def test_the_pod_s_gpus_are_its_visible_devices() -> None:
    assert pod_gpus({"CUDA_VISIBLE_DEVICES": "3,5"}) == (3, 5)
    assert pod_gpus({}) == ()
