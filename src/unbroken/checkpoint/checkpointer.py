"""Periodic checkpoints with torch.distributed.checkpoint: asynchronous save, atomic commit.

A save stages the state (model and optimizer through ``get_state_dict``, plus this rank's
``extra`` tensors under the per-rank key ``ranks.<rank>``, and the ``shared`` tensors of the
state every rank holds alike under ``state``) into CPU memory on the caller's
thread, then writes it with ``dcp.save`` on a daemon thread of its own, over a process group
reserved for checkpointing, so the background collectives never interleave with the training's
own on the default group. Not ``dcp.async_save``: its writer thread is not a daemon, so the
interpreter's exit waits for it, and a save stuck on a lost peer would hold the process for the
group's whole timeout. When every rank's files are written, rank 0 commits the checkpoint by
writing its manifest (see :mod:`unbroken.checkpoint.manifest`) and prunes old ones.

Per-rank keys matter: DCP treats a plain tensor under the same key on every rank as replicated
and keeps one copy, so RNG states saved under a shared key would come back as rank 0's on every
rank.

Last words (:meth:`Checkpointer.save_last_words`) are the other kind of save: one healthy
replica, stopped at a step boundary and out of every process group, writes the whole job's
state alone (a data-parallel rank holds all of it) into a hidden directory, commits its
manifest there, and renames the directory into place, so the checkpoint appears whole or not at
all, even over a periodic save of the same step that a dead peer left without a manifest.

At most one save is in flight: :meth:`Checkpointer.save_async` first waits for the previous
one. A save that failed raises :class:`CheckpointError` from the next :meth:`wait` (or
``save_async``): a checkpoint that silently stops happening is worse than a stopped job. A
recovery lets a save in flight go (:meth:`Checkpointer.abandon`): one stuck on a lost peer is
ended by cutting its group's links, so no thread of the process waits out the group's timeout.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.filesystem import FileSystemReader
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from unbroken.checkpoint.manifest import (
    CheckpointInvalid,
    find_latest_good,
    list_checkpoints,
    prune,
    step_dir,
    verify,
    write_manifest,
)
from unbroken.checkpoint.modelstate import load_state_dicts, partial_reason, state_dicts

logger = logging.getLogger(__name__)

_RANKS = "ranks"
_SHARED = "state"


def _private_dir(path: Path) -> None:
    """Create the checkpoint root readable and writable by its owner alone (restoring a
    checkpoint unpickles its metadata: see SECURITY.md); an existing directory is left as it
    is."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)


def _tensors_under(metadata: Metadata, prefix: str) -> dict[str, torch.Tensor]:
    """Empty tensors for every tensor entry of the checkpoint under ``prefix`` (keys without
    it), ready to load into."""
    return {
        key[len(prefix) :]: torch.empty(md.size, dtype=md.properties.dtype)
        for key, md in metadata.state_dict_metadata.items()
        if key.startswith(prefix) and isinstance(md, TensorStorageMetadata)
    }


