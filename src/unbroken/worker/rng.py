"""The random number generator states of one rank, as tensors a checkpoint can hold.

Covered: torch's default CPU generator, Python's ``random`` module, and numpy's global legacy
``RandomState`` when numpy is installed. Generators a script creates itself
(``torch.Generator()``, ``numpy.random.default_rng``) are the script's to save; the training
example derives every batch from ``(seed, step, rank)`` instead, which needs no state.

Everything is encoded as int64/float64/uint8 tensors (no pickled objects), so a checkpoint
never unpickles RNG state.
"""

from __future__ import annotations

import random
from collections.abc import Mapping

import torch

TORCH = "rng_torch"
PYTHON = "rng_python"
PYTHON_GAUSS = "rng_python_gauss"
NUMPY = "rng_numpy"
NUMPY_GAUSS = "rng_numpy_gauss"


def capture() -> dict[str, torch.Tensor]:
    """This process's RNG states, keyed by the names above."""
    states: dict[str, torch.Tensor] = {TORCH: torch.get_rng_state()}
    version, internal, gauss_next = random.getstate()
    states[PYTHON] = torch.tensor([version, *internal], dtype=torch.int64)
    states[PYTHON_GAUSS] = torch.tensor(
        [0.0 if gauss_next is None else 1.0, gauss_next or 0.0], dtype=torch.float64
    )
    try:
        import numpy as np
    except ImportError:
        return states
    state = np.random.get_state(legacy=True)
    if isinstance(state, tuple) and state[0] == "MT19937":
        _name, keys, pos, has_gauss, cached = state
        states[NUMPY] = torch.tensor([pos, has_gauss, *keys.tolist()], dtype=torch.int64)
        states[NUMPY_GAUSS] = torch.tensor([cached], dtype=torch.float64)
    return states


def restore(states: Mapping[str, torch.Tensor]) -> list[str]:
    """Set every RNG whose state is in ``states``; returns the names restored."""
    restored = []
    if TORCH in states:
        torch.set_rng_state(states[TORCH].to(torch.uint8))
        restored.append(TORCH)
    if PYTHON in states and PYTHON_GAUSS in states:
        values = [int(v) for v in states[PYTHON].tolist()]
        has_gauss, gauss = states[PYTHON_GAUSS].tolist()
        random.setstate((values[0], tuple(values[1:]), gauss if has_gauss else None))
        restored.append(PYTHON)
    if NUMPY in states and NUMPY_GAUSS in states:
        try:
            import numpy as np
        except ImportError:
            return restored
        values = [int(v) for v in states[NUMPY].tolist()]
        keys = np.array(values[2:], dtype=np.uint32)
        cached = float(states[NUMPY_GAUSS][0])
        np.random.set_state(("MT19937", keys, values[0], values[1], cached))
        restored.append(NUMPY)
    return restored
