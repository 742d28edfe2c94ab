"""A data loader behind the session, sample-exact through every fault.

:class:`Batches` wraps a ``torch.utils.data.DataLoader`` or torchdata's ``StatefulDataLoader``
(recommended: it resumes without reading the batches it skips) and serves the session's
:meth:`~unbroken.worker.session.Session.batch`: an endless stream across epochs, calling
``set_epoch`` on a ``DistributedSampler`` (or any sampler that has it) at every epoch start, as
the torch docs ask for shuffling to change between epochs.

Exactly once. Every batch served is kept on a short *tape* together with where each step began
(epoch, batches into the epoch, and the stateful loader's ``state_dict()``), for the current
step and the one before: a rank that redoes a step, or that ran one step ahead of the replica
it resumes from, rewinds along the tape and is served the very same batches again, without
touching the loader. A rank that restores from a checkpoint, or a replacement process that
takes the position of a healthy replica, loads the position instead: ``load_state_dict`` on a
stateful loader, or a fresh iterator that skips the epoch's first batches on a plain one.

The position is the same on every data-parallel rank (each rank's ``DistributedSampler``
makes it its own shard), so a replacement takes it from any replica. One thing is not: a
``StatefulDataLoader`` with worker processes draws a base seed for its workers' random
generators per process; a replacement takes the replica's. Datasets whose workers draw random
numbers (augmentations) should seed them from the sample index to be exact on replacements.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

_KEEP_STEPS = 2  # the current step and the one before (a rank at most one step ahead)


@dataclass
class _StepStart:
    step: int
    tape_pos: int  # index of the step's first batch on the tape
    epoch: int
    index: int  # batches served of the epoch before the step
    loader_state: Any  # the stateful loader's state_dict() then; None for a plain loader


class Batches:
    """The session's data stream (see the module doc); one per session."""

    def __init__(self, loader: Any) -> None:
        if not hasattr(loader, "__iter__"):
            raise TypeError(f"data= must be a DataLoader, got {type(loader).__name__}")
        self.loader = loader
        self.stateful = callable(getattr(loader, "state_dict", None)) and callable(
            getattr(loader, "load_state_dict", None)
        )
        self.epoch = 0
        self.index = 0
        self._iter: Iterator[Any] | None = None
        self._skip = 0  # batches a plain loader's fresh iterator must drop first
        self._tape: list[tuple[Any, int, int]] = []  # (batch, epoch, index after serving it)
        self._pos = 0
        self._steps: list[_StepStart] = []
        self._set_epoch(0)

    def __len__(self) -> int:
        return len(self.loader)

    # -- serving -----------------------------------------------------------------------------

    def begin(self, step: int) -> None:
        """Step ``step`` starts: remember where (kept if this is a redo of a step on the tape)."""
        for i, start in enumerate(self._steps):
            if start.step == step:
                if start.tape_pos == self._pos:
                    return  # a redo of a step on the tape
                del self._steps[i:]
                break
        live = self._pos == len(self._tape)
        state = self._loader_state() if live else None
        self._steps.append(_StepStart(step, self._pos, self.epoch, self.index, state))
        if len(self._steps) > _KEEP_STEPS:
            del self._steps[0]
            cut = self._steps[0].tape_pos
            del self._tape[:cut]
            self._pos -= cut
            for start in self._steps:
                start.tape_pos -= cut

    def next(self) -> Any:
        """The next batch of the current step."""
        if self._pos < len(self._tape):
            batch, self.epoch, self.index = self._tape[self._pos]
            self._pos += 1
            return batch
        batch = self._fetch()
        self._tape.append((batch, self.epoch, self.index))
        self._pos += 1
        return batch

    def _fetch(self) -> Any:
        for attempt in range(2):
            try:
                if self._iter is None:
                    self._iter = self._start_epoch()
                batch = next(self._iter)
            except StopIteration:
                if attempt:
                    break
                self._iter = None
                self.epoch += 1
                self.index = 0
                self._set_epoch(self.epoch)
                continue
            self.index += 1
            return batch
        raise RuntimeError(f"the data loader yields no batch (epoch {self.epoch} is empty)")

    def _start_epoch(self) -> Iterator[Any]:
        """A new iterator (skipping what a plain loader must skip). A DataLoader's iterator
        draws its base seed from torch's default generator: the draw must not move the
        training's random stream, or a replacement process that starts its iterator in the
        middle of an epoch would draw other dropout masks than a fault-free run."""
        with torch.random.fork_rng(devices=[]):
            it: Iterator[Any] = iter(self.loader)
            try:
                while self._skip:
                    self._skip -= 1
                    next(it)
            finally:
                self._skip = 0
        return it

    def _set_epoch(self, epoch: int) -> None:
        for holder in (self.loader, getattr(self.loader, "batch_sampler", None)):
            sampler = getattr(holder, "sampler", None)
            set_epoch = getattr(sampler, "set_epoch", None)
            if callable(set_epoch):
                set_epoch(epoch)
                return

    def _loader_state(self) -> Any:
        if not self.stateful:
            return None
        # A StatefulDataLoader starts an iterator to answer, drawing a seed (see above).
        with torch.random.fork_rng(devices=[]):
            return self.loader.state_dict()

    # -- position ----------------------------------------------------------------------------

    def position(self, step: int) -> dict[str, Any]:
        """Where step ``step`` starts (at the boundary before it, or from the tape)."""
        for start in self._steps:
            if start.step == step:
                return {"epoch": start.epoch, "index": start.index, "loader": start.loader_state}
        if self._pos != len(self._tape):
            raise RuntimeError(f"the data position of step {step} is not known on this rank")
        return {"epoch": self.epoch, "index": self.index, "loader": self._loader_state()}

    def counters(self, step: int) -> tuple[int, int]:
        """(epoch, index) where ``step`` starts: the same on every replica."""
        for start in self._steps:
            if start.step == step:
                return start.epoch, start.index
        return self.epoch, self.index

    def rewind(self, step: int) -> bool:
        """Go back to the start of ``step`` along the tape; False when it is not on it (then
        the rank is already there, or must :meth:`load` a position)."""
        for start in self._steps:
            if start.step == step:
                # Later steps keep their starts: their batches are still on the tape, in order.
                self._pos = start.tape_pos
                self.epoch, self.index = start.epoch, start.index
                return True
        return False

    def load(self, position: dict[str, Any]) -> None:
        """Continue from ``position`` (a checkpoint's, or a replica's :meth:`position`)."""
        epoch, index = int(position["epoch"]), int(position["index"])
        self._tape.clear()
        self._steps.clear()
        self._pos = 0
        self._iter = None
        self.epoch, self.index = epoch, index
        self._set_epoch(epoch)
        loader_state = position.get("loader")
        if self.stateful and loader_state is not None:
            self.loader.load_state_dict(loader_state)
            self._skip = 0
        else:
            self._skip = index
