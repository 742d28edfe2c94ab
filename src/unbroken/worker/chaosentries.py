"""A rank's ``--chaos`` entries, read from its environment, and the claim that makes each fire
once per run: the part of :mod:`unbroken.worker.chaos` every framework's worker shares
(standard library only; the MindSpore worker, :mod:`unbroken.mindspore`, imports no torch).

The job manager hands each rank its entries in ``UNBROKEN_CHAOS`` (JSON) and a directory in
``UNBROKEN_CHAOS_DIR``. The first rank to fire entry ``i`` creates ``fired-<i>`` there with
O_EXCL, so a step replayed after a restart does not fire it again.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

CHAOS = "UNBROKEN_CHAOS"
CHAOS_DIR = "UNBROKEN_CHAOS_DIR"


@dataclass(frozen=True)
class ChaosEntry:
    index: int
    kind: str
    at_step: int
    code: str | None = None
    times: int = 1


def entries_from_env(
    rank: int, env: Mapping[str, str]
) -> tuple[tuple[ChaosEntry, ...], Path | None]:
    """Rank ``rank``'s entries (those with a step) and the directory their claims go in."""
    text, where = env.get(CHAOS), env.get(CHAOS_DIR)
    entries: tuple[ChaosEntry, ...] = ()
    if text and where:
        entries = tuple(
            ChaosEntry(
                int(e["index"]),
                str(e["kind"]),
                int(e["at_step"]),
                e.get("code"),
                int(e.get("times") or 1),
            )
            for e in json.loads(text)
            if e.get("rank") == rank and e.get("at_step") is not None
        )
    return entries, Path(where) if where else None


def claim(fired_dir: Path, entry: ChaosEntry) -> bool:
    """Whether this process fires ``entry`` (the first in the run to ask)."""
    fired_dir.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(fired_dir / f"fired-{entry.index}", os.O_CREAT | os.O_EXCL)
    except FileExistsError:
        return False
    os.close(fd)
    return True
