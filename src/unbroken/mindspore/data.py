"""A MindSpore rank's data stream, sample-exact through every fault.

:class:`Batches` wraps what a MindSpore script trains from, given to
:func:`unbroken.mindspore.init` as ``data=``: a ``mindspore.dataset`` pipeline (a
``GeneratorDataset`` sharded with ``num_shards``/``shard_id``, ``.batch(n)``), or any other
iterable that can be iterated again, one pass an epoch. It serves
:meth:`unbroken.mindspore.Session.batch`: an endless stream across epochs.

- **Epochs.** Each epoch is a fresh pass (``create_tuple_iterator(num_epochs=1)`` for a
  dataset). With a base seed (the session's ``seed``, else the dataset seed when the session
  started), MindSpore's dataset seed is set from (base, epoch) before each pass: a shuffling
  sampler draws a new order every epoch, and the same order for that epoch after any restart.
- **A redone step** (a device memory or link error, the seed's UCE and HCCE) is served the very
  same batches again, from a tape of the batches of the step in progress.
- **The position** ``[epoch, batches into the epoch]`` of the committed step goes into each
  checkpoint and last words; a restored rank starts that epoch's pass anew and skips the
  batches already trained on.

Every data-parallel rank holds the same position (each reads its own shard), as every rank
holds the same parameters.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from typing import Any


class DataError(RuntimeError):
    """The data stream cannot serve a batch or take a position."""


def epoch_seed(base: int, epoch: int) -> int:
    """The dataset seed of ``epoch``'s pass."""
    digest = hashlib.sha256(f"data:{base}:{epoch}".encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


class Batches:
    """The session's data stream (see the module doc); one per session."""

    def __init__(self, data: Any, seed: int | None) -> None:
        if not hasattr(data, "__iter__") and not hasattr(data, "create_tuple_iterator"):
            raise TypeError(
                "data= must be a mindspore.dataset pipeline or an iterable, got "
                f"{type(data).__name__}"
            )
        self.data = data
        self.seed = seed
        self.epoch = 0
        self.index = 0  # batches served of the epoch
        self._iter: Iterator[Any] | None = None
        self._step_start = (0, 0)  # (epoch, index) where the step in progress began
        # Batches read but not yet trained on: (batch, epoch, index after it); the step in
        # progress was served the first ``_cursor`` of them.
        self._tape: list[tuple[Any, int, int]] = []
        self._cursor = 0

    # -- the position -------------------------------------------------------------------------

    @property
    def committed_position(self) -> list[int]:
        """``[epoch, batches into the epoch]`` where the step in progress began (at a step
        boundary: where the next one begins): what a checkpoint of the committed state holds."""
        return list(self._step_start)

    def load(self, position: Sequence[int]) -> None:
        """Resume at ``[epoch, index]``: that epoch's pass starts anew when the first batch is
        asked for, the first ``index`` batches skipped."""
        if len(position) != 2 or any(int(x) < 0 for x in position):
            raise DataError(f"a data position is [epoch, index] >= 0, got {list(position)}")
        self.epoch, self.index = int(position[0]), int(position[1])
        self._step_start = (self.epoch, self.index)
        self._iter = None
        self._tape.clear()
        self._cursor = 0

    # -- steps --------------------------------------------------------------------------------

    def begin_step(self) -> None:
        """A step starts here (a redone one where it began before)."""
        self._step_start = (self.epoch, self.index)

    def commit(self) -> None:
        """The step's update is done: the batches it was served are trained on."""
        del self._tape[: self._cursor]
        self._cursor = 0
        self._step_start = (self.epoch, self.index)

    def redo(self) -> None:
        """The step's update was left out: serve its batches again."""
        self._cursor = 0
        self.epoch, self.index = self._step_start

    def next(self) -> Any:
        if self._cursor < len(self._tape):
            batch, self.epoch, self.index = self._tape[self._cursor]
        else:
            batch = self._read()
            self._tape.append((batch, self.epoch, self.index))
        self._cursor += 1
        return batch

    # -- reading ------------------------------------------------------------------------------

    def _read(self) -> Any:
        for _ in range(2):  # at most one epoch boundary crossed per batch
            if self._iter is None:
                self._iter = self._open(self.epoch)
                for skipped in range(self.index):
                    if next(self._iter, _END) is _END:
                        raise DataError(
                            f"epoch {self.epoch} has {skipped} batches, the position says "
                            f"{self.index} were trained on: not the data of this run"
                        )
            batch = next(self._iter, _END)
            if batch is not _END:
                self.index += 1
                return batch
            if self.index == 0:
                raise DataError("the data has no batches")
            self.epoch, self.index, self._iter = self.epoch + 1, 0, None
        raise DataError("the data has no batches")

    def _open(self, epoch: int) -> Iterator[Any]:
        if self.seed is not None:
            import mindspore.dataset as ds

            ds.config.set_seed(epoch_seed(self.seed, epoch))
        if hasattr(self.data, "create_tuple_iterator"):
            return iter(self.data.create_tuple_iterator(num_epochs=1))
        return iter(self.data)


_END = object()
