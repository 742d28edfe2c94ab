"""A MindSpore rank's checkpoints: MindSpore's own ``.ckpt`` file under Unbroken's manifest.

A save writes ``<root>/step_<N>/model.ckpt`` (every parameter of the network and the optimizer,
by name, through ``mindspore.save_checkpoint``: readable by MindSpore's and MindFormers' tools)
and ``extra.json`` (the data position and the run's world size), then commits the directory's
``MANIFEST.json`` (:mod:`unbroken.checkpoint.manifest`: sizes and sha256 of both files, written
last and atomically). A directory without a good manifest is never loaded. Data parallelism:
every rank holds the same state, so one rank (rank 0, or the rank writing last words) saves.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from unbroken.checkpoint.manifest import find_latest_good, prune, step_dir, write_manifest

MODEL_FILE = "model.ckpt"
EXTRA_FILE = "extra.json"


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be written or loaded into this network."""


@dataclass(frozen=True)
class Restored:
    step: int
    path: Path
    extra: dict[str, Any]


def save(
    root: Path,
    step: int,
    params: Mapping[str, Any],
    extra: Mapping[str, Any],
    world_size: int,
    keep: int,
) -> Path:
    """Write the checkpoint of ``step`` committed steps; older ones beyond ``keep`` go."""
    import mindspore as ms

    path = step_dir(root, step)
    tmp = path.with_name(f".{path.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    ms.save_checkpoint([{"name": n, "data": p} for n, p in params.items()], str(tmp / MODEL_FILE))
    (tmp / EXTRA_FILE).write_text(json.dumps(dict(extra), sort_keys=True) + "\n")
    shutil.rmtree(path, ignore_errors=True)
    tmp.rename(path)
    write_manifest(
        path,
        step=step,
        world_size=world_size,
        files=(MODEL_FILE, EXTRA_FILE),
        created_at=time.time(),
    )
    prune(root, keep)
    return path


def load_latest(root: Path, params: Mapping[str, Any]) -> Restored | None:
    """Load the newest good checkpoint under ``root`` into ``params`` (by name, every one of
    them); None when there is none."""
    import mindspore as ms

    found = find_latest_good(root)
    if found is None:
        return None
    step, path = found
    saved = ms.load_checkpoint(str(path / MODEL_FILE))
    missing = sorted(set(params) - set(saved))
    if missing:
        raise CheckpointError(
            f"checkpoint {path} has no {', '.join(missing[:5])}"
            + (f" (and {len(missing) - 5} more)" if len(missing) > 5 else "")
            + ": it is not this network's"
        )
    for name, param in params.items():
        value = saved[name]
        if tuple(value.shape) != tuple(param.shape):
            raise CheckpointError(
                f"checkpoint {path}: {name} has shape {tuple(value.shape)}, "
                f"the network's is {tuple(param.shape)}"
            )
        param.set_data(ms.Tensor(value.asnumpy()))
    extra = json.loads((path / EXTRA_FILE).read_text())
    return Restored(step=step, path=path, extra=extra)
