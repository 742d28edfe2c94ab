"""The worker library for MindSpore ranks: ``import unbroken.mindspore as ub``.

:func:`init` (after ``mindspore.communication.init()``) starts the rank's session
(:mod:`unbroken.mindspore.session`). Importing this package imports neither MindSpore nor torch;
the first use of a MindSpore-backed name does (``pip install 'unbroken[mindspore]'``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from unbroken.mindspore.session import (
        LinkError,
        Session,
        TrainingStopped,
        init,
        state_digest,
    )

__all__ = ["LinkError", "Session", "TrainingStopped", "init", "state_digest"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        import importlib

        return getattr(importlib.import_module("unbroken.mindspore.session"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
