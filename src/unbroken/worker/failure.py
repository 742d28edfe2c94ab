"""A failed step as data: its kind is decided where the error is caught, from the exception.

A step fails in one of a few places: a gradient collective inside DDP's backward
(:mod:`unbroken.worker.commhook`), the optimizer update (:mod:`unbroken.worker.recovery`), or
a device error found before the step shares anything (``fail_step``). Each place builds a
:class:`SyncFailure` from the exception it caught, and the record carries the failure's kind
(the heartbeat's :class:`StepFailure` code) from there on. The kind comes from the exception
object, its class and the error code a device driver put in it, never from its message: a
real device error is worded by the driver, not like the one the fault injector raises, and a
message that merely names a device error is not one.

A device memory error is :class:`DeviceMemoryError` (raised by code that detects one, and by
the fault injector, :mod:`unbroken.worker.chaos`) or torch's ``AcceleratorError`` with the
driver's uncorrectable-ECC code. A *sticky* device error (:data:`STICKY`: the CUDA context is
unusable, the uncorrectable-ECC code among them) is never a failed step: the places that catch
failures raise it again (:func:`is_sticky`), the process ends, and its exit report carries the
error's code (:func:`device_code`, ``CUDA-710``), which the code table rates.
``torch.OutOfMemoryError`` is not one: a failed allocation leaves memory intact; wherever it is
caught it is :attr:`StepFailure.OUT_OF_MEMORY`, a step that can be redone (``retry``).

Standard library only: torch's error classes are looked up once torch is imported (before
that, no torch error exists to classify).
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass

from unbroken.protocol.kinds import StepFailure

#: ``cudaErrorECCUncorrectable``, the code an ``AcceleratorError`` carries for an uncorrectable
#: ECC error in device memory (``hipErrorECCNotCorrectable`` has the same value).
ECC_UNCORRECTABLE = 214
#: ``cudaErrorMemoryAllocation``: the code of an allocation that failed (``torch.OutOfMemoryError``
#: carries none; it is reported with this one). Not sticky: memory is intact.
OUT_OF_MEMORY = 2
#: ``cudaError_t`` codes after which the process's CUDA context is unusable: every later call
#: fails with the same error, and only a new process can use the device again (CUDA runtime
#: API, "the process must be terminated and relaunched"): uncorrectable ECC (214), illegal
#: address (700), launch timeout (702), device-side assert (710), hardware stack error (714),
#: illegal instruction (715), misaligned address (716), invalid address space (717), invalid
#: program counter (718), launch failure (719), unknown (999).
STICKY = frozenset({214, 700, 702, 710, 714, 715, 716, 717, 718, 719, 999})


class DeviceMemoryError(RuntimeError):
    """An uncorrectable device memory error: this rank's memory (parameters, optimizer state)
    is corrupt, so its state must be repaired from a replica."""


def is_device_memory_error(error: BaseException) -> bool:
    """Whether ``error``, or an error it was raised from, is an uncorrectable device memory
    error (see the module doc)."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, DeviceMemoryError):
            return True
        if accelerator_error_code(current) == ECC_UNCORRECTABLE:
            return True
        current = current.__cause__
    return False


def _codes(error: BaseException) -> list[int]:
    """The driver codes of ``error`` and the errors it was raised from (an allocation failure
    counts as :data:`OUT_OF_MEMORY`)."""
    torch = sys.modules.get("torch")
    oom = getattr(torch, "OutOfMemoryError", None)
    seen: set[int] = set()
    out: list[int] = []
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        code = accelerator_error_code(current)
        if code is not None:
            out.append(code)
        elif isinstance(oom, type) and isinstance(current, oom):
            out.append(OUT_OF_MEMORY)
        current = current.__cause__ or current.__context__
    return out


def device_code(error: BaseException) -> str:
    """The fault code of a device error (``CUDA-710``: the fault-code table has a row for each
    code the runtime documents), "" for an error that is not one."""
    codes = _codes(error)
    return f"CUDA-{codes[0]}" if codes else ""


def is_sticky(error: BaseException) -> bool:
    """Whether ``error`` left this process's device context unusable (:data:`STICKY`): the
    step cannot be redone in this process, which must end so that a new one takes its place."""
    return any(code in STICKY for code in _codes(error))


def accelerator_error_code(error: BaseException) -> int | None:
    """The device driver's error code of a ``torch.AcceleratorError`` (its ``error_code``,
    e.g. a ``cudaError_t``); None for any other error."""
    torch = sys.modules.get("torch")
    accelerator_error = getattr(torch, "AcceleratorError", None)
    if not isinstance(accelerator_error, type) or not isinstance(error, accelerator_error):
        return None
    code = getattr(error, "error_code", None)
    return code if isinstance(code, int) else None


def failure_kind(error: BaseException, caught_as: StepFailure) -> StepFailure:
    """The kind of a step failed by ``error``, caught where failures are ``caught_as`` (a
    collective: :attr:`StepFailure.COLLECTIVE`; the optimizer update:
    :attr:`StepFailure.UPDATE`): a device memory error, or a failed allocation, wherever it is
    caught."""
    if is_device_memory_error(error):
        return StepFailure.DEVICE_MEMORY
    if _codes(error)[:1] == [OUT_OF_MEMORY]:
        return StepFailure.OUT_OF_MEMORY
    return caught_as


@dataclass(frozen=True)
class SyncFailure:
    """A step that failed: what kind of failure, what the error was (for people), and when."""

    kind: StepFailure
    error_type: str  # the exception's class name
    message: str  # its message on one line (the class name when it has none)
    at: float  # time.time()

    @property
    def reason(self) -> str:
        return f"{self.error_type}: {self.message}"

    @classmethod
    def of(cls, error: BaseException, caught_as: StepFailure) -> SyncFailure:
        """The failure ``error`` makes of a step, caught where failures are ``caught_as``."""
        return cls(
            kind=failure_kind(error, caught_as),
            error_type=type(error).__name__,
            message=" ".join(str(error).split()) or type(error).__name__,
            at=time.time(),
        )
