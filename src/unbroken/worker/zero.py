"""A replica of another rank's ZeRO-1 optimizer partition, kept without communication.

``torch.distributed.optim.ZeroRedundancyOptimizer`` over DDP partitions the optimizer state
over the ``n`` ranks of its group, each partition held once: a lost rank takes its partition
with it. :class:`ReplicaOptimizer` keeps on rank ``r`` the state of partition
``(r - s) mod n`` (its *partner*'s) as well, so every partition is held twice (owner ``p``
and replica holder ``(p + s) mod n``). The stride ``s`` is the ranks per node when the job
spans nodes (:func:`replica_stride`: ranks ``r`` and ``r + s`` are on different nodes, so a
lost node leaves a holder of each of its partitions), else 1.

No collective is needed for it. After DDP's all-reduce every rank holds the full averaged
gradients, and before ZeRO's update every rank holds the same parameters, so a second
optimizer of the same class and hyperparameters over copies of the partner's parameters,
given their gradients and stepped on the same step, computes what the partner's own optimizer
computes: its state is bitwise the partner's (:func:`verify` checks it by digest), and its
parameter copies are bitwise what the partner broadcasts.

Cost with fp32 Adam: the partner's two moments (8 bytes) and a copy of its parameters (4
bytes) for each parameter of the partition, ``12/d`` bytes per model parameter per rank (``d``
the group's size) over ZeRO-1's ``8 + 8/d``; the gradients are shared, not copied.
MindSpeed's replica optimizer costs ``4 + 32/d`` bytes per parameter against ``4 + 16/d``
for its distributed optimizer (``16/d`` more: its fp32 master weights and moments, twice).

Repair (:func:`repair_partitions`): a rank that lost its state takes its own partition's state
from the replica on rank ``r + s`` and its replica of partition ``r - s`` from rank ``r - s``'s
own optimizer, point to point, described in JSON and tensors (nothing is pickled). A partition
whose owner and replica holder are both lost has no copy left: :class:`ZeroReplicaError`.

Completion (:func:`complete_update`): ranks lost while ZeRO broadcasts the updated partitions
leave the survivors with their own partition and their replica updated (the replica steps
right after ZeRO's update) but other partitions' parameters not all received. Every partition
then has an updated copy on a survivor as long as one of its holders took the update: its
owner's parameters, or its replica holder's copies, go to every rank, and the lost ranks'
optimizer state is repaired as above.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist

from unbroken.checkpoint.optimizer import is_zero
from unbroken.worker.digest import update_digest
from unbroken.worker.statecodec import decode, encode

FORMAT = 1


class ZeroReplicaError(RuntimeError):
    """A ZeRO partition could not be restored from its replica, or a replica differs."""


def replica_stride(size: int, local_world_size: int) -> int:
    """How far a rank's replica holder is: the ranks per node when the group spans nodes
    (each pod one node, its ranks consecutive), so that no node holds both copies of a
    partition; 1 on one node."""
    if 1 <= local_world_size < size:
        return local_world_size
    return 1


def partner_of(rank: int, size: int, stride: int = 1) -> int:
    """The rank whose partition ``rank`` keeps a replica of."""
    return (rank - stride) % size


def holders_of(partition: int, size: int, stride: int = 1) -> tuple[int, int]:
    """The ranks that hold ``partition``: its owner and its replica holder."""
    return partition, (partition + stride) % size


class ReplicaOptimizer:
    """Rank ``r``'s replica of partition ``(r - stride) mod n`` of ``zero`` (see the module doc).
    Installing it wraps ``zero.step``: the parameter copies take the partner's parameters
    before ZeRO's update, and the replica steps after it on the same gradients."""

    def __init__(self, zero: torch.optim.Optimizer, stride: int = 1) -> None:
        if not is_zero(zero):
            raise TypeError(f"a replica optimizer needs a ZeroRedundancyOptimizer, not {zero!r}")
        if zero._overlap_with_ddp or zero.parameters_as_bucket_view:
            raise ValueError(
                "a replica optimizer needs ZeroRedundancyOptimizer(overlap_with_ddp=False, "
                "parameters_as_bucket_view=False)"
            )
        self.zero = zero
        internals: Any = zero  # its partition and optimizer constructor (not in its stubs)
        self.size: int = zero.world_size
        self.stride = stride
        self.partner = partner_of(zero.rank, self.size, stride)
        partition: list[dict[str, Any]] = internals._partition_parameters()[self.partner]
        self._sources: list[torch.Tensor] = []
        self._copies: list[torch.Tensor] = []
        groups = []
        for group in partition:
            copies = []
            for param in group["params"]:
                copy_ = param.detach().clone().requires_grad_(param.requires_grad)
                self._sources.append(param)
                self._copies.append(copy_)
                copies.append(copy_)
            groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": copies})
        self.optim: torch.optim.Optimizer = internals._optim_constructor(
            groups, **internals._optim_defaults
        )
        self._installed = False

    @property
    def numel(self) -> int:
        """Parameters of the partner's partition."""
        return sum(p.numel() for p in self._sources)

    def extra_bytes(self) -> int:
        """Bytes this replica holds: the parameter copies and the replica's optimizer state."""
        tensors = list(self._copies) + [
            v for values in self.optim.state.values() for v in values.values()
        ]
        return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))

    def install(self) -> ReplicaOptimizer:
        """Wrap ``zero.step`` so that the replica steps with it (once)."""
        if self._installed:
            return self
        original = self.zero.step

        @functools.wraps(original)
        def step(*args: Any, **kwargs: Any) -> Any:
            self._take_params()
            result = original(*args, **kwargs)
            self._step()
            return result

        self.zero.step = step  # type: ignore[method-assign]
        self._installed = True
        return self

    def _take_params(self) -> None:
        with torch.no_grad():
            for copy_, source in zip(self._copies, self._sources, strict=True):
                copy_.copy_(source)

    def _step(self) -> None:
        # The ZeRO-level hyperparameters (a scheduler sets them there) for each group, as
        # ZeroRedundancyOptimizer._sync_param_groups gives its own local optimizer.
        for src, dst in zip(self.zero.param_groups, self.optim.param_groups, strict=True):
            for key, value in src.items():
                if key != "params":
                    dst[key] = value
        for copy_, source in zip(self._copies, self._sources, strict=True):
            copy_.grad = source.grad  # shared: ZeRO's update does not touch this partition's
        try:
            self.optim.step()
        finally:
            for copy_ in self._copies:
                copy_.grad = None

    def params_match(self) -> bool:
        """Whether the parameter copies equal the partner's parameters (as broadcast)."""
        return all(torch.equal(c, s) for c, s in zip(self._copies, self._sources, strict=True))


