"""Model and optimizer state as ``torch.distributed.checkpoint`` saves it, for every layout.

``get_state_dict``/``set_state_dict`` of ``torch.distributed.checkpoint.state_dict`` cover a
plain or DDP model and FSDP2 (``fully_shard``) on a 1-D or 2-D (HSDP) device mesh: parameters
and optimizer state are ``DTensor`` shards, each rank saves its own, replicated shards once,
and a load at another world size reads the slices of the new layout (resharding).

``torch.distributed.optim.ZeroRedundancyOptimizer`` is not covered there: its ``state_dict()``
holds the global state only after ``consolidate_state_dict(to=r)``, a collective that gathers
every rank's partition on rank ``r``, and raises otherwise. Unbroken saves it sharded instead:
each rank saves the state of the parameters its partition holds (the ZeRO optimizer's local
optimizer, ``optimizer.optim``) keyed by parameter name with torch's flattened optimizer state
dict (``state.<name>.exp_avg``, ``param_groups.<name>.lr``), so the keys of two ranks never
collide, no rank gathers what it does not own, and a load at another world size, whose
partition differs, reads by name what its new partition holds. The hyperparameters the script
sets on the ZeRO optimizer (an LR scheduler writes ``optimizer.param_groups``) are copied to
the local optimizer before a save, and back after a load.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.tensor import DTensor

from unbroken.checkpoint.optimizer import is_zero

_ZERO_OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)


def _hyperparameters(source: list[dict[str, Any]], target: list[dict[str, Any]]) -> None:
    """Copy every group's hyperparameters (all keys but ``params``) from ``source`` to
    ``target``, group by group; groups of ``source`` without parameters carry none."""
    if len(source) != len(target):
        raise ValueError(
            f"the optimizer has {len(target)} parameter groups, its state {len(source)}"
        )
    for src, dst in zip(source, target, strict=True):
        if not src["params"]:
            continue
        for key, value in src.items():
            if key != "params":
                dst[key] = value


def state_dicts(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer
) -> tuple[dict[str, Any], dict[str, Any]]:
    """This rank's model and optimizer state dicts for a DCP save or load (see the module
    doc)."""
    if is_zero(optimizer):
        local = optimizer.optim
        _hyperparameters(optimizer.param_groups, local.param_groups)
        return get_state_dict(model, local, options=_ZERO_OPTIONS)
    return get_state_dict(model, optimizer)


def load_state_dicts(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    model_sd: dict[str, Any],
    optim_sd: dict[str, Any],
) -> None:
    """Load what :func:`state_dicts` gave and DCP filled in into ``model`` and ``optimizer``."""
    if is_zero(optimizer):
        local = optimizer.optim
        set_state_dict(
            model,
            local,
            model_state_dict=model_sd,
            optim_state_dict=optim_sd,
            options=_ZERO_OPTIONS,
        )
        _hyperparameters(local.param_groups, optimizer.param_groups)
        _hyperparameters(optimizer.param_groups, local.param_groups)
        return
    set_state_dict(model, optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd)


def partial_reason(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> str | None:
    """Why this rank does not hold the whole model and optimizer state (None: it does), so
    that it cannot write the job's state alone (last words)."""
    if is_zero(optimizer):
        return "the ZeroRedundancyOptimizer holds a partition of the optimizer state per rank"
    for name, param in model.named_parameters():
        if isinstance(param, DTensor) and any(p.is_shard() for p in param.placements):
            return f"the model's parameters are sharded (DTensor {name} is a shard)"
    return None
