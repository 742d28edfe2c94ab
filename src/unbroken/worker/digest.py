"""A digest of a model's state: equal digests mean bitwise-equal state.

Recovery checks compare it across ranks before resuming, and tests compare the final model of
a run that went through faults with a fault-free run's.
"""

from __future__ import annotations

import hashlib

import torch
from torch.nn.parallel import DistributedDataParallel


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
            tensor = value.detach().cpu().contiguous()
            digest.update(f"{tensor.dtype}{tuple(tensor.shape)}".encode())
            digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
        else:
            digest.update(repr(value).encode())
    return digest.hexdigest()
