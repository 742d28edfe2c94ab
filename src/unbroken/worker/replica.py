"""Repair a rank's training state from a healthy replica, then check that every rank agrees.

The protocol runs over a freshly built process group, on every rank of it:

1. **Compare.** Each rank all-gathers ``(committed steps, flags)``. The chosen source must
   have committed exactly the step the job resumes at and must not be suspect (an optimizer
   update that failed midway, a corrupted memory) nor a replacement process. The receivers are
   the ranks behind the source, the replacements and the suspect ranks. No rank hashes its
   state yet: that would put a pass over every byte on the critical path.
   A rank whose ZeRO update ran but whose broadcast of the updated partitions failed says so
   (``half``); the update is then completed from the ranks that took it before anything else
   (:func:`unbroken.worker.zero.complete_update`), and such a rank counts as any other.
2. **Transfer.** The source and the receivers form a process group of their own; the other
   ranks take no part and hash their state meanwhile, on background threads
   (:class:`unbroken.worker.digest.TensorHashes`). The source broadcasts a description (JSON,
   UTF-8, as a uint8 tensor after an int64 header with the format version and its length): the
   model's tensor names, dtypes and shapes, the optimizer's per-parameter state and
   hyperparameter groups, the registered objects' state dicts, the data position
   (:mod:`unbroken.worker.statecodec`: tensors by reference, scalars inline) and the committed
   step count, and each tensor's hash (:func:`unbroken.worker.digest.tensor_hash`). A receiver
   hashes what it holds at the same places (its model; on a rank that was alive, its optimizer
   state and registered objects too) and the group all-reduces which tensors
   some receiver lacks: only those travel (a replacement's model, which its DDP constructor
   took from rank 0, and a suspect rank's untouched tensors stay). The source broadcasts them
   in the description's order, all queued at once. Nothing is pickled. Receivers check the
   description against their own model and optimizer before anything is written, receive in
   place what they hold and into new buffers what they do not (their pages faulted in ahead of
   the bytes on a thread of their own), hash each tensor as it arrives, then load the
   optimizer state and the registered objects with
   ``load_state_dict`` (a fresh process has no optimizer state yet: the description says what
   to allocate). A replacement process takes the data position; a rank that was alive rewinds
   its own (:mod:`unbroken.worker.data`).
3. **Verify.** Every rank all-gathers the digest of its whole state
   (:meth:`unbroken.worker.trainstate.TrainState.digest`). A rank that was not a receiver and
   differs from the source (its state diverged with nothing flagging it) takes the source's
   state in a second transfer; then every rank must equal the source, or every rank raises
   :class:`ReplicaError` naming the ranks that differ. A run never continues on a silently
   diverged replica.

Sharded state (:mod:`unbroken.worker.sharding`): each shard is compared among, sent from and
verified against the ranks that hold it, each from its own source (HSDP: the rank at the same
shard position of another replica group). ``DTensor`` parameters and optimizer state travel as
their local shards, received into the parameters' storage, and the optimizer state is made
shards of the parameter's mesh again before it is loaded.

A collective that fails during any of this (the source died mid-transfer, a peer hung past
the group's timeout) raises :class:`ReplicaError`; a receiver may then hold partial state, so
the caller must not train on.
"""

from __future__ import annotations

import ctypes
import json
import logging
import mmap
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from unbroken.worker.digest import TensorHashes, hash_threads
from unbroken.worker.sharding import Layout, Sharding
from unbroken.worker.statecodec import StateCodecError, decode, encode, tensor_paths
from unbroken.worker.trainstate import TrainState
from unbroken.worker.zero import ZeroReplicaError, complete_update, repair_partitions

logger = logging.getLogger(__name__)

FORMAT = 3
_SUSPECT = 1  # flag: an update failed midway or memory was corrupted on this rank
_FRESH = 2  # flag: a replacement process that has no training state of its own
#: flag: ZeRO's update of the last step ran on this rank (its partition and replica) but the
#: broadcast of the updated partitions failed: the other partitions' parameters are not all in
_HALF = 4
_UNKNOWN = bytes(32)  # a digest not taken (before the transfer no rank hashes its state)


class ReplicaError(RuntimeError):
    """The repair could not be done or did not leave every rank with the source's state."""


