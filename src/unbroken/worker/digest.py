"""A digest of a model's state: equal digests mean bitwise-equal state.

Recovery checks compare it across ranks before resuming, and tests compare the final model of
a run that went through faults with a fault-free run's. A ``DTensor`` (FSDP2, HSDP) counts by
its local shard: the digest is this rank's part of the state, equal on the ranks that hold the
same shard (:mod:`unbroken.worker.sharding`).

:func:`state_digest` and :func:`update_digest` hash every byte in one sha256. The training
state's digests (:meth:`unbroken.worker.trainstate.TrainState.digests`) are a tree instead: the
structure with each tensor's own hash (:func:`tensor_hash`, :class:`TensorHashes`) in its
place, so tensors can be hashed in any order, on threads (both hashes release the GIL over large
buffers), and as they arrive during a repair rather than after it.

A tensor's own hash is XXH3-128 (:data:`TENSOR_HASH`) where the ``xxhash`` package is
installed, sha256 otherwise. Every byte of the state is hashed by each replica at every
agreement check, and during a repair beside the transfer, on the same CPUs: XXH3 takes about
20 GB/s a core here, sha256 1.8 (with the CPU's SHA extensions; ``bench/overhead_size.py``
prints both). The hash guards
against faults (a flipped bit, a replica that drifted, a transfer cut short), where a 128-bit
hash's chance of missing a difference is 2^-128; it is not a defence against a rank that crafts
collisions, which, being in the job, holds the state itself. The trees over these hashes are
sha256. The hash's name goes into every tree, so ranks that hash differently differ loudly
rather than falsely agree: one job's ranks share an install.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

_xxhash: Any
try:
    import xxhash as _xxhash
except ImportError:  # pragma: no cover - the package is a dependency; sha256 where it is absent
    _xxhash = None

#: The hash each tensor's bytes go through (:func:`tensor_hash`).
TENSOR_HASH = "sha256" if _xxhash is None else "xxh3-128"


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def state_digest(module: torch.nn.Module) -> str:
    """sha256 (hex) over the module's state_dict: every key, dtype, shape and byte.

    A ``DistributedDataParallel`` wrapper is looked through, so the wrapped and the bare
    module have the same digest.
    """
    if isinstance(module, DistributedDataParallel):
        module = module.module
    digest = hashlib.sha256()
    for key, value in sorted(module.state_dict().items()):
        digest.update(key.encode())
        if isinstance(value, torch.Tensor):
            local = _local(value)
            digest.update(f"{local.dtype}{tuple(local.shape)}".encode())
            digest.update(_bytes(local))
        else:
            digest.update(repr(value).encode())
    return digest.hexdigest()


def _bytes(tensor: torch.Tensor) -> memoryview:
    """The tensor's bytes without a copy when it is a contiguous CPU tensor."""
    flat = _local(tensor).detach().cpu().contiguous().reshape(-1).view(torch.uint8)
    return flat.numpy().data


def update_digest(
    digest: Any, value: object, tensor_hash: Callable[[torch.Tensor], bytes] | None = None
) -> None:
    """Feed ``value`` (tensors, mappings, sequences, scalars) into the hash ``digest``; with
    ``tensor_hash``, each tensor's hash (:class:`TensorHashes`) goes in instead of its bytes."""
    if isinstance(value, torch.Tensor):
        local = _local(value)
        digest.update(f"T{local.dtype}{tuple(local.shape)}".encode())
        if tensor_hash is None:
            digest.update(_bytes(local))
        else:
            digest.update(b"H" + tensor_hash(local))
    elif isinstance(value, Mapping):
        digest.update(b"{")
        for key in sorted(value, key=repr):
            digest.update(repr(key).encode())
            update_digest(digest, value[key], tensor_hash)
        digest.update(b"}")
    elif isinstance(value, list | tuple):
        digest.update(b"(" if isinstance(value, tuple) else b"[")
        for item in value:
            update_digest(digest, item, tensor_hash)
        digest.update(b"]")
    else:
        digest.update(f"{type(value).__name__}:{value!r};".encode())


