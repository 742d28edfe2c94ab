"""The worker library: what runs inside each training process.

Import it as ``import unbroken.worker as ub`` and call :func:`ub.init` after
``dist.init_process_group`` (see :mod:`unbroken.worker.session`). It imports torch and the
standard library only, never the control plane, the CLI, grpc or yaml. The heartbeat format
(:mod:`unbroken.worker.heartbeat`) does not even import torch: importing this package is
torch-free until a torch-backed name (``init``, ``Session``, ``TrainingStopped``,
``RecoveryFailed``, ``ReplicasDiverged``, ``state_digest``, ``device``) is first used, so the
node agent reads heartbeats without torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from unbroken.worker.heartbeat import (
    HeartbeatFormatError,
    HeartbeatReader,
    HeartbeatRecord,
    HeartbeatWriter,
    Phase,
)
from unbroken.worker.stop import STOP_EXIT_CODE

if TYPE_CHECKING:
    from unbroken.worker.agreement import ReplicasDiverged
    from unbroken.worker.device import device
    from unbroken.worker.digest import state_digest
    from unbroken.worker.recovery import RecoveryFailed
    from unbroken.worker.session import Session, TrainingStopped, init

__all__ = [
    "STOP_EXIT_CODE",
    "HeartbeatFormatError",
    "HeartbeatReader",
    "HeartbeatRecord",
    "HeartbeatWriter",
    "Phase",
    "RecoveryFailed",
    "ReplicasDiverged",
    "Session",
    "TrainingStopped",
    "device",
    "init",
    "state_digest",
]

_LAZY = {
    "init": "unbroken.worker.session",
    "Session": "unbroken.worker.session",
    "TrainingStopped": "unbroken.worker.session",
    "state_digest": "unbroken.worker.digest",
    "device": "unbroken.worker.device",
    "RecoveryFailed": "unbroken.worker.recovery",
    "ReplicasDiverged": "unbroken.worker.agreement",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