@dataclass(frozen=True)
class RankState:
    """What a rank says about its state before and after a repair."""

    rank: int
    committed: int
    flags: int
    digest: bytes

    @property
    def suspect(self) -> bool:
        return bool(self.flags & _SUSPECT)

    @property
    def fresh(self) -> bool:
        return bool(self.flags & _FRESH)

    @property
    def half(self) -> bool:
        return bool(self.flags & _HALF)

    def describe(self) -> str:
        notes = [
            n
            for n, on in (
                ("suspect", self.suspect),
                ("replacement", self.fresh),
                ("update not broadcast", self.half),
            )
            if on
        ]
        if self.digest != _UNKNOWN:
            notes.insert(0, f"digest {self.digest.hex()[:12]}")
        return ", ".join([f"rank {self.rank}: {self.committed} steps", *notes])


@dataclass(frozen=True)
class Repaired:
    """The outcome on this rank."""

    step: int  # committed steps after the repair = the step to run next
    received: bool  # this rank took the source's state
    receivers: tuple[int, ...]  # every rank that did
    source: int = -1  # the rank this rank's shard came from or was compared with (-1: none)


def _gather(state: RankState, group: dist.ProcessGroup | None) -> list[RankState]:
    digest = torch.frombuffer(bytearray(state.digest), dtype=torch.int64)
    mine = torch.cat([torch.tensor([state.committed, state.flags], dtype=torch.int64), digest])
    out = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(out, mine, group=group)
    return [
        RankState(
            rank=rank,
            committed=int(t[0]),
            flags=int(t[1]),
            digest=t[2:].numpy().tobytes(),
        )
        for rank, t in enumerate(out)
    ]


def _flags(suspect: bool, fresh: bool, half: bool = False) -> int:
    return (_SUSPECT if suspect else 0) | (_FRESH if fresh else 0) | (_HALF if half else 0)


def _shard_source(states: list[RankState], holders: tuple[int, ...], source: int, step: int) -> int:
    """The rank that sends the shard ``holders`` hold: ``source`` when it holds it, otherwise
    the first holder that committed ``step`` steps and is neither suspect nor a replacement
    (the command's ``source`` first, else ``holders[0]``, so the caller's error names it)."""
    if source in holders:
        return source
    for rank in holders:
        s = states[rank]
        if not s.fresh and not s.suspect and s.committed == step:
            return rank
    return holders[0]


def _check_source(states: list[RankState], src: RankState, step: int) -> None:
    if src.fresh or src.suspect or src.committed != step:
        why = (
            "is a replacement process without training state"
            if src.fresh
            else "has suspect state (an optimizer update failed midway, or its memory was "
            "corrupted)"
            if src.suspect
            else f"has committed {src.committed} steps"
        )
        raise ReplicaError(
            f"rank {src.rank} cannot be the replica source for resuming at step {step}: it "
            f"{why}; ranks report: " + "; ".join(s.describe() for s in states)
        )


def plan_repair(
    states: list[RankState], sharding: Sharding, *, source: int, step: int
) -> dict[tuple[int, ...], tuple[int, tuple[int, ...]]]:
    """For each shard (the tuple of ranks that hold it): the rank that sends it and the ranks
    that receive it (those whose step differs from the sender's, replacements, suspect ranks,
    and ranks whose digest differs where both digests were taken). Raises
    :class:`ReplicaError` when a shard has no holder that can send it."""
    if sharding.world_size != len(states):
        raise ReplicaError(
            f"the session's layout is of {sharding.world_size} ranks, the group has {len(states)}"
        )
    plan = {}
    for holders in sorted({sharding.holders(r) for r in range(len(states))}):
        src = states[_shard_source(states, holders, source, step)]
        _check_source(states, src, step)
        plan[holders] = (
            src.rank,
            tuple(
                r
                for r in holders
                if r != src.rank
                and (
                    states[r].committed != src.committed
                    or states[r].suspect
                    or states[r].fresh
                    or (
                        _UNKNOWN not in (states[r].digest, src.digest)
                        and states[r].digest != src.digest
                    )
                )
            ),
        )
    return plan


