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
    device_code,
    failure_kind,
    is_device_memory_error,
    is_sticky,
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


class OutOfMemoryError(RuntimeError):
    """torch's allocation failure: no driver code of its own."""


@pytest.fixture
def fake_torch_oom(fake_torch: None) -> None:
    sys.modules["torch"].OutOfMemoryError = OutOfMemoryError  # type: ignore[attr-defined]


@pytest.mark.usefixtures("fake_torch_oom")
@pytest.mark.parametrize(
    ("code", "sticky"),
    [(700, True), (710, True), (719, True), (214, True), (999, True), (2, False), (1, False)],
)
def test_a_device_error_has_its_code_and_stickiness_from_the_object(
    code: int, sticky: bool
) -> None:
    error = AcceleratorError("CUDA error: whatever the driver says", code)
    assert device_code(error) == f"CUDA-{code}"
    assert is_sticky(error) is sticky
    wrapped = RuntimeError("the step failed")
    wrapped.__cause__ = error  # raised from it, as a framework re-raises
    assert device_code(wrapped) == f"CUDA-{code}" and is_sticky(wrapped) is sticky


@pytest.mark.usefixtures("fake_torch_oom")
@pytest.mark.parametrize("caught_as", CAUGHT)
def test_out_of_memory_is_code_2_not_sticky_and_a_step_to_redo(caught_as: StepFailure) -> None:
    error = OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    assert device_code(error) == "CUDA-2" and not is_sticky(error)
    assert failure_kind(error, caught_as) is StepFailure.OUT_OF_MEMORY


@pytest.mark.usefixtures("fake_torch_oom")
def test_words_of_a_device_error_are_not_one() -> None:
    error = RuntimeError("CUDA error: an illegal memory access was encountered (700)")
    assert device_code(error) == "" and not is_sticky(error)


def test_every_code_a_rank_reports_has_a_row_in_the_code_table() -> None:
    from unbroken.faults import CodeTable
    from unbroken.worker.failure import OUT_OF_MEMORY, STICKY

    table = CodeTable.load()
    for code in sorted(STICKY | {OUT_OF_MEMORY}):
        info = table.lookup(f"CUDA-{code}")
        assert info is not None and info.source == "CUDA runtime API", code
