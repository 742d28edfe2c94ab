"""Which kind of optimizer a rank's state comes from: :func:`is_zero` tells a
``torch.distributed.optim.ZeroRedundancyOptimizer`` (its state is a partition per rank, saved
sharded by :mod:`unbroken.checkpoint.modelstate`) from any other.

Imports neither torch nor the rest of this package's torch side.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, TypeGuard

if TYPE_CHECKING:
    from torch.distributed.optim import ZeroRedundancyOptimizer


def is_zero(optimizer: object) -> TypeGuard[ZeroRedundancyOptimizer]:
    """Whether ``optimizer`` is a ``ZeroRedundancyOptimizer``, without importing
    ``torch.distributed.optim`` (a script that uses one has imported it). Importing that package
    changes how a rank lets go of a process group: one that left its group no longer closed its
    links, and its peers waited out the collective timeout instead of failing at once."""
    module = sys.modules.get("torch.distributed.optim.zero_redundancy_optimizer")
    cls = getattr(module, "ZeroRedundancyOptimizer", None)
    return cls is not None and isinstance(optimizer, cls)