def repair(
    state: TrainState,
    committed: int,
    *,
    source: int,
    step: int,
    suspect: bool = False,
    fresh: bool = False,
    half: bool = False,
    timeout_s: float = 30.0,
) -> Repaired:
    """Run the protocol above on the default process group (collective); see the module doc.

    With sharded state (:mod:`unbroken.worker.sharding`) each shard is repaired from a rank
    that holds it: ``source`` for its own shard, the first healthy holder for every other
    (HSDP: the rank at the same shard position of another replica group). A shard whose every
    holder is a replacement or suspect has no replica to come from: :class:`ReplicaError`."""
    me = RankState(dist.get_rank(), committed, _flags(suspect, fresh, half), _UNKNOWN)
    states = _gather(me, None)
    if any(s.half for s in states):
        states = _complete_update(state, states, step)
    sharding = state.sharding
    if sharding.layout is Layout.REPLICATED or sharding.partner_replicas:
        # Every rank holds the whole state at any group size (an elastic job's group shrinks
        # and grows under a session made at full size). ZeRO with a replica optimizer: the
        # rest of the state is replicated, the partitions are repaired after it.
        sharding = Sharding(Layout.REPLICATED, (0,) * len(states), frozenset())
    plan = plan_repair(states, sharding, source=source, step=step)
    sources = {holders: src_rank for holders, (src_rank, _) in plan.items()}
    mine = sharding.holders(me.rank)
    receivers = _receivers(plan)
    if receivers:
        logger.warning(
            "repairing rank(s) %s from rank %s at step %d (%s)",
            ", ".join(map(str, receivers)),
            ", ".join(str(sources[h]) for h in sorted(plan) if plan[h][1]),
            step,
            "; ".join(s.describe() for s in states if s.rank in receivers),
        )
    hashes = TensorHashes(hash_threads())
    began = time.perf_counter()
    try:
        if me.rank not in receivers:
            # This rank's state is final: hash it while the receivers' state travels.
            hashes.submit(state.tensors())
        committed, moved = _transfer(
            state, committed, plan[mine], me.rank, hashes, fresh, timeout_s
        )
        moved_at = time.perf_counter()
        digest = state.digest(committed, hashes)
    finally:
        hashes.close()
    after = _gather(RankState(me.rank, committed, 0, digest), None)
    if me.rank in receivers:
        logger.info(
            "rank %d took %.1f MB of step %d from rank %d: transfer %.3f s (%.0f MB/s) after "
            "%.3f s of group setup, checked %.3f s later",
            me.rank,
            moved.nbytes / 1e6,
            committed,
            sources[mine],
            moved.data_s,
            moved.nbytes / 1e6 / max(moved.data_s, 1e-9),
            moved_at - began - moved.data_s,
            time.perf_counter() - moved_at,
        )
    differ = _differing(after, sources, sharding)
    if differ and not set(differ) & set(receivers):
        # Ranks that were neither behind nor replacements nor suspect, whose state was not the
        # source's all the same: they take it now, as the receivers did.
        logger.warning(
            "rank(s) %s held state other than the replica source's at step %d: repairing them "
            "too (%s)",
            ", ".join(map(str, differ)),
            step,
            "; ".join(after[r].describe() for r in differ),
        )
        again = {h: (src, tuple(r for r in h if r in differ)) for h, (src, _) in plan.items()}
        if me.rank in differ or me.rank == again[mine][0]:
            with TensorHashes(hash_threads()) as fresh_hashes:
                committed, _ = _transfer(
                    state, committed, again[mine], me.rank, fresh_hashes, False, timeout_s
                )
                if me.rank in differ:
                    digest = state.digest(committed, fresh_hashes)
        after = _gather(RankState(me.rank, committed, 0, digest), None)
        receivers = tuple(sorted({*receivers, *differ}))
        differ = _differing(after, sources, sharding)
    if differ:
        named = ", ".join(str(sources[sharding.holders(r)]) for r in differ)
        raise ReplicaError(
            f"ranks {', '.join(map(str, differ))} differ from the replica source "
            f"rank(s) {named} after the repair: " + "; ".join(s.describe() for s in after)
        )
    if state.zero_replica is not None and receivers:
        try:
            repair_partitions(state.zero_replica, receivers)
        except ZeroReplicaError as e:
            raise ReplicaError(str(e)) from e
    return Repaired(
        step=committed, received=me.rank in receivers, receivers=receivers, source=sources[mine]
    )