def state_digest(optimizer: torch.optim.Optimizer) -> bytes:
    """sha256 of an optimizer's per-parameter state (the hyperparameters are the ZeRO
    optimizer's, compared elsewhere)."""
    h = hashlib.sha256()
    update_digest(h, optimizer.state_dict()["state"])
    return h.digest()


def _gather_digests(replica: ReplicaOptimizer, group: Any) -> list[tuple[bytes, bytes]]:
    mine = torch.frombuffer(
        bytearray(state_digest(replica.zero.optim) + state_digest(replica.optim)),
        dtype=torch.uint8,
    )
    out = [torch.empty_like(mine) for _ in range(replica.size)]
    dist.all_gather(out, mine, group=group)
    return [(bytes(t[:32].tolist()), bytes(t[32:].tolist())) for t in out]


def mismatches(digests: list[tuple[bytes, bytes]], stride: int = 1) -> list[int]:
    """The ranks whose replica's digest differs from its partner's own partition's;
    ``digests[r]`` is rank ``r``'s (own partition, replica) pair."""
    size = len(digests)
    return [r for r in range(size) if digests[r][1] != digests[partner_of(r, size, stride)][0]]


def verify(replica: ReplicaOptimizer, group: Any = None) -> None:
    """Check on every rank of ``group`` (collective) that each replica is bitwise its
    partner's partition; :class:`ZeroReplicaError` names the ranks that differ."""
    differ = mismatches(_gather_digests(replica, group), replica.stride)
    if differ:
        names = [f"{partner_of(r, replica.size, replica.stride)} on rank {r}" for r in differ]
        raise ZeroReplicaError(
            f"the replica of partition {', '.join(names)} differs from the partition's own state"
        )


