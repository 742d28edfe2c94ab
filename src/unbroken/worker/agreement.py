"""Replicas agree, or it is a fault: data-parallel ranks compare digests of their state.

Every data-parallel rank holds the same model, optimizer and registered objects, and stands at
the same data position (:mod:`unbroken.worker.trainstate`). :func:`check` all-gathers a sha256
of each part from every rank and compares: any difference raises :class:`ReplicasDiverged`,
naming the ranks and the parts, on every rank. The session runs it every ``agree_every``
committed steps, and when it closes; the repair after an in-process recovery runs its own
(:mod:`unbroken.worker.replica`). A divergence is never trained over: the exception is a
``BaseException`` (a script's ``except Exception`` does not swallow it), every rank of the
job exits with it, and the job restarts from its newest checkpoint, a state every rank
agreed on when it was saved.

What diverges replicas in practice: state the script changes in the loop body without
registering it (a scheduler stepped twice on ranks that redid a step, started fresh on a
replacement), rank-dependent code, silent data corruption.

With sharded state (:mod:`unbroken.worker.sharding`) the model and optimizer parts are
compared among the ranks that hold the same shard; a shard held once is compared with nothing.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import torch
import torch.distributed as dist

from unbroken.worker.digest import TensorHashes, hash_threads
from unbroken.worker.trainstate import TrainState


class ReplicasDiverged(BaseException):
    """Data-parallel replicas hold different training state (see the module doc)."""

    def __init__(self, message: str, *, ranks: tuple[int, ...], parts: tuple[str, ...]) -> None:
        super().__init__(message)
        self.ranks = ranks
        self.parts = parts


def _to_tensor(parts: dict[str, bytes]) -> torch.Tensor:
    data = bytearray(b"".join(parts.values()))
    return torch.frombuffer(data, dtype=torch.int64)


def _gather_default(tensor: torch.Tensor) -> list[torch.Tensor]:
    gathered = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, tensor)
    return gathered


def check(
    state: TrainState,
    committed: int,
    gather: Callable[[torch.Tensor], list[torch.Tensor]] = _gather_default,
) -> None:
    """Compare every rank's digests (collective: ``gather`` all-gathers a tensor, by default
    over the default group); raises :class:`ReplicasDiverged` when they differ, and what the
    collective raises when it fails."""
    with TensorHashes(hash_threads()) as hashes:
        hashes.submit(state.tensors())  # on this rank's share of the host's CPUs
        parts = state.digests(committed, hashes)
    mine = _to_tensor(parts)
    gathered = gather(mine)
    names = list(parts)
    width = len(mine) // len(names)
    per_rank = [
        {name: g[i * width : (i + 1) * width].numpy().tobytes() for i, name in enumerate(names)}
        for g in gathered
    ]
    sharding = state.sharding
    differ: set[int] = set()
    what: list[str] = []
    references: set[int] = set()
    for name in names:
        # A sharded part is compared among the ranks that hold the same shard only.
        classes: dict[int, list[int]] = {}
        for rank in range(len(per_rank)):
            key = sharding.shard_of[rank] if name in sharding.sharded_parts else 0
            classes.setdefault(key, []).append(rank)
        for ranks in classes.values():
            # The majority's value is the reference; with a tie, the lowest rank's.
            counts = Counter(per_rank[r][name] for r in ranks)
            best = max(counts.values())
            ref_rank = next(r for r in ranks if counts[per_rank[r][name]] == best)
            bad = [r for r in ranks if per_rank[r][name] != per_rank[ref_rank][name]]
            if bad:
                differ.update(bad)
                references.add(ref_rank)
                if name not in what:
                    what.append(name)
    if not differ:
        return
    ranks_ = tuple(sorted(differ))
    raise ReplicasDiverged(
        f"replicas diverged at step {committed}: rank(s) {', '.join(map(str, ranks_))} differ "
        f"from rank{'s' if len(references) > 1 else ''} "
        f"{', '.join(map(str, sorted(references)))} in {', '.join(what)}; "
        "resuming from the newest checkpoint "
        "(state changed in the loop body must be registered: unbroken.worker.init(state=...))",
        ranks=ranks_,
        parts=tuple(what),
    )