def tensors_in(value: object) -> Iterable[torch.Tensor]:
    """Every tensor in a nested state dict, in :func:`update_digest`'s order."""
    if isinstance(value, torch.Tensor):
        yield _local(value)
    elif isinstance(value, Mapping):
        for key in sorted(value, key=repr):
            yield from tensors_in(value[key])
    elif isinstance(value, list | tuple):
        for item in value:
            yield from tensors_in(item)


def tensor_hash(tensor: torch.Tensor) -> bytes:
    """The hash (:data:`TENSOR_HASH`) of a tensor's dtype, shape and bytes."""
    head = f"{TENSOR_HASH}:{tensor.dtype}{tuple(tensor.shape)}".encode()
    h: Any = hashlib.sha256(head) if _xxhash is None else _xxhash.xxh3_128(head)
    h.update(_bytes(tensor))
    return bytes(h.digest())


def hash_threads() -> int:
    """Threads a rank hashes on: its share of this host's CPUs (``LOCAL_WORLD_SIZE`` ranks
    share them), at least one, at most eight."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cpus = os.cpu_count() or 1
    local = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1))
    return max(1, min(8, cpus // local))


class TensorHashes:
    """Each tensor's :func:`tensor_hash`, taken once per content: on ``threads`` background
    threads for the tensors given to :meth:`submit`, on the caller's thread for any other.

    A tensor is known by its memory (address, dtype, shape, strides) and its version counter,
    which every in-place change of it (``copy_``, an optimizer update) advances: a tensor
    changed since it was hashed is hashed again. Writes that bypass the counter (a collective
    receiving into the tensor) must come before :meth:`submit`. The tensors hashed are kept
    alive, so their memory cannot be taken by another tensor while this object lives: keep
    one for one comparison (a repair, an agreement check), then :meth:`close` it.
    """

    def __init__(self, threads: int = 1) -> None:
        self._pool = ThreadPoolExecutor(max_workers=max(1, threads)) if threads > 0 else None
        self._lock = threading.Lock()
        self._known: dict[tuple[Any, ...], tuple[torch.Tensor, Future[bytes]]] = {}

    @staticmethod
    def _key(tensor: torch.Tensor) -> tuple[Any, ...]:
        return (
            tensor.device,
            tensor.data_ptr(),
            tensor.dtype,
            tuple(tensor.shape),
            tensor.stride(),
            tensor._version,
        )

    def submit(self, tensors: Iterable[torch.Tensor]) -> None:
        """Start hashing ``tensors`` in the background."""
        for tensor in tensors:
            key = self._key(tensor)
            with self._lock:
                if key in self._known:
                    continue
                if self._pool is None:
                    done: Future[bytes] = Future()
                    done.set_result(tensor_hash(tensor))
                    self._known[key] = (tensor, done)
                else:
                    self._known[key] = (tensor, self._pool.submit(tensor_hash, tensor))

    def forget(self, tensors: Iterable[torch.Tensor]) -> None:
        """Drop what is known of ``tensors``: they are about to be written in a way their
        version counter does not see (a collective receiving into them)."""
        with self._lock:
            for tensor in tensors:
                self._known.pop(self._key(tensor), None)

    def __call__(self, tensor: torch.Tensor) -> bytes:
        """The tensor's hash: the background result, or hashed now."""
        with self._lock:
            known = self._known.get(self._key(tensor))
        if known is None:
            return tensor_hash(tensor)
        return known[1].result()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
        self._known.clear()

    def __enter__(self) -> TensorHashes:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def training_state_digest(
    module: torch.nn.Module, optimizer: torch.optim.Optimizer, committed: int
) -> bytes:
    """sha256 (32 bytes) over the model state (as :func:`state_digest`), the optimizer's
    ``state_dict`` (state tensors and scalars, hyperparameters of every group) and the number
    of committed steps: two ranks with the same digest continue bitwise identically."""
    digest = hashlib.sha256(state_digest(module).encode())
    update_digest(digest, optimizer.state_dict())
    digest.update(f"committed:{committed}".encode())
    return digest.digest()