def _staged(value: Any) -> Any:
    """A copy of a state dict whose tensors are detached clones (a ``DTensor`` clones into a
    ``DTensor``): what the background write reads while the training changes the originals.
    A plain tensor on a GPU is copied to pinned host memory instead, asynchronously (the copy is
    queued on the current stream before the next step's kernels, so it reads the committed
    state; :func:`_staging_done` is what the write waits for): no second copy of the state on the
    device, and no stall of the step."""
    if isinstance(value, torch.Tensor) and value.device.type == "cuda" and _plain(value):
        host = torch.empty_like(value, device="cpu", pin_memory=True)
        host.copy_(value.detach(), non_blocking=True)
        return host
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, Mapping):
        return {k: _staged(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_staged(v) for v in value)
    return value


def _plain(tensor: torch.Tensor) -> bool:
    """Not a tensor subclass (a ``DTensor`` keeps its mesh: it is cloned where it is)."""
    return type(tensor) is torch.Tensor or type(tensor) is torch.nn.Parameter


def _staging_done() -> Callable[[], None]:
    """What the background write calls before it reads the staged state: a wait for the
    device-to-host copies queued so far (nothing without CUDA)."""
    if not torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        return lambda: None
    copied = torch.cuda.Event()  # type: ignore[no-untyped-call]
    copied.record()
    return copied.synchronize


class CheckpointError(RuntimeError):
    """A checkpoint save or load that failed."""


@dataclass(frozen=True)
class Restored:
    """What :meth:`Checkpointer.load_latest` brought back besides model and optimizer."""

    step: int  # committed steps in the checkpoint = the step index to resume at
    path: Path
    world_size: int  # of the run that saved it
    extra: dict[str, torch.Tensor] = field(default_factory=dict)  # this rank's; {} if none
    shared: dict[str, torch.Tensor] = field(default_factory=dict)  # every rank's alike


@dataclass
class _Pending:
    step: int
    path: Path
    done: Future[int]


# How long a save whose group's links were cut gets to fail (it fails as soon as gloo sees them
# close, well under a second).
_LET_GO_S = 5.0


class Checkpointer:
    """Saves and restores checkpoints under ``root``, one directory per step.

    ``pg`` is the process group the checkpoint collectives run on (create it once with
    ``dist.new_group(backend="gloo")``); None uses the default group, and without an
    initialized process group the checkpointer works for a single process. ``cut`` closes
    that group's links (see :meth:`abandon`; ``unbroken.worker.linkfault.OpenedLinks.cut``).
    ``on_saved(step)`` is called from the background thread when this rank's part of a save
    is durable (on rank 0: when the manifest is committed).
    """

    def __init__(
        self,
        root: Path | str,
        pg: dist.ProcessGroup | None = None,
        keep: int = 3,
        on_saved: Callable[[int], None] | None = None,
        cut: Callable[[], int] | None = None,
    ) -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1 (checkpoints to retain), got {keep}")
        self.root = Path(root)
        self.keep = keep
        self._on_saved = on_saved
        self._distributed = dist.is_available() and dist.is_initialized()
        self.rank = 0
        self.world_size = 1
        self.use_group(pg, cut)
        self._pending: _Pending | None = None
        self.last_saved_step: int | None = None

    def use_group(self, pg: dist.ProcessGroup | None, cut: Callable[[], int] | None = None) -> None:
        """Run the checkpoint collectives on ``pg`` from now on (a recovery's new group);
        ``cut`` closes its links. None, after the group was left: no save until the next."""
        self.pg = pg
        self._cut = cut
        if self._distributed and dist.is_initialized():  # not after the group was left
            self.rank = dist.get_rank(pg)
            self.world_size = dist.get_world_size(pg)

    @property
    def pending(self) -> bool:
        """Whether a save is in flight (or finished but not yet waited for)."""
        return self._pending is not None

    def save_async(
        self,
        step: int,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        extra: Mapping[str, torch.Tensor] | None = None,
        shared: Mapping[str, torch.Tensor] | None = None,
    ) -> None:
        """Start saving the state after ``step`` committed steps; returns once it is staged."""
        self.wait()
        path = step_dir(self.root, step)
        if self.rank == 0:
            _private_dir(self.root)
            path.mkdir(mode=0o700, exist_ok=True)
        model_sd, optim_sd = state_dicts(model, optimizer)
        state: dict[str, Any] = {
            "model": model_sd,
            "optim": optim_sd,
            _RANKS: {str(self.rank): dict(extra or {})},
        }
        if shared:
            state[_SHARED] = dict(shared)
        staged = _staged(state)  # the training goes on changing the live tensors
        copied = _staging_done()
        done: Future[int] = Future()
        pending = _Pending(step, path, done)
        thread = threading.Thread(
            target=self._write,
            args=(pending, staged, self.pg, self.rank, self.world_size, copied),
            name=f"unbroken-ckpt-{step}",
            daemon=True,  # an abandoned save stuck on a lost peer must not hold the exit
        )
        self._pending = pending
        thread.start()

    def _write(
        self,
        pending: _Pending,
        staged: dict[str, Any],
        pg: dist.ProcessGroup | None,
        rank: int,
        world_size: int,
        copied: Callable[[], None] = lambda: None,
    ) -> None:
        try:
            copied()  # the staged copies from a GPU have landed in host memory
            metadata = dcp_save(
                staged, checkpoint_id=pending.path, process_group=pg, no_dist=not self._distributed
            )
            if rank == 0:
                assert isinstance(metadata, Metadata)
                files = _saved_files(metadata, pending.path)
                write_manifest(
                    pending.path,
                    step=pending.step,
                    world_size=world_size,
                    files=files,
                    created_at=time.time(),
                )
                prune(self.root, self.keep)
            if self._on_saved is not None:
                self._on_saved(pending.step)
        except BaseException as e:
            pending.done.set_exception(e)
        else:
            pending.done.set_result(pending.step)

    def wait(self) -> int | None:
        """Wait for the save in flight; returns its step, or None when none was pending."""
        pending, self._pending = self._pending, None
        if pending is None:
            return None
        try:
            step = pending.done.result()
        except Exception as e:
            raise CheckpointError(
                f"saving the checkpoint of step {pending.step} to {pending.path} failed: {e}"
            ) from e
        self.last_saved_step = step
        return step

    def abandon(self, wait_s: float) -> None:
        """Give the save in flight ``wait_s`` to finish, then let it go: its collectives may
        wait on a dead peer, or on a peer that let go of its own, until the group's timeout,
        and the process could not exit before. The group's links are cut (``cut``), so they
        fail at once on this rank and on its peers. An abandoned save never writes a manifest
        unless it completes, so it is never loaded half-written."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        try:
            self.last_saved_step = pending.done.result(timeout=wait_s)
            return
        except concurrent.futures.TimeoutError:
            pass
        except Exception as e:
            logger.warning("the checkpoint of step %d is lost: %s", pending.step, e)
            return
        cut = self._cut() if self._cut is not None else 0
        try:
            self.last_saved_step = pending.done.result(timeout=_LET_GO_S if cut else 0.0)
        except concurrent.futures.TimeoutError:
            logger.warning(
                "checkpoint of step %d to %s abandoned: its save is stuck (a peer is gone)",
                pending.step,
                pending.path,
            )
        except Exception as e:
            logger.warning(
                "checkpoint of step %d to %s abandoned: its save was stuck (a peer is gone) "
                "until %d link(s) of its group were cut: %s",
                pending.step,
                pending.path,
                cut,
                e,
            )

    def save_last_words(
        self,
        step: int,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        ranks_extra: Mapping[int, Mapping[str, torch.Tensor]],
        world_size: int,
        shared: Mapping[str, torch.Tensor] | None = None,
    ) -> Path:
        """Write the state after ``step`` committed steps as the checkpoint of a job of
        ``world_size`` ranks, from this process alone, synchronously; returns its directory.

        ``ranks_extra`` holds each rank's per-rank tensors (its data position). For a
        data-parallel replica the model and optimizer are the whole state. Call it outside any
        process group collective (the rank has left its group); nothing here communicates.
        A good checkpoint of ``step`` already there is kept as it is.
        """
        final = step_dir(self.root, step)
        partial = partial_reason(model, optimizer)
        if partial is not None:
            raise CheckpointError(
                f"no last words of step {step}: this rank cannot write the job's state alone: "
                f"{partial}"
            )
        try:
            verify(final, hashes=False)
        except CheckpointInvalid:
            pass
        else:
            logger.info("last words: checkpoint %s is already good", final)
            return final
        tmp = self.root / f".last-words-{step:08d}-{os.getpid()}"
        try:
            _private_dir(self.root)
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(mode=0o700)
            model_sd, optim_sd = state_dicts(model, optimizer)
            state: dict[str, Any] = {
                "model": model_sd,
                "optim": optim_sd,
                _RANKS: {str(r): dict(extra) for r, extra in ranks_extra.items()},
            }
            if shared:
                state[_SHARED] = dict(shared)
            metadata = dcp_save(state, checkpoint_id=tmp, no_dist=True)
            files = _saved_files(metadata, str(tmp))
            write_manifest(
                tmp, step=step, world_size=world_size, files=files, created_at=time.time()
            )
            if final.exists():  # a save of this step that never got its manifest
                aside = final.with_name(final.name + ".invalid")
                shutil.rmtree(aside, ignore_errors=True)
                final.rename(aside)
                logger.warning("moved unfinished checkpoint %s aside to %s", final, aside.name)
            os.rename(tmp, final)
            fd = os.open(self.root, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        except BaseException as e:
            shutil.rmtree(tmp, ignore_errors=True)
            raise CheckpointError(f"saving last words of step {step} to {final} failed: {e}") from e
        prune(self.root, self.keep)
        self.last_saved_step = step
        return final

    def _agree_on_latest(self) -> int:
        """Rank 0 picks the newest good checkpoint; every rank gets its step (-1: none)."""
        found = find_latest_good(self.root) if self.rank == 0 else None
        chosen = torch.tensor([found[0] if found else -1], dtype=torch.int64)
        if self._distributed:
            dist.broadcast(chosen, group=self.pg, group_src=0)
        return int(chosen.item())

    def _set_aside_newer(self, step: int) -> None:
        """Move unusable checkpoint directories newer than ``step`` out of the way (rank 0)."""
        for other, path in list_checkpoints(self.root):
            if other <= step:
                break
            aside = path.with_name(path.name + ".invalid")
            shutil.rmtree(aside, ignore_errors=True)
            path.rename(aside)
            logger.warning("moved unusable checkpoint %s aside to %s", path, aside.name)

    def load_latest(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer
    ) -> Restored | None:
        """Load the newest good checkpoint into ``model`` and ``optimizer`` (collective).

        Returns None when there is none (the state is left as it is).
        """
        step = self._agree_on_latest()
        if self.rank == 0:
            self._set_aside_newer(step)
        if step < 0:
            self._barrier()
            return None
        path = step_dir(self.root, step)
        manifest = verify(path, hashes=False)
        metadata = FileSystemReader(path).read_metadata()
        extra = _tensors_under(metadata, f"{_RANKS}.{self.rank}.")
        shared = _tensors_under(metadata, f"{_SHARED}.")
        if not extra and manifest.world_size != self.world_size:
            logger.warning(
                "checkpoint %s was saved by %d ranks, this run has %d: rank %d has no "
                "per-rank state in it (data position and RNG start fresh)",
                path,
                manifest.world_size,
                self.world_size,
                self.rank,
            )
        model_sd, optim_sd = state_dicts(model, optimizer)
        state: dict[str, Any] = {"model": model_sd, "optim": optim_sd}
        if extra:
            state[_RANKS] = {str(self.rank): extra}
        if shared:
            state[_SHARED] = shared
        try:
            dcp_load(
                state, checkpoint_id=path, process_group=self.pg, no_dist=not self._distributed
            )
        except Exception as e:
            raise CheckpointError(f"loading checkpoint {path} failed: {e}") from e
        load_state_dicts(model, optimizer, state["model"], state["optim"])
        self._barrier()
        logger.info("restored checkpoint %s (step %d)", path, step)
        return Restored(
            step=step, path=path, world_size=manifest.world_size, extra=extra, shared=shared
        )

    def _barrier(self) -> None:
        if self._distributed:
            dist.barrier(group=self.pg)

    def close(self) -> None:
        """Wait for the save in flight (raises :class:`CheckpointError` if it failed)."""
        self.wait()


def _saved_files(metadata: Metadata, path: str | os.PathLike[str]) -> set[str]:
    """The files a finished ``dcp.save`` wrote into ``path``: those its metadata names (torch
    2.13 fills ``storage_data``), or, where the returned metadata leaves it out (torch 2.11 and
    2.12), the data files the directory holds once every rank's write is committed."""
    if metadata.storage_data:
        files = {info.relative_path for info in metadata.storage_data.values()}
    else:
        files = {name for name in os.listdir(path) if name.endswith(".distcp")}
    files.add(".metadata")
    return files
