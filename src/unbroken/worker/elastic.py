"""Gradients of virtual data-parallel ranks, summed in one order whatever the world size.

An elastic job keeps the arithmetic of its full-size run when it shrinks or grows: ``V``
virtual ranks (the job's largest data-parallel size) each own a fixed slice of every global
batch, and the physical ranks host one or more of them (:mod:`unbroken.worker.vranks`). A
script runs each hosted virtual rank's forward and backward inside
``session.virtual_rank(v)``, which seeds the step's random numbers from ``(seed, v, step)``
and, on leaving, copies that virtual rank's gradients into a row of its own; then
``session.reduce_gradients()`` all-gathers every rank's rows and sums ``v = 0 .. V-1`` locally,
left to right, and divides by ``V``. Each virtual rank's gradient is computed from the same
parameters and the same inputs wherever it runs, and the sum's order never changes, so the
result is bitwise the same on 1, 2, ..., ``V`` physical ranks, and so is a run whose world size
changes between steps. A ring all-reduce cannot promise that: where an element's sum starts
depends on the number of ranks.

The cost is the all-gather: each rank receives ``(P-1) * ceil(V/P)`` rows of the model's
gradient size where a ring all-reduce moves about ``2 (P-1)/P`` of one, and each rank adds
``V`` rows. :func:`gather_bytes` gives the bytes a rank receives per step.

A collective that fails inside :meth:`VirtualGrads.reduce` fails the step as a failed DDP
all-reduce does (the session's recovery stops the rank at the boundary, regroups, repairs and
redoes the step); without recovery (plain ``torchrun``) it raises.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator

import torch
import torch.distributed as dist

from unbroken.worker import vranks
from unbroken.worker.steprng import step_seed

logger = logging.getLogger(__name__)

#: All-gathers one tensor over the training group (raises when a peer is lost).
AllGather = Callable[[torch.Tensor], list[torch.Tensor]]


def gather_bytes(virtual: int, world_size: int, numel: int, element_size: int = 4) -> int:
    """Bytes one rank receives per step from :meth:`VirtualGrads.reduce`."""
    return (world_size - 1) * vranks.most_hosted(virtual, world_size) * numel * element_size


class VirtualGrads:
    """One physical rank's gradients of its virtual ranks for the current step."""

    def __init__(self, module: torch.nn.Module, virtual: int) -> None:
        self.virtual = virtual
        self.params = [p for p in module.parameters() if p.requires_grad]
        dtypes = {p.dtype for p in self.params}
        if len(dtypes) > 1:
            raise ValueError(
                "virtual ranks need every trained parameter in one dtype, got "
                + ", ".join(sorted(str(d) for d in dtypes))
            )
        self.dtype = self.params[0].dtype if self.params else torch.float32
        self.numel = sum(p.numel() for p in self.params)
        self._rows: torch.Tensor | None = None
        self._hosted: range = range(0)
        self._filled: set[int] = set()

    def begin(self, world_size: int, rank: int) -> range:
        """Start a step on physical ``rank`` of ``world_size``; returns its virtual ranks."""
        self._hosted = vranks.hosted(self.virtual, world_size, rank)
        rows = vranks.most_hosted(self.virtual, world_size)
        if self._rows is None or self._rows.shape[0] != rows:
            self._rows = torch.zeros(rows, self.numel, dtype=self.dtype)
        self._filled = set()
        return self._hosted

    @property
    def hosted(self) -> range:
        return self._hosted

    @contextlib.contextmanager
    def virtual_rank(self, v: int, seed: int | None, step: int) -> Iterator[None]:
        """Run virtual rank ``v``'s forward and backward inside: gradients start unset, the
        random numbers come from ``(seed, v, step)``, and ``v``'s gradients are kept aside."""
        if v not in self._hosted:
            raise ValueError(
                f"virtual rank {v} is not hosted here (this rank hosts "
                f"{list(self._hosted)}); iterate over session.virtual_ranks"
            )
        if v in self._filled:
            raise ValueError(f"virtual rank {v}'s gradients were already taken this step")
        for p in self.params:
            p.grad = None
        if seed is not None:
            torch.default_generator.manual_seed(step_seed(seed, v, step))
        yield
        assert self._rows is not None
        row = self._rows[v - self._hosted.start]
        offset = 0
        for p in self.params:
            n = p.numel()
            if p.grad is None:
                row[offset : offset + n].zero_()
            else:
                row[offset : offset + n].copy_(p.grad.reshape(-1))
            offset += n
        self._filled.add(v)

    def reduce(self, all_gather: AllGather, world_size: int) -> None:
        """Every virtual rank's gradients summed in the order ``0 .. V-1`` and divided by
        ``V``, written to the parameters' ``.grad``. Raises what the all-gather raised."""
        missing = [v for v in self._hosted if v not in self._filled]
        if missing:
            raise RuntimeError(
                f"virtual rank(s) {missing} ran no backward this step: run every one of "
                "session.virtual_ranks inside session.virtual_rank(v) before reducing"
            )
        assert self._rows is not None
        gathered = all_gather(self._rows) if world_size > 1 else [self._rows]
        total: torch.Tensor | None = None
        for v in range(self.virtual):
            rank, row = vranks.host_of(self.virtual, world_size, v)
            g = gathered[rank][row]
            if total is None:
                total = g.clone()
            else:
                total.add_(g)
        assert total is not None
        total.div_(self.virtual)
        offset = 0
        for p in self.params:
            n = p.numel()
            p.grad = total[offset : offset + n].view_as(p)
            offset += n


def plain_all_gather(tensor: torch.Tensor) -> list[torch.Tensor]:
    """All-gather over the default group (a session without in-process recovery)."""
    gathered = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, tensor)
    return gathered
