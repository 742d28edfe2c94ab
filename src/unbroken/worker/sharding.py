"""Which ranks hold which part of the training state: replicas, shards and replicas of shards.

A data-parallel (DDP) job holds the whole model and optimizer on every rank: any rank is a
replica of any other. Sharded jobs split the state:

- ``torch.distributed.optim.ZeroRedundancyOptimizer`` (ZeRO-1) over DDP: the model is
  replicated, the optimizer state is partitioned over the ranks of the optimizer's process
  group. A job whose ZeRO group is the whole world holds each partition once.
- FSDP2 (``fully_shard``) on a 1-D mesh: parameters, gradients and optimizer state are
  ``DTensor`` shards (``Shard(0)``), one per rank of the mesh, each held once.
- HSDP: ``fully_shard`` on a 2-D mesh whose first dimension replicates (``Replicate()``) and
  whose second shards: the ranks of one replica group split the state, and the rank at the
  same shard position of every other group holds the same shard.

:class:`Sharding` records, for every rank of the job, the index of the shard it holds
(``shard_of``): ranks with the same index hold the same shard, bit for bit, and are each
other's replicas for the sharded parts of the state. It is computed locally from the mesh or
the optimizer's group, without a collective, so a replacement process computes what the ranks
that survived computed. The agreement check (:mod:`unbroken.worker.agreement`) compares the
sharded parts among replicas of the same shard only; in-process repair
(:mod:`unbroken.worker.replica`) takes a lost shard from a replica of it, and a shard held
once has none (:attr:`Sharding.unreplicated`): its state comes from the newest checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor

from unbroken.checkpoint.optimizer import is_zero

if TYPE_CHECKING:
    from torch.distributed.optim import ZeroRedundancyOptimizer


class Layout(StrEnum):
    REPLICATED = "replicated"  # DDP, or one process
    ZERO = "zero"  # ZeroRedundancyOptimizer over replicated parameters
    FSDP = "fsdp"  # fully_shard on a 1-D mesh (or any mesh without a replicating dimension)
    HSDP = "hsdp"  # fully_shard on a (replicate, shard) mesh


@dataclass(frozen=True)
class Sharding:
    """How the state of a job of ``len(shard_of)`` ranks is split (see the module doc)."""

    layout: Layout
    shard_of: tuple[int, ...]  # rank -> index of the shard it holds
    sharded_parts: frozenset[str]  # parts of TrainState.digests that are per shard
    #: ZeRO with a replica optimizer (:mod:`unbroken.worker.zero`): rank ``r + 1`` also holds
    #: rank ``r``'s optimizer partition, so every partition is held twice.
    partner_replicas: bool = False

    @property
    def world_size(self) -> int:
        return len(self.shard_of)

    @property
    def shards(self) -> int:
        return len(set(self.shard_of))

    def holders(self, rank: int) -> tuple[int, ...]:
        """Every rank that holds ``rank``'s shard (``rank`` included)."""
        mine = self.shard_of[rank]
        return tuple(r for r, s in enumerate(self.shard_of) if s == mine)

    @property
    def unreplicated(self) -> bool:
        """Whether some shard is held by one rank only (a lost rank's shard has no replica)."""
        if self.partner_replicas and self.world_size > 1:
            return False
        return bool(self.sharded_parts) and any(
            len(self.holders(r)) < 2 for r in range(self.world_size)
        )

    @property
    def copies(self) -> int:
        """How many ranks hold each shard."""
        return self.world_size // self.shards

    def bytes_per_param(self, *, copies: int | None = None, dtype_bytes: int = 4) -> float:
        """Bytes of training state a rank holds per model parameter, with Adam (parameter,
        gradient and two moments, ``dtype_bytes`` each), in this layout or, with ``copies``,
        in the same layout with that many copies of each shard over the same ranks. ZeRO
        shards the two moments; FSDP2 and HSDP shard all four; DDP shards nothing."""
        copies = self.copies if copies is None else copies
        shards = self.world_size / copies
        if self.layout is Layout.ZERO:
            return 2 * dtype_bytes + 2 * dtype_bytes / shards
        if self.sharded_parts:
            return 4 * dtype_bytes / shards
        return 4.0 * dtype_bytes

    @property
    def replica_bytes_per_param(self) -> float:
        """What keeping ``copies`` of each shard costs a rank per parameter, over one copy."""
        if not self.sharded_parts:
            return 0.0
        return self.bytes_per_param() - self.bytes_per_param(copies=1)

    def describe(self) -> str:
        if not self.sharded_parts:
            return f"{self.layout}: every rank holds the whole state"
        copies = self.copies
        if self.partner_replicas and self.world_size > 1:
            return (
                f"{self.layout}: optimizer in {self.shards} partition(s), each also held by "
                "the next rank (replica optimizer)"
            )
        text = (
            f"{self.layout}: {', '.join(sorted(self.sharded_parts))} in {self.shards} shard(s), "
            f"{copies} cop{'y' if copies == 1 else 'ies'} of each"
        )
        if copies > 1:
            text += (
                f" ({self.bytes_per_param():g} bytes of fp32 Adam state per parameter per rank, "
                f"{self.replica_bytes_per_param:g} more than one copy)"
            )
        return text


class ShardingError(ValueError):
    """A layout that the session cannot describe (see the message)."""


