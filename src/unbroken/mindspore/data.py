"""A MindSpore rank's data stream, sample-exact through every fault.

:class:`Batches` wraps what a MindSpore script trains from, given to
:func:`unbroken.mindspore.init` as ``data=``: a ``mindspore.dataset`` pipeline (a
``GeneratorDataset`` sharded with ``num_shards``/``shard_id``, ``.batch(n)``), or any other
iterable that can be iterated again, one pass an epoch. It serves
:meth:`unbroken.mindspore.Session.batch`: an endless stream across epochs.

- **Epochs.** A dataset pipeline is iterated as one pass of many epochs, which it reshuffles
  at each (its sampler's order a function of the dataset seed the pass begins with: the
  session's ``seed``, else the dataset seed when the session started, set just before the pass
  begins, since the session sets MindSpore's seed every step). Any other iterable is iterated
  again for each epoch.
- **A redone step** (a device memory or link error, the seed's UCE and HCCE) is served the very
  same batches again, from a tape of the batches of the step in progress.
- **The position** ``[epoch, batches into the epoch]`` of the committed step goes into each
  checkpoint and last words. A restored rank begins the pipeline's pass there
  (``Dataset.set_init_step``: MindSpore's own resume, which skips without reading the samples
  under its default fast recovery; random augmentations then draw anew, so keep them seeded
  from the sample), or an iterable's pass of that epoch, skipping the batches trained on.

Every data-parallel rank holds the same position (each reads its own shard), as every rank
holds the same parameters.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any


class DataError(RuntimeError):
    """The data stream cannot serve a batch or take a position."""


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
        self._pipeline = hasattr(data, "create_tuple_iterator")  # a mindspore.dataset one
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
        if self._pipeline:
            return self._read_pipeline()
        for _ in range(2):  # at most one epoch boundary crossed per batch
            if self._iter is None:
                self._iter = self._open_pass()
            batch = next(self._iter, _END)
            if batch is not _END:
                self.index += 1
                return batch
            if self.index == 0:
                raise DataError("the data has no batches")
            self.epoch, self.index, self._iter = self.epoch + 1, 0, None  # its next pass
        raise DataError("the data has no batches")

    def _read_pipeline(self) -> Any:
        """The next batch of a dataset pipeline, iterated as one pass of many epochs (it
        reshuffles at each); the epoch and index follow from its size."""
        size = self._size()
        if self._iter is None:
            if self.index > size:
                raise DataError(
                    f"epoch {self.epoch} has {size} batches, the position says {self.index} "
                    "were trained on: not the data of this run"
                )
            import mindspore.dataset as ds

            self.data.set_init_step(self.epoch * size + self.index)
            # The pipeline takes its shuffle seed when its iterator is made, and the session
            # sets MindSpore's seed every step: the same seed for every pass of the run.
            ds.config.set_seed(self.seed if self.seed is not None else ds.config.get_seed())
            self._iter = _endless(self.data.create_tuple_iterator(num_epochs=_EPOCHS))
        batch = next(self._iter, _END)
        if batch is _END:
            raise DataError("the data pipeline ended")
        if self.index >= size:
            self.epoch, self.index = self.epoch + 1, 0
        self.index += 1
        return batch

    def _size(self) -> int:
        size = int(self.data.get_dataset_size())
        if size <= 0:
            raise DataError("the data has no batches")
        return size

    def _open_pass(self) -> Iterator[Any]:
        """The epoch's pass of a plain iterable, the batches trained on skipped."""
        it: Iterator[Any] = iter(self.data)
        for skipped in range(self.index):
            if next(it, _END) is _END:
                raise DataError(
                    f"epoch {self.epoch} has {skipped} batches, the position says "
                    f"{self.index} were trained on: not the data of this run"
                )
        return it


def _endless(iterator: Any) -> Iterator[Any]:
    """A many-epoch pipeline iterator's batches, across the ends of its epochs; a pass that
    yields nothing ends it."""
    while True:
        got = False
        for batch in iterator:
            got = True
            yield batch
        if not got:
            return


#: The epochs a pipeline's iterator is made for (``num_epochs=-1`` refuses ``set_init_step``).
_EPOCHS = 1_000_000
_END = object()