def plan_transfers(lost: Iterable[int], size: int, stride: int = 1) -> list[tuple[int, int, str]]:
    """The transfers that restore the ranks in ``lost``: ``(sender, receiver, what)``, what
    being ``"own"`` (the receiver's own partition, from the replica on the next rank) or
    ``"replica"`` (the receiver's replica, from the partner's own partition), in an order every
    rank computes alike. Raises :class:`ZeroReplicaError` when a partition lost both holders."""
    gone = set(lost)
    if size < 2:
        raise ZeroReplicaError(f"a ZeRO group of {size} rank keeps no replica of its partition")
    bad = sorted(r for r in gone if not 0 <= r < size)
    if bad:
        raise ZeroReplicaError(f"rank(s) {bad} are not in a ZeRO group of {size}")
    transfers = []
    for rank in sorted(gone):
        after, before = (rank + stride) % size, partner_of(rank, size, stride)
        if after in gone:
            raise ZeroReplicaError(
                f"partition {rank} is lost with both its holders (ranks {rank} and {after})"
            )
        transfers.append((after, rank, "own"))
        if before in gone:
            raise ZeroReplicaError(
                f"partition {before} is lost with both its holders (ranks {before} and {rank})"
            )
        transfers.append((before, rank, "replica"))
    return transfers


def plan_completion(
    updated: Iterable[int], size: int, stride: int = 1
) -> list[tuple[int, int, str]]:
    """Who sends each partition's updated parameters when an update stopped at its broadcast:
    ``(partition, sender, what)`` for every partition in order, ``what`` being ``"own"`` (the
    owner's parameters) or ``"replica"`` (the replica holder's copies). ``updated`` are the
    ranks whose own partition and replica both took the step. Raises
    :class:`ZeroReplicaError` when a partition has no updated holder."""
    done = set(updated)
    plan = []
    for partition in range(size):
        owner, holder = holders_of(partition, size, stride)
        if owner in done:
            plan.append((partition, owner, "own"))
        elif holder in done:
            plan.append((partition, holder, "replica"))
        else:
            raise ZeroReplicaError(
                f"the update of partition {partition} is held by no rank (its holders, ranks "
                f"{owner} and {holder}, did not take it)"
            )
    return plan


def complete_update(replica: ReplicaOptimizer, updated: Iterable[int]) -> int:
    """Finish an update whose broadcast of the updated partitions failed (collective over the
    ZeRO optimizer's group, every rank with the same ``updated``; see :func:`plan_completion`):
    each partition's updated parameters go from a holder that computed them to every rank, the
    replica holder's copies standing in for a lost owner. Returns how many partitions this rank
    sent. The optimizer states are the holders' own and are repaired as after a loss
    (:func:`repair_partitions`)."""
    zero: Any = replica.zero
    partitions = zero._partition_parameters()
    me = zero.rank
    group = zero.process_group
    sent = 0
    with torch.no_grad():
        for partition, sender, what in plan_completion(updated, replica.size, replica.stride):
            params = [param for group_ in partitions[partition] for param in group_["params"]]
            if me == sender and what == "replica":
                if replica.partner != partition:
                    raise ZeroReplicaError(
                        f"rank {me} keeps a replica of partition {replica.partner}, not {partition}"
                    )
                for param, copy_ in zip(params, replica._copies, strict=True):
                    param.copy_(copy_)
            for param in params:
                dist.broadcast(param.data, src=_global(group, sender), group=group)
            sent += int(me == sender)
    replica._take_params()  # the copies are the partner's updated parameters again
    return sent