def _mesh_sharding(param: DTensor, world: int) -> tuple[Layout, tuple[int, ...]]:
    mesh = param.device_mesh
    ranks = mesh.mesh  # the rank at every mesh coordinate
    if ranks.numel() != world:
        raise ShardingError(
            f"parameter mesh of {ranks.numel()} ranks in a job of {world}: the session "
            "supports meshes over every rank of the job"
        )
    shard_dims = [d for d, p in enumerate(param.placements) if p.is_shard()]
    replicate_dims = [d for d, p in enumerate(param.placements) if p.is_replicate()]
    shard_of = [0] * world
    for coords in torch.cartesian_prod(*(torch.arange(n) for n in ranks.shape)).reshape(
        -1, ranks.dim()
    ):
        index = 0
        for d in shard_dims:
            index = index * ranks.shape[d] + int(coords[d])
        shard_of[int(ranks[tuple(int(c) for c in coords)])] = index
    layout = Layout.HSDP if replicate_dims and shard_dims else Layout.FSDP
    return layout, tuple(shard_of)


def _zero_sharding(optimizer: ZeroRedundancyOptimizer, world: int) -> tuple[int, ...]:
    group = optimizer.process_group
    members = dist.get_process_group_ranks(group)
    size = len(members)
    if world % size or members != list(range(members[0], members[0] + size)):
        raise ShardingError(
            f"ZeroRedundancyOptimizer over ranks {members} of {world}: the session supports "
            "a process group of the whole world or of consecutive blocks of equal size"
        )
    return tuple(r % size for r in range(world))


def sharding_of(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    world_size: int,
    *,
    partner_replicas: bool = False,
) -> Sharding:
    """The layout of ``model`` and ``optimizer`` in a job of ``world_size`` ranks
    (``partner_replicas``: a ZeRO optimizer keeps a replica optimizer)."""
    if is_zero(optimizer):
        return Sharding(
            Layout.ZERO,
            _zero_sharding(optimizer, world_size),
            frozenset({"optimizer"}),
            partner_replicas,
        )
    for param in model.parameters():
        if isinstance(param, DTensor):
            layout, shard_of = _mesh_sharding(param, world_size)
            return Sharding(layout, shard_of, frozenset({"model", "optimizer"}))
    return Sharding(Layout.REPLICATED, (0,) * world_size, frozenset())


def in_process_refusal(sharding: Sharding) -> str | None:
    """Why the in-process rungs (``retry``, ``recover-in-place``, ``recover``, ``dump``)
    cannot restore this layout's state exactly (None: they can).

    A shard held by one rank is lost with that rank: no healthy process holds it, so the rung
    that could restore it is the restart from the newest checkpoint, with every rank. HSDP
    with two or more replica groups recovers in process: its collectives fail a step instead
    of the process (:mod:`unbroken.worker.shardsync`), every rank moves its model onto the new
    generation's mesh (:func:`rebind`) and a lost rank's shards come from the rank at the same
    position of another replica group (:func:`unbroken.worker.replica.repair`). ZeRO with a
    replica optimizer (:mod:`unbroken.worker.zero`) recovers in process: the regroup gives the
    ZeRO optimizer the new group, and a lost partition comes from its replica. A ZeRO
    optimizer over replicated blocks without one keeps its old group. Last words
    (``dump``) need the whole state on one rank: a sharded rank refuses them, and the rung
    after it applies."""
    if not sharding.sharded_parts:
        return None
    if sharding.unreplicated:
        return (
            f"{sharding.describe()}: a lost rank's shard has no replica on another rank, so "
            "only the newest checkpoint can restore it; the job restarts from it"
        )
    if sharding.layout is Layout.HSDP:
        return None
    if sharding.layout is Layout.ZERO and sharding.partner_replicas:
        return None
    return (
        f"{sharding.describe()}: a lost shard's replica is on another rank, but in-process "
        "recovery does not regroup a ZeroRedundancyOptimizer; the job restarts from the "
        "newest checkpoint"
    )


def rebind(model: torch.nn.Module, mesh: DeviceMesh) -> int:
    """Point ``model``'s FSDP2/HSDP modules at the process groups of ``mesh`` (a mesh of the
    same shape and ranks, built over the current default group, e.g. of a new generation), in
    place: the device mesh object their parameters, ``DTensor`` shards and optimizer state
    refer to takes ``mesh``'s groups, and every FSDP parameter group reads its all-gather,
    reduce-scatter and all-reduce groups from it again. Returns how many meshes were rebound.

    The mesh object is kept (not replaced) because every ``DTensor`` of the model and of the
    optimizer's state holds it in its spec; only the groups behind its dimensions change."""
    from torch.distributed.fsdp import FSDPModule

    rebound: dict[int, DeviceMesh] = {}
    for module in model.modules():
        if not isinstance(module, FSDPModule):
            continue
        group = module._get_fsdp_state()._fsdp_param_group
        if group is None:
            continue
        for info in (group.mesh_info, group.post_forward_mesh_info):
            if info is None:
                continue
            old = info.mesh
            if old.mesh.tolist() != mesh.mesh.tolist():
                raise ShardingError(
                    f"cannot rebind a mesh of ranks {old.mesh.tolist()} to one of "
                    f"{mesh.mesh.tolist()}"
                )
            if id(old) not in rebound:
                old._dim_group_names = list(mesh._dim_group_names)
                old._pg_registry = dict(getattr(mesh, "_pg_registry", {}))
                rebound[id(old)] = old
            info.__post_init__()  # type: ignore[no-untyped-call]  # re-reads the groups
    return len(rebound)
