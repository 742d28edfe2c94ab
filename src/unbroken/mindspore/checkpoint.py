"""A MindSpore rank's checkpoints: MindSpore's own ``.ckpt`` file under Unbroken's manifest.

A save writes ``<root>/step_<N>/model.ckpt`` (every parameter of the network and the optimizer,
by name, through ``mindspore.save_checkpoint``: readable by MindSpore's and MindFormers' tools)
and ``extra.json`` (the data position and the run's world size), then commits the directory's
``MANIFEST.json`` (:mod:`unbroken.checkpoint.manifest`: sizes and sha256 of both files, written
last and atomically). A directory without a good manifest is never loaded. Data parallelism:
every rank holds the same state, so one rank (rank 0, or the rank writing last words) saves.

Last words (:func:`save_last_words`) may be tried by every rank that saw the step fail: the
first to claim the step writes them, the others leave them to it.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from unbroken.checkpoint.manifest import (
    CheckpointInvalid,
    find_latest_good,
    prune,
    step_dir,
    verify,
    write_manifest,
)

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
    tmp = path.with_name(f".{path.name}.tmp.{os.getpid()}")
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


def _claim_path(root: Path, step: int) -> Path:
    return root / f".{step_dir(root, step).name}.lastwords"


def save_last_words(
    root: Path,
    step: int,
    params: Mapping[str, Any],
    extra: Mapping[str, Any],
    world_size: int,
    keep: int,
) -> Path | None:
    """Last words of ``step``: written by the first rank to claim them; None when a good
    checkpoint of that step exists or another rank claimed them."""
    if is_good(step_dir(root, step)):
        return None
    root.mkdir(parents=True, exist_ok=True)
    try:
        os.close(os.open(_claim_path(root, step), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
    except FileExistsError:
        return None
    return save(root, step, params, extra, world_size, keep)


def last_words_taken(root: Path, step: int) -> bool:
    """Whether ``step``'s last words are written or being written (claimed)."""
    return _claim_path(root, step).exists() or is_good(step_dir(root, step))


def clear_leftovers(root: Path) -> None:
    """Forget the claims of earlier last words and remove saves that never finished; call it
    only when every process that could be writing has ended."""
    for claim_file in root.glob(".step_*.lastwords"):
        claim_file.unlink(missing_ok=True)
    for tmp in root.glob(".step_*.tmp.*"):
        shutil.rmtree(tmp, ignore_errors=True)


def is_good(path: Path) -> bool:
    try:
        verify(path)
    except CheckpointInvalid:
        return False
    return True


def load_latest(
    root: Path, params: Mapping[str, Any], *, step: int | None = None
) -> Restored | None:
    """Load the newest good checkpoint under ``root`` (the one of ``step`` when given) into
    ``params`` (by name, every one of them); None when there is none."""
    import mindspore as ms

    if step is None:
        found = find_latest_good(root)
        if found is None:
            return None
        step, path = found
    else:
        path = step_dir(root, step)
        try:
            verify(path)
        except CheckpointInvalid as e:
            raise CheckpointError(f"checkpoint {path} cannot be loaded: {e.reason}") from None
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
        # In place (set_data would detach it from a step compiled before this load).
        ms.ops.assign(param, ms.Tensor(value.asnumpy()))
    extra = json.loads((path / EXTRA_FILE).read_text())
    return Restored(step=step, path=path, extra=extra)