def _complete_update(state: TrainState, states: list[RankState], step: int) -> list[RankState]:
    """ZeRO's update of the step before ``step`` ran on some ranks and its broadcast failed
    (``half``): finish it from the ranks that committed ``step`` steps, each partition from its
    owner or its replica holder (:func:`unbroken.worker.zero.complete_update`, collective).
    Their parameters are then whole and the protocol goes on as for any rank at ``step``."""
    if state.zero_replica is None:
        raise ReplicaError(
            "a rank reports an update that was not broadcast, but this rank keeps no ZeRO "
            "replica: ranks report " + "; ".join(s.describe() for s in states)
        )
    updated = [s.rank for s in states if s.committed == step and not (s.fresh or s.suspect)]
    logger.warning(
        "completing the update of step %d from rank(s) %s (%s)",
        step - 1,
        ", ".join(map(str, updated)),
        "; ".join(s.describe() for s in states),
    )
    try:
        complete_update(state.zero_replica, updated)
    except ZeroReplicaError as e:
        raise ReplicaError(str(e)) from e
    return [RankState(s.rank, s.committed, s.flags & ~_HALF, s.digest) for s in states]


def _receivers(plan: Mapping[tuple[int, ...], tuple[int, tuple[int, ...]]]) -> tuple[int, ...]:
    return tuple(sorted(r for _, rs in plan.values() for r in rs))


def _differing(
    after: list[RankState], sources: Mapping[tuple[int, ...], int], sharding: Sharding
) -> list[int]:
    """The ranks whose step or digest differ from their shard's source's."""
    return sorted(
        r
        for holders, src in sources.items()
        for r in holders
        if (after[r].committed, after[r].digest) != (after[src].committed, after[src].digest)
    )


def _transfer(
    state: TrainState,
    committed: int,
    shard: tuple[int, tuple[int, ...]],
    rank: int,
    hashes: TensorHashes,
    fresh: bool,
    timeout_s: float,
) -> tuple[int, Moved]:
    """Send or receive this rank's shard (``(source, receivers)``), when it takes part: the
    committed steps this rank holds afterwards and what it sent or took."""
    source, receivers = shard
    if not receivers or (rank != source and rank not in receivers):
        return committed, Moved(0, 0.0)
    group = dist.new_group(
        ranks=[source, *receivers],
        backend="gloo",
        timeout=timedelta(seconds=timeout_s),
        use_local_synchronization=True,
    )
    try:
        if rank == source:
            return committed, _send(state, committed, source, group, hashes)
        return _receive(state, source, group, fresh=fresh, hashes=hashes)
    finally:
        dist.destroy_process_group(group)


# -- the wire format -------------------------------------------------------------------------


def _dtype(name: str) -> torch.dtype:
    value = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(value, torch.dtype):
        raise ReplicaError(f"replica description names unknown dtype {name!r}")
    return value


def describe(
    state: TrainState, committed: int, *, data: bool = True
) -> tuple[dict[str, Any], list[torch.Tensor]]:
    """The JSON description of this rank's state and the tensors it references, in order
    (``data=False``: without the data position, which only the committed step's is known)."""
    tensors: list[torch.Tensor] = []
    model_entries = []
    for name, tensor in _local_state_dict(state.module).items():
        model_entries.append({"name": name, "tensor": len(tensors)})
        tensors.append(tensor.detach().contiguous())
    try:
        sd = _optimizer_state_dict(state)
        optimizer = {
            "state": [
                {
                    "param": int(index),
                    "values": encode(_locals(values), tensors, "optimizer state"),
                    "dtensor": sorted(k for k, v in values.items() if isinstance(v, DTensor)),
                }
                for index, values in sd["state"].items()
            ],
            "param_groups": [encode(g, tensors, "optimizer group") for g in sd["param_groups"]],
        }
        objects = state.encode_objects(tensors)
        position = (
            encode(state.data.position(committed), tensors, "data position")
            if state.data is not None and data
            else None
        )
    except StateCodecError as e:
        raise ReplicaError(str(e)) from None
    tensors = [t.contiguous() for t in tensors]
    # The device type too: a receiver allocates what it lacks where the source holds it (its own
    # GPU for a GPU's tensor), so each tensor's broadcast runs on one backend on every rank.
    table = [
        {"dtype": str(t.dtype), "shape": list(t.shape), "device": t.device.type} for t in tensors
    ]
    description = {
        "format": FORMAT,
        "committed": committed,
        "model": model_entries,
        "optimizer": optimizer,
        "objects": objects,
        "data": position,
        "tensors": table,
    }
    return description, tensors


