"""A MindSpore script's own training state, registered with the session by name (``state=``):
objects with ``state_dict()`` and ``load_state_dict()`` whose state is numbers, strings, lists
and dicts (a counter of tokens seen, a curriculum's stage, a loss scale of the script's own),
the same on every data-parallel rank.

:class:`Registered` keeps each one's state as of the committed step: a checkpoint and last words
hold it (as JSON, in the checkpoint's ``extra.json``), a redone step goes back to it, a restored
session loads it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


class Registered:
    """The registered objects and their committed state."""

    def __init__(self, objects: Mapping[str, Any] | None) -> None:
        self.objects = dict(objects or {})
        for name, obj in self.objects.items():
            if not callable(getattr(obj, "state_dict", None)) or not callable(
                getattr(obj, "load_state_dict", None)
            ):
                raise TypeError(
                    f"state[{name!r}] ({type(obj).__name__}) has no state_dict() and "
                    "load_state_dict(): it cannot be checkpointed"
                )
        self.committed: dict[str, Any] = self._now()

    def __bool__(self) -> bool:
        return bool(self.objects)

    def _now(self) -> dict[str, Any]:
        """Every object's state now, deep-copied through JSON (what a checkpoint holds)."""
        out = {}
        for name, obj in self.objects.items():
            try:
                out[name] = json.loads(json.dumps(obj.state_dict()))
            except (TypeError, ValueError) as e:
                raise TypeError(
                    f"state[{name!r}].state_dict() cannot be checkpointed: {e} (it must hold "
                    "numbers, strings, lists and dicts)"
                ) from None
        return out

    def commit(self) -> None:
        """The step's update is done: its state is the committed one."""
        if self.objects:
            self.committed = self._now()

    def roll_back(self) -> None:
        """A step is redone: every object goes back to the committed state."""
        for name, obj in self.objects.items():
            obj.load_state_dict(json.loads(json.dumps(self.committed[name])))

    def missing_from(self, saved: Mapping[str, Any]) -> list[str]:
        return sorted(set(self.objects) - set(saved))

    def load(self, saved: Mapping[str, Any]) -> None:
        """A checkpoint's state (it holds every registered name: :meth:`missing_from`)."""
        for name, obj in self.objects.items():
            obj.load_state_dict(saved[name])
        self.committed = self._now()
