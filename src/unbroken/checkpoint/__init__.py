"""Checkpoints of a training job: asynchronous DCP saves committed by an atomic manifest.

``find_latest_good``, ``verify`` and the manifest types need only the standard library (the
control plane and the CLI use them); :class:`Checkpointer` and :class:`Restored` import torch
on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from unbroken.checkpoint.manifest import (
    MANIFEST_NAME,
    CheckpointInvalid,
    Manifest,
    ManifestFile,
    find_latest_good,
    list_checkpoints,
    step_dir,
    verify,
)

if TYPE_CHECKING:
    from unbroken.checkpoint.checkpointer import Checkpointer, CheckpointError, Restored

__all__ = [
    "MANIFEST_NAME",
    "CheckpointError",
    "CheckpointInvalid",
    "Checkpointer",
    "Manifest",
    "ManifestFile",
    "Restored",
    "find_latest_good",
    "list_checkpoints",
    "step_dir",
    "verify",
]

_LAZY = {"CheckpointError", "Checkpointer", "Restored"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from unbroken.checkpoint import checkpointer

        return getattr(checkpointer, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