def _optimizer_state_dict(state: TrainState) -> dict[str, Any]:
    """The optimizer's state dict; a ZeRO optimizer with a replica optimizer: its
    hyperparameter groups (parameters by index) and no per-parameter state (its partitions
    are repaired from their replicas, :func:`unbroken.worker.zero.repair_partitions`)."""
    if state.zero_replica is None:
        return state.optimizer.state_dict()
    groups, start = [], 0
    for group in state.optimizer.param_groups:
        size = len(group["params"])
        groups.append({**group, "params": list(range(start, start + size))})
        start += size
    return {"state": {}, "param_groups": groups}


def _local_state_dict(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The module's state dict with each ``DTensor`` as this rank's local shard (a view of the
    parameter's storage, so a shard received into it lands in the parameter)."""
    return {
        name: value.to_local() if isinstance(value, DTensor) else value
        for name, value in module.state_dict().items()
    }


def _locals(values: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v.to_local() if isinstance(v, DTensor) else v for k, v in values.items()}


def _as_dtensors(
    values: Mapping[str, Any], keys: list[str], param: torch.Tensor, index: int
) -> dict[str, Any]:
    """The optimizer state of one parameter with the entries the source held as ``DTensor``
    shards (``keys``) made shards of ``param``'s mesh and placements again."""
    if not keys:
        return dict(values)
    if not isinstance(param, DTensor):
        raise ReplicaError(
            f"the replica's optimizer state of parameter {index} is sharded, this rank's "
            "parameter is not"
        )
    out = dict(values)
    for key in keys:
        local = values[key]
        out[key] = DTensor.from_local(
            local,
            param.device_mesh,
            param.placements,
            run_check=False,
            shape=param.shape,
            stride=param.stride(),
        )
    return out


@dataclass(frozen=True)
class Moved:
    """The bytes of tensors a rank sent or took, and the seconds from the header's broadcast
    to the last tensor's."""

    nbytes: int
    data_s: float


def _send(
    state: TrainState,
    committed: int,
    source: int,
    group: dist.ProcessGroup,
    hashes: TensorHashes,
) -> Moved:
    description, tensors = describe(state, committed)
    began = time.perf_counter()
    hashes.submit(tensors)
    description["hashes"] = [hashes(t).hex() for t in tensors]
    payload = torch.frombuffer(bytearray(json.dumps(description).encode()), dtype=torch.uint8)
    header = torch.tensor([FORMAT, payload.numel()], dtype=torch.int64)
    dist.broadcast(header, src=source, group=group)
    dist.broadcast(payload, src=source, group=group)
    need = _needed(torch.zeros(len(tensors), dtype=torch.int32), group)
    moving = [t for t, n in zip(tensors, need, strict=True) if n]
    # Every tensor's broadcast is queued at once: the next one's handshake overlaps this one.
    works = [dist.broadcast(t, src=source, group=group, async_op=True) for t in moving]
    for work in works:
        if work is not None:
            work.wait()
    moved = Moved(sum(t.numel() * t.element_size() for t in moving), time.perf_counter() - began)
    logger.info(
        "sent %d of %d tensors (%.1f MB) of step %d to the repaired ranks; they held the "
        "other %d already",
        len(moving),
        len(tensors),
        moved.nbytes / 1e6,
        committed,
        len(tensors) - len(moving),
    )
    return moved


def _needed(need: torch.Tensor, group: dist.ProcessGroup) -> list[bool]:
    """Which tensors go over the wire: those some receiver does not hold equal to the
    source's (collective over the transfer's group; the source offers zeros)."""
    dist.all_reduce(need, op=dist.ReduceOp.MAX, group=group)
    return [bool(n) for n in need.tolist()]


def _paths(description: Mapping[str, Any]) -> dict[tuple[Any, ...], int]:
    """Each tensor of a description by where it sits (an optimizer state's parameter and key,
    a hyperparameter group's entry, a registered object's entry), the model's and the data
    position's left out."""
    optimizer = description.get("optimizer") or {}
    out: dict[tuple[Any, ...], int] = {}
    for item in optimizer.get("state", []):
        out.update(tensor_paths(item.get("values"), ("optimizer", item.get("param"))))
    out.update(tensor_paths(optimizer.get("param_groups"), ("groups",)))
    out.update(tensor_paths(description.get("objects"), ("objects",)))
    return out


def _check_model(
    own: Mapping[str, torch.Tensor], entries: list[dict[str, Any]], table: list[dict[str, Any]]
) -> None:
    names = [str(e["name"]) for e in entries]
    if sorted(names) != sorted(own):
        missing = sorted(set(own) - set(names))
        extra = sorted(set(names) - set(own))
        raise ReplicaError(
            f"the replica's model does not match this rank's: missing here {extra}, "
            f"missing there {missing}"
        )
    for entry in entries:
        spec = table[int(entry["tensor"])]
        mine = own[str(entry["name"])]
        if str(mine.dtype) != spec["dtype"] or list(mine.shape) != spec["shape"]:
            raise ReplicaError(
                f"model tensor {entry['name']} is {spec['dtype']} {spec['shape']} on the "
                f"replica and {mine.dtype} {list(mine.shape)} on this rank"
            )


def _group_size(encoded: Any) -> int:
    """How many parameters an encoded optimizer parameter group holds."""
    for key, value in encoded["dict"]:
        if key == "params":
            return len(value)
    raise ReplicaError("the replica's optimizer parameter group has no params")


class _FaultIn(threading.Thread):
    """Faults new buffers' pages in, in order, on a thread of its own: a new process's memory
    is zeroed by the kernel page by page as it is first written, and on the receiving thread
    that costs about half of what the wire gives (``bench/model_size.py`` measures both). With
    ``MADV_POPULATE_WRITE`` (Linux 5.14) the pages are made present without their contents
    being written, so a page the transfer reached first is left as it is."""

    def __init__(self, tensors: list[torch.Tensor]) -> None:
        super().__init__(name="unbroken-fault-in", daemon=True)
        self._tensors = tensors
        self._halt = threading.Event()
        if tensors and _populate is not None:
            self.start()

    def run(self) -> None:
        for tensor in self._tensors:
            if self._halt.is_set() or not _populate_write(tensor):
                return

    def join(self, timeout: float | None = None) -> None:
        self._halt.set()
        if self.is_alive():
            super().join(timeout)


_MADV_POPULATE_WRITE = 23
_PAGE = mmap.PAGESIZE


def _madvise() -> Any:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        call = libc.madvise
    except (OSError, AttributeError):  # pragma: no cover - not Linux
        return None
    call.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    call.restype = ctypes.c_int
    return call


_populate = _madvise()


def _populate_write(tensor: torch.Tensor) -> bool:
    """Make the whole pages under ``tensor`` present and writable; False where the kernel
    does not know the call (it is not tried again)."""
    start = -(-tensor.data_ptr() // _PAGE) * _PAGE
    end = (tensor.data_ptr() + tensor.numel() * tensor.element_size()) // _PAGE * _PAGE
    if end <= start or _populate is None:
        return True
    return bool(_populate(start, end - start, _MADV_POPULATE_WRITE) == 0)


def _receive(
    state: TrainState,
    source: int,
    group: dist.ProcessGroup,
    *,
    fresh: bool,
    hashes: TensorHashes,
) -> tuple[int, Moved]:
    """Take the source's state: the committed steps it holds and what was taken."""
    began = time.perf_counter()
    header = torch.empty(2, dtype=torch.int64)
    dist.broadcast(header, src=source, group=group)
    if int(header[0]) != FORMAT:
        raise ReplicaError(
            f"the replica sends state format {int(header[0])}, this rank reads {FORMAT}"
        )
    payload = torch.empty(int(header[1]), dtype=torch.uint8)
    dist.broadcast(payload, src=source, group=group)
    description = json.loads(payload.numpy().tobytes().decode())
    table: list[dict[str, Any]] = description["tensors"]
    own = _local_state_dict(state.module)
    _check_model(own, description["model"], table)
    own_groups = _optimizer_state_dict(state)["param_groups"]
    sent_sizes = [_group_size(g) for g in description["optimizer"]["param_groups"]]
    if [len(g["params"]) for g in own_groups] != sent_sizes:
        raise ReplicaError(
            "the replica's optimizer has parameter groups of sizes "
            f"{sent_sizes}, this rank's "
            f"{[len(g['params']) for g in own_groups]}"
        )
    targets = _targets(state, description, own, fresh)
    # What this rank holds equal to the source's stays: a replacement's model (its DDP
    # constructor broadcast rank 0's), a suspect rank's untouched tensors.
    sent_hashes = description.get("hashes")
    if not isinstance(sent_hashes, list) or len(sent_hashes) != len(table):
        raise ReplicaError("the replica's description has no hash for each tensor")
    hashes.submit(t for t in targets if t is not None)
    held = [
        t is not None and hashes(t).hex() == str(h)
        for t, h in zip(targets, sent_hashes, strict=True)
    ]
    need = _needed(torch.tensor([0 if h else 1 for h in held], dtype=torch.int32), group)
    # Received in place where this rank holds the tensor, else into new buffers.
    tensors = [
        target
        if target is not None
        else torch.empty(spec["shape"], dtype=_dtype(str(spec["dtype"])), device=_device(spec))
        for target, spec in zip(targets, table, strict=True)
    ]
    moving = [t for t, n in zip(tensors, need, strict=True) if n]
    hashes.forget(moving)  # a collective's writes bypass the version counter
    # Queued at once, waited in order; each tensor is hashed (for the check after the repair)
    # while the next ones arrive, and the new buffers' pages are faulted in ahead of them.
    fault_in = _FaultIn(
        [
            t
            for t, target, n in zip(tensors, targets, need, strict=True)
            if n and target is None and t.device.type == "cpu"
        ]
    )
    works = [dist.broadcast(t, src=source, group=group, async_op=True) for t in moving]
    try:
        for work, tensor in zip(works, moving, strict=True):
            if work is not None:
                work.wait()
            hashes.submit([tensor])
    finally:
        fault_in.join()
    data_s = time.perf_counter() - began
    with torch.no_grad():
        for entry in description["model"]:
            tensor = own[str(entry["name"])]
            received = tensors[int(entry["tensor"])]
            if received is not tensor:
                tensor.copy_(received)
    committed = int(description["committed"])
    try:
        params = [p for g in state.optimizer.param_groups for p in g["params"]]
        optim_state = {
            int(item["param"]): _as_dtensors(
                decode(item["values"], tensors),
                [str(k) for k in item.get("dtensor", [])],
                params[int(item["param"])],
                int(item["param"]),
            )
            for item in description["optimizer"]["state"]
        }
        groups = [decode(g, tensors) for g in description["optimizer"]["param_groups"]]
        if state.zero_replica is not None:
            # Only the ZeRO optimizer's hyperparameters; its partition comes afterwards.
            for own_group, sent in zip(state.optimizer.param_groups, groups, strict=True):
                own_group.update({k: v for k, v in sent.items() if k != "params"})
        else:
            state.optimizer.load_state_dict({"state": optim_state, "param_groups": groups})
        state.load_objects(description["objects"], tensors)
        if state.data is not None:
            sent = description.get("data")
            if sent is None:
                raise ReplicaError("the replica sends no data position; this rank has a loader")
            if fresh or not state.data.rewind(committed):
                state.data.load(decode(sent, tensors))
    except (StateCodecError, ValueError, KeyError, TypeError, IndexError) as e:
        raise ReplicaError(f"the replica's state cannot be loaded here: {e}") from e
    return committed, Moved(sum(t.numel() * t.element_size() for t in moving), data_s)


def _device(spec: dict[str, Any]) -> torch.device:
    """Where a tensor the source holds on ``spec["device"]`` is received into a new buffer:
    this rank's current GPU for a GPU's tensor, else the CPU."""
    if spec.get("device") == "cuda" and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _targets(
    state: TrainState,
    description: Mapping[str, Any],
    own: Mapping[str, torch.Tensor],
    fresh: bool,
) -> list[torch.Tensor | None]:
    """This rank's own tensor for each of the description's, where it holds one of the same
    dtype and shape at the same place: the model's (received in place), and, on a rank that
    was alive, its optimizer state's and its registered objects' (the data position is small
    and is always sent)."""
    table: list[dict[str, Any]] = description["tensors"]
    targets: list[torch.Tensor | None] = [None] * len(table)
    for entry in description["model"]:
        tensor = own[str(entry["name"])]
        if tensor.is_contiguous():
            targets[int(entry["tensor"])] = tensor
    if fresh:
        return targets
    try:
        mine, tensors = describe(state, 0, data=False)
    except ReplicaError:
        return targets  # its own state cannot be described: every other tensor is sent
    held = _paths(mine)
    for path, index in _paths(description).items():
        j = held.get(path)
        if j is None or targets[index] is not None or not 0 <= index < len(table):
            continue
        spec, tensor = table[index], tensors[j]
        if str(tensor.dtype) == spec["dtype"] and list(tensor.shape) == spec["shape"]:
            targets[index] = tensor
    return targets
