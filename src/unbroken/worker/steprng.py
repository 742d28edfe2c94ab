"""Each step's random numbers, reproducible when the step runs again.

With a seed (``unbroken.worker.init(..., seed=...)``), every step starts by seeding torch's
default generator, Python's ``random`` and, when the script uses it, numpy's global generator
from ``(seed, rank, step)``: a rank's random stream is then a pure function of where it is,
so a step redone after a fault, on a surviving process or on a replacement that never saw the
earlier steps, draws the same numbers (dropout masks, augmentations) as in a fault-free run.

Without a seed the generators run on as the script set them, and the state at the start of the
current step is kept instead: a surviving rank that redoes the step rewinds to it. A replaced
rank cannot: its generators died with the old process.
"""

from __future__ import annotations

import hashlib
import random
import sys
from typing import Any

import torch


def step_seed(seed: int, rank: int, step: int) -> int:
    """A 63-bit seed for ``rank``'s generators at ``step``, well mixed from the three."""
    digest = hashlib.sha256(f"unbroken/{seed}/{rank}/{step}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


class StepRng:
    """Seeds (with a seed) or snapshots (without) the generators at every step start."""

    def __init__(self, seed: int | None, *, snapshot: bool) -> None:
        self.seed = seed
        self._snapshot_enabled = snapshot and seed is None
        self._snapshot: tuple[int, torch.Tensor, Any, Any] | None = None

    def begin(self, step: int, rank: int) -> None:
        if self.seed is not None:
            value = step_seed(self.seed, rank, step)
            # torch.manual_seed also visits every accelerator backend (90 us a call on CPU);
            # seed the CPU generator directly and CUDA's only when it is in use.
            torch.default_generator.manual_seed(value)
            if torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
                torch.cuda.manual_seed_all(value)
            random.seed(value)
            numpy = sys.modules.get("numpy")
            if numpy is not None:
                numpy.random.seed(value & 0xFFFFFFFF)
        elif self._snapshot_enabled:
            numpy = sys.modules.get("numpy")
            self._snapshot = (
                step,
                torch.get_rng_state(),
                random.getstate(),
                numpy.random.get_state() if numpy is not None else None,
            )

    def rewind(self, step: int) -> bool:
        """Put the generators back to where they were when ``step`` began; False when that is
        not known (no snapshot of that step). With a seed there is nothing to rewind: the
        step's start seeds them again."""
        if self.seed is not None:
            return True
        if self._snapshot is None or self._snapshot[0] != step:
            return False
        _, torch_state, python_state, numpy_state = self._snapshot
        torch.set_rng_state(torch_state)
        random.setstate(python_state)
        numpy = sys.modules.get("numpy")
        if numpy is not None and numpy_state is not None:
            numpy.random.set_state(numpy_state)
        return True
