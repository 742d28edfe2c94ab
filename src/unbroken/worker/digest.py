"""A digest of a model's state: equal digests mean bitwise-equal state.

Recovery checks compare it across ranks before resuming, and tests compare the final model of
a run that went through faults with a fault-free run's. A ``DTensor`` (FSDP2, HSDP) counts by
its local shard: the digest is this rank's part of the state, equal on the ranks that hold the
same shard (:mod:`unbroken.worker.sharding`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import torch
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def state_digest(module: torch.nn.Module) -> str:
    """sha256 (hex) over the module's state_dict: every key, dtype, shape and byte.

    A ``DistributedDataParallel`` wrapper is looked through, so the wrapped and the bare
    module have the same digest.
    """
    if isinstance(module, DistributedDataParallel):
        module = module.module
    digest = hashlib.sha256()
    for key, value in sorted(module.state_dict().items()):
        digest.update(key.encode())
        if isinstance(value, torch.Tensor):
            tensor = _local(value).detach().cpu().contiguous()
            digest.update(f"{tensor.dtype}{tuple(tensor.shape)}".encode())
            digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
        else:
            digest.update(repr(value).encode())
    return digest.hexdigest()


def update_digest(digest: Any, value: object) -> None:
    """Feed ``value`` (tensors, mappings, sequences, scalars) into the hash ``digest``."""
    if isinstance(value, torch.Tensor):
        tensor = _local(value).detach().cpu().contiguous()
        digest.update(f"T{tensor.dtype}{tuple(tensor.shape)}".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    elif isinstance(value, Mapping):
        digest.update(b"{")
        for key in sorted(value, key=repr):
            digest.update(repr(key).encode())
            update_digest(digest, value[key])
        digest.update(b"}")
    elif isinstance(value, list | tuple):
        digest.update(b"(" if isinstance(value, tuple) else b"[")
        for item in value:
            update_digest(digest, item)
        digest.update(b"]")
    else:
        digest.update(f"{type(value).__name__}:{value!r};".encode())


def training_state_digest(
    module: torch.nn.Module, optimizer: torch.optim.Optimizer, committed: int
) -> bytes:
    """sha256 (32 bytes) over the model state (as :func:`state_digest`), the optimizer's
    ``state_dict`` (state tensors and scalars, hyperparameters of every group) and the number
    of committed steps: two ranks with the same digest continue bitwise identically."""
    digest = hashlib.sha256(state_digest(module).encode())
    update_digest(digest, optimizer.state_dict())
    digest.update(f"committed:{committed}".encode())
    return digest.digest()
