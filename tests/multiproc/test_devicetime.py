"""A step's compute time on the device, from events around it, read only once complete; nothing
on a rank without CUDA. CUDA's events are stood in for by a class with their three methods."""

from __future__ import annotations

import itertools

import pytest
import torch

from unbroken.worker import devicetime

pytestmark = pytest.mark.multiproc


def test_without_cuda_there_is_nothing_to_measure() -> None:
    clock = devicetime.DeviceClock()
    clock.begin()
    clock.mark()
    assert clock.take() is None


class Event:
    """torch.cuda.Event's record/query/elapsed_time on a stream the test completes."""

    ticks = itertools.count()
    done_up_to = -1

    def __init__(self, enable_timing: bool = False) -> None:
        self.at = -1

    def record(self) -> None:
        self.at = next(Event.ticks)

    def query(self) -> bool:
        return self.at <= Event.done_up_to

    def elapsed_time(self, other: Event) -> float:
        return (other.at - self.at) * 10.0  # ms


def test_the_newest_completed_step_is_taken_and_older_ones_dropped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "Event", Event)
    clock = devicetime.DeviceClock()
    clock.activate()
    for _ in range(3):  # three steps queued: begin at ticks 0, 2, 4; compute ends at 1, 3, 5
        clock.begin()
        devicetime.mark()
    assert clock.take() is None  # the device has not run any of them yet
    Event.done_up_to = 3
    assert clock.take() == pytest.approx(0.01)  # step 2's (ticks 2 -> 3); step 1's dropped
    assert clock.take() is None
    Event.done_up_to = 5
    assert clock.take() == pytest.approx(0.01)
