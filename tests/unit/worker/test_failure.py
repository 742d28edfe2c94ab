"""The kind of a failed step comes from the exception object where it was caught, never from
its message: a real device memory error is one whatever its driver says, and a message that
merely reads like one is not.

Pure logic: importing the module must not import torch (checked below); torch's
``AcceleratorError`` is stood in for by a class of that name in a module named ``torch``.
"""

from __future__ import annotations

import subprocess
import sys
import types

import pytest

from unbroken.protocol.kinds import StepFailure
from unbroken.worker.failure import (
    ECC_UNCORRECTABLE,
    DeviceMemoryError,
    SyncFailure,
    failure_kind,
    is_device_memory_error,
)

pytestmark = pytest.mark.unit

CAUGHT = (StepFailure.COLLECTIVE, StepFailure.UPDATE)


class AcceleratorError(RuntimeError):
    """torch's, as the C++ side raises it: with the driver's ``error_code``."""

    def __init__(self, message: str, error_code: int) -> None:
        super().__init__(message)
        self.error_code = error_code


@pytest.fixture
def fake_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    module = types.ModuleType("torch")
    module.AcceleratorError = AcceleratorError  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch", module)


@pytest.mark.parametrize("caught_as", CAUGHT)
def test_a_device_memory_error_is_one_whatever_its_message(caught_as: StepFailure) -> None:
    for message in ("", "ECC error on HBM bank 3", "parameter memory is corrupt"):
        failure = SyncFailure.of(DeviceMemoryError(message), caught_as)
        assert failure.kind is StepFailure.DEVICE_MEMORY


@pytest.mark.parametrize("caught_as", CAUGHT)
def test_a_message_that_reads_like_a_device_memory_error_is_not_one(
    caught_as: StepFailure,
) -> None:
    for error in (
        RuntimeError("DeviceMemoryError: uncorrectable device memory error 80E01801"),
        RuntimeError("uncorrectable device memory error 80E01801 in rank 2 at step 5"),
        ValueError("DeviceMemoryError"),
    ):
        failure = SyncFailure.of(error, caught_as)
        assert failure.kind is caught_as, error
        assert not is_device_memory_error(error)


def test_the_reason_is_for_people_and_the_kind_does_not_depend_on_it() -> None:
    failure = SyncFailure.of(DeviceMemoryError("  bank 3\n  row 7 "), StepFailure.COLLECTIVE)
    assert failure.reason == "DeviceMemoryError: bank 3 row 7"
    renamed = type("SomethingElse", (DeviceMemoryError,), {})("bank 3")
    failure = SyncFailure.of(renamed, StepFailure.UPDATE)
    assert failure.reason == "SomethingElse: bank 3"
    assert failure.kind is StepFailure.DEVICE_MEMORY  # a detector's own subclass


def test_a_failure_raised_from_a_device_memory_error_is_one() -> None:
    try:
        try:
            raise DeviceMemoryError("bank 3")
        except DeviceMemoryError as e:
            raise RuntimeError("the all-reduce was aborted") from e
    except RuntimeError as wrapped:
        assert failure_kind(wrapped, StepFailure.COLLECTIVE) is StepFailure.DEVICE_MEMORY


def test_other_failures_keep_the_kind_of_where_they_were_caught() -> None:
    error = RuntimeError("Connection closed by peer")
    assert failure_kind(error, StepFailure.COLLECTIVE) is StepFailure.COLLECTIVE
    assert failure_kind(error, StepFailure.UPDATE) is StepFailure.UPDATE
    assert failure_kind(MemoryError(), StepFailure.UPDATE) is StepFailure.UPDATE


@pytest.mark.usefixtures("fake_torch")
def test_an_accelerator_error_is_classified_by_its_driver_code() -> None:
    ecc = AcceleratorError("CUDA error: an illegal instruction", ECC_UNCORRECTABLE)
    assert failure_kind(ecc, StepFailure.UPDATE) is StepFailure.DEVICE_MEMORY
    other = AcceleratorError("CUDA error: uncorrectable ECC error encountered", 700)
    assert failure_kind(other, StepFailure.UPDATE) is StepFailure.UPDATE
    # Not an AcceleratorError: its code, and its text, mean nothing.
    lookalike = RuntimeError("CUDA error: uncorrectable ECC error encountered")
    lookalike.error_code = ECC_UNCORRECTABLE  # type: ignore[attr-defined]
    assert failure_kind(lookalike, StepFailure.UPDATE) is StepFailure.UPDATE


def test_without_torch_no_error_is_an_accelerator_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    error = AcceleratorError("CUDA error", ECC_UNCORRECTABLE)
    assert failure_kind(error, StepFailure.COLLECTIVE) is StepFailure.COLLECTIVE


def test_the_module_imports_no_torch() -> None:
    code = "import sys, unbroken.worker.failure; print('torch' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=60
    )
    assert out.stdout.strip() == "False"
