"""The shared vocabulary of failures: what kind of fault a detector saw, in one place.

A failure used to cross four vocabularies on its way to the policy (an integer in the
heartbeat, a string from the agent, a kind and code in the manager, a policy event). Here is
the one both sides import: :class:`FaultKind` is what the control plane decides on;
:class:`StepFailure` is the compact code a rank writes into its heartbeat record when a step of
its own failed, and :attr:`StepFailure.kind` says which :class:`FaultKind` that is. The codes
below are the detectors' tags for faults that have no device code of their own.

Standard library only: the worker and the agent import it without torch or the control plane.
"""

from __future__ import annotations

from enum import IntEnum, StrEnum


class FaultKind(StrEnum):
    """Where a fault comes from."""

    PROCESS_EXIT = "process-exit"  # a rank exited: crash, SIGKILL, non-zero exit status
    EXCEPTION = "exception"  # a Python exception in a rank (traceback in ``Fault.detail``)
    HANG = "hang"  # a rank stopped making progress (heartbeat timeout)
    NODE_LOST = "node-lost"  # a node's agent missed its heartbeats
    DEVICE = "device"  # a device health fault with a code, from a health provider
    DEVICE_MEMORY = "device-memory"  # uncorrectable device memory error (the seed's HBM UCE)
    LINK = "link"  # a collective or link error (the seed's HCCL error)
    STRESS_TEST = "stress-test"  # a stress test found a bad device
    SUB_HEALTH = "sub-health"  # a device or node degraded but still working

    @property
    def software(self) -> bool:
        """A fault of the training software itself: the hardware is presumed fine."""
        return self in _SOFTWARE_KINDS

    @property
    def retryable(self) -> bool:
        """The process survives it and the step can be redone (DESIGN section 3)."""
        return self in _RETRYABLE_KINDS

    @property
    def seen_by_training(self) -> bool:
        """Observed by the training processes themselves: their step failed."""
        return self in _TRAINING_KINDS


_SOFTWARE_KINDS = frozenset({FaultKind.PROCESS_EXIT, FaultKind.EXCEPTION, FaultKind.HANG})
_RETRYABLE_KINDS = frozenset({FaultKind.DEVICE_MEMORY, FaultKind.LINK})
_TRAINING_KINDS = _SOFTWARE_KINDS | _RETRYABLE_KINDS


class StepFailure(IntEnum):
    """Why a rank's step failed, as the heartbeat's ``failure`` field says it."""

    NONE = 0  # stopped by a command, not by a failure
    COLLECTIVE = 1  # a collective failed: a peer died or hung, or a link broke
    UPDATE = 2  # the optimizer update raised: the rank's state is suspect
    DEVICE_MEMORY = 3  # an uncorrectable device memory error: the rank's state is corrupt
    OUT_OF_MEMORY = 4  # a device allocation failed: nothing is corrupt, the step can be redone

    @property
    def kind(self) -> FaultKind | None:
        """The fault this failure is when it is the first one (None: no failure). A failed
        collective is a link fault only once no peer's death explains it (the detector holds
        it back as a possible echo)."""
        return _STEP_FAULT_KINDS.get(self)

    @property
    def code(self) -> str:
        """The fault code a detector gives this failure ("" for none)."""
        return _STEP_FAULT_CODES.get(self, "")


#: The seed's code of an uncorrectable device memory error (HBM UCE); the device that raised
#: it is the rank's own.
DEVICE_MEMORY_CODE = "80E01801"
#: A device allocation that failed (``cudaErrorMemoryAllocation``): the code table's row.
OUT_OF_MEMORY_CODE = "CUDA-2"
#: A collective that failed (after op retry, when it is on) while every peer stayed alive.
LINK_FAILURE_CODE = "collective-failed"
#: The optimizer update raised: the rank's state is suspect.
UPDATE_FAILED_CODE = "update-failed"
#: A rank, or an agent, that stopped reporting within its timeout.
HEARTBEAT_TIMEOUT_CODE = "heartbeat-timeout"
#: The exception ranks raise when the replicas' agreement check fails: no replica can be
#: trusted, so every rank resumes from the newest checkpoint.
DIVERGED_CODE = "ReplicasDiverged"

_STEP_FAULT_KINDS: dict[StepFailure, FaultKind] = {
    StepFailure.COLLECTIVE: FaultKind.LINK,
    StepFailure.UPDATE: FaultKind.EXCEPTION,
    StepFailure.DEVICE_MEMORY: FaultKind.DEVICE_MEMORY,
    # Retryable as a memory error is: the step is redone in the same processes (the rank's
    # state repaired from a replica, which an update cut short needs).
    StepFailure.OUT_OF_MEMORY: FaultKind.DEVICE_MEMORY,
}
_STEP_FAULT_CODES: dict[StepFailure, str] = {
    StepFailure.COLLECTIVE: LINK_FAILURE_CODE,
    StepFailure.UPDATE: UPDATE_FAILED_CODE,
    StepFailure.DEVICE_MEMORY: DEVICE_MEMORY_CODE,
    StepFailure.OUT_OF_MEMORY: OUT_OF_MEMORY_CODE,
}