def repair_partitions(replica: ReplicaOptimizer, lost: Iterable[int], group: Any = None) -> int:
    """Restore the ZeRO partitions and replicas of the ranks in ``lost`` (collective over the
    ZeRO optimizer's group, every rank with the same ``lost``), then :func:`verify`. Returns
    how many transfers this rank took part in."""
    me = replica.zero.rank
    done = 0
    for sender, receiver, what in plan_transfers(lost, replica.size, replica.stride):
        if me == sender:
            source = replica.optim if what == "own" else replica.zero.optim
            _send(source, _global(group, receiver), group)
            done += 1
        elif me == receiver:
            target = replica.zero.optim if what == "own" else replica.optim
            _receive(target, _global(group, sender), group)
            done += 1
    verify(replica, group)
    return done


def fill_replicas(replica: ReplicaOptimizer, group: Any = None) -> None:
    """Give every rank's replica its partner's partition state (collective), as after a
    checkpoint restored the partitions (a checkpoint holds each partition once), then
    :func:`verify`. Rank ``p`` sends to ``p + stride`` in turn, one transfer at a time."""
    me = replica.zero.rank
    for sender in range(replica.size):
        receiver = (sender + replica.stride) % replica.size
        if me == sender:
            _send(replica.zero.optim, _global(group, receiver), group)
        elif me == receiver:
            _receive(replica.optim, _global(group, sender), group)
    verify(replica, group)


def _global(group: Any, rank: int) -> int:
    return rank if group is None else dist.get_global_rank(group, rank)


def _send(optimizer: torch.optim.Optimizer, dst: int, group: Any) -> None:
    tensors: list[torch.Tensor] = []
    sd = encode(optimizer.state_dict(), tensors, "optimizer partition")
    tensors = [t.contiguous() for t in tensors]
    description = {
        "format": FORMAT,
        "state": sd,
        "tensors": [{"dtype": str(t.dtype), "shape": list(t.shape)} for t in tensors],
    }
    payload = torch.frombuffer(bytearray(json.dumps(description).encode()), dtype=torch.uint8)
    dist.send(torch.tensor([FORMAT, payload.numel()], dtype=torch.int64), dst, group=group)
    dist.send(payload, dst, group=group)
    for tensor in tensors:
        dist.send(tensor, dst, group=group)


def _receive(optimizer: torch.optim.Optimizer, src: int, group: Any) -> None:
    header = torch.empty(2, dtype=torch.int64)
    dist.recv(header, src, group=group)
    if int(header[0]) != FORMAT:
        raise ZeroReplicaError(
            f"rank {src} sends partition format {int(header[0])}, this rank reads {FORMAT}"
        )
    payload = torch.empty(int(header[1]), dtype=torch.uint8)
    dist.recv(payload, src, group=group)
    description = json.loads(payload.numpy().tobytes().decode())
    tensors = []
    for spec in description["tensors"]:
        dtype = getattr(torch, str(spec["dtype"]).removeprefix("torch."), None)
        if not isinstance(dtype, torch.dtype):
            raise ZeroReplicaError(f"rank {src} sends unknown dtype {spec['dtype']!r}")
        tensor = torch.empty(spec["shape"], dtype=dtype)
        dist.recv(tensor, src, group=group)
        tensors.append(tensor)
    state = decode(description["state"], tensors)
    sent = [len(g["params"]) for g in state["param_groups"]]
    own = [len(g["params"]) for g in optimizer.param_groups]
    if sent != own:
        raise ZeroReplicaError(
            f"rank {src} sends a partition of parameter groups of sizes {sent}, this rank's "
            f"is {own}"
        )
    optimizer.load_state_dict(state)
