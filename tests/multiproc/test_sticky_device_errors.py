"""A sticky device error (the CUDA context is unusable: an illegal address, a device-side
assert, an uncorrectable ECC error) cannot be redone in the process that saw it: where the
session turns a failure into a failed step (the optimizer update, a failure found before the
collectives), such an error is raised again, so the process ends and reports its code."""

from __future__ import annotations

import types

import pytest
import torch

from unbroken.protocol.kinds import StepFailure
from unbroken.worker.recovery import Recovery, _wrap_optimizer_step

pytestmark = pytest.mark.multiproc


def _device_error(code: int) -> torch.AcceleratorError:
    error = torch.AcceleratorError(f"CUDA error {code}")
    error.error_code = code  # type: ignore[attr-defined]
    return error


def _recovery() -> types.SimpleNamespace:
    stub = types.SimpleNamespace(failure=None, _step=7, rank=0, _suspect=False)
    stub._update_failed = lambda e: Recovery._update_failed(stub, e)  # type: ignore[arg-type]
    stub._update_failure = None
    return stub


def _optimizer(error: BaseException) -> torch.optim.Optimizer:
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1)

    def failing_step(*args: object, **kwargs: object) -> None:
        raise error

    optimizer.step = failing_step  # type: ignore[method-assign]
    return optimizer


@pytest.mark.parametrize("code", [700, 710, 214])
def test_a_sticky_error_in_the_update_ends_the_process(code: int) -> None:
    recovery = _recovery()
    optimizer = _optimizer(_device_error(code))
    _wrap_optimizer_step(optimizer, recovery)  # type: ignore[arg-type]
    with pytest.raises(torch.AcceleratorError) as raised:
        optimizer.step()
    assert raised.value.error_code == code  # type: ignore[attr-defined]
    assert recovery._update_failure is None and not recovery._suspect


def test_an_out_of_memory_in_the_update_fails_the_step_in_process() -> None:
    recovery = _recovery()
    optimizer = _optimizer(torch.OutOfMemoryError("CUDA out of memory"))
    _wrap_optimizer_step(optimizer, recovery)  # type: ignore[arg-type]
    assert optimizer.step() is None
    assert recovery._update_failure is not None and recovery._suspect
    assert recovery._update_failure.kind is StepFailure.OUT_OF_MEMORY
