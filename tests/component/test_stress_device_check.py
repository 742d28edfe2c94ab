"""The stress test's device check in a rank (unbroken.worker.stress): a device that computes
wrong gives another checksum, for real, and the check leaves the training's random numbers
alone."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from unbroken.devices import SimProvider, clear_device_fault, inject_silent_fault
from unbroken.worker.stress import SimDevice, device_checksum

pytestmark = pytest.mark.component


def test_a_silently_faulty_device_computes_another_checksum(tmp_path: Path) -> None:
    SimProvider(tmp_path, {"node-1": 2})
    healthy, faulty = SimDevice(tmp_path, "node-1", 0), SimDevice(tmp_path, "node-1", 1)
    expected = device_checksum(None)
    assert len(expected) == 16 and device_checksum(None) == expected  # deterministic
    assert device_checksum(healthy) == device_checksum(faulty) == expected
    inject_silent_fault(tmp_path, "node-1", 1, "SDC")
    assert device_checksum(healthy) == expected
    wrong = device_checksum(faulty)
    assert wrong != expected and device_checksum(faulty) == wrong
    clear_device_fault(tmp_path, "node-1", 1)
    assert device_checksum(faulty) == expected


def test_the_device_check_leaves_the_global_random_numbers_alone() -> None:
    torch.manual_seed(7)
    before = torch.get_rng_state()
    device_checksum(None)
    assert torch.equal(torch.get_rng_state(), before)
