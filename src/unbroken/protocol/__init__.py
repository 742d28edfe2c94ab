"""The protocol between the training side and the control plane: the one place both import.

- :mod:`~unbroken.protocol.kinds`: the vocabulary of faults (:class:`FaultKind`) and the step
  failures a rank reports (:class:`StepFailure`), with the detectors' codes;
- :mod:`~unbroken.protocol.heartbeat`: the heartbeat record a rank writes and its agent reads;
- :mod:`~unbroken.protocol.mailbox`: the commands an agent posts to one rank;
- :mod:`~unbroken.protocol.messages`: the typed reports and orders between agents and the job
  manager, with their codec;
- :mod:`~unbroken.protocol.hosts`: the calls and orders between a host's agent that joins a
  control plane on another host and that control plane.

Standard library only: training processes and agents import it without torch or gRPC.
"""

from unbroken.protocol.kinds import (
    DEVICE_MEMORY_CODE,
    DIVERGED_CODE,
    HEARTBEAT_TIMEOUT_CODE,
    LINK_FAILURE_CODE,
    UPDATE_FAILED_CODE,
    FaultKind,
    StepFailure,
)

__all__ = [
    "DEVICE_MEMORY_CODE",
    "DIVERGED_CODE",
    "HEARTBEAT_TIMEOUT_CODE",
    "LINK_FAILURE_CODE",
    "UPDATE_FAILED_CODE",
    "FaultKind",
    "StepFailure",
]
