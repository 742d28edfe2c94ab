"""The device a rank trains on: ``ub.device()``.

A pod sees the GPUs of its device slots, as a device plugin exports them: ``CUDA_VISIBLE_DEVICES``
lists them (several slots may share one GPU when a node has fewer GPUs than ranks), and
``UNBROKEN_CUDA_DEVICE`` is this rank's index among them (set by its agent from the pod's
``UNBROKEN_CUDA_DEVICES``, one entry per local rank). Outside such a pod (plain ``torchrun``),
the rank takes ``cuda:LOCAL_RANK`` modulo the GPUs it sees, as scripts written for torchrun do.
Without CUDA, the CPU.

Asking for the device initialises CUDA in the rank (never in a zygote:
:mod:`unbroken.agent.standby`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import torch

#: This rank's index among the pod's visible GPUs (set by the agent, :mod:`unbroken.agent.env`).
CUDA_DEVICE = "UNBROKEN_CUDA_DEVICE"


def device(environ: Mapping[str, str] | None = None) -> torch.device:
    """The device this rank trains on (see the module doc); made current for CUDA."""
    env = os.environ if environ is None else environ
    if not torch.cuda.is_available():
        return torch.device("cpu")
    count = torch.cuda.device_count()
    given = env.get(CUDA_DEVICE, "")
    index = int(given) if given.isdigit() else int(env.get("LOCAL_RANK", "0") or 0) % count
    if not 0 <= index < count:
        raise RuntimeError(
            f"{CUDA_DEVICE}={given} names no GPU this rank sees ({count}: "
            f"CUDA_VISIBLE_DEVICES={env.get('CUDA_VISIBLE_DEVICES', '')!r})"
        )
    torch.cuda.set_device(index)
    return torch.device("cuda", index)
