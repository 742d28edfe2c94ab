"""The whole training state of a rank, and the step that leaves no trace when it fails.

The session's state is the model, the optimizer, the objects the script registers with
``unbroken.worker.init(..., state={...})`` (anything with ``state_dict()`` and
``load_state_dict()``, the ``torch.distributed.checkpoint.stateful`` protocol: LR schedulers,
``torch.amp.GradScaler``, EMA weights, the script's own counters) and the data position
(``data=``, :mod:`unbroken.worker.data`). Registered objects are *replicated* state: the same
on every data-parallel rank, checkpointed once, sent from a healthy replica, compared by the
agreement check. The data position is per rank, kept per rank in checkpoints.

Exactly once. :meth:`TrainState.begin` takes what a step may change before the step runs: the
registered objects' state dicts, the optimizer's hyperparameters (a scheduler sets the
learning rate in the loop body) and the model's buffers (BatchNorm statistics change in the
forward). When the step fails, the optimizer update is skipped (:mod:`unbroken.worker.recovery`)
and :meth:`TrainState.rollback` puts the rest back, on every rank that began the step, before
the step is redone. Model parameters and optimizer state need no copy: the update that would
change them never ran. What the script keeps outside the session (an unregistered scheduler,
a plain counter, an iterator of its own) is the script's to keep right; the agreement check
(:mod:`unbroken.worker.agreement`) catches what diverges because of it.

Sharded state (ZeRO, FSDP2, HSDP; :mod:`unbroken.worker.sharding`): the model and optimizer
parts of :meth:`TrainState.digests` are this rank's shard (a ZeRO optimizer's is its local
partition, with the hyperparameters of every group), equal only on the ranks that hold the same
shard; the registered objects and the data position stay replicated on every rank.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from unbroken.checkpoint.optimizer import is_zero
from unbroken.worker.data import Batches
from unbroken.worker.digest import TensorHashes, tensor_hash, tensors_in, update_digest
from unbroken.worker.sharding import Sharding, sharding_of
from unbroken.worker.statecodec import StateCodecError, decode, encode
from unbroken.worker.zero import ReplicaOptimizer

_RESERVED = ("model", "optimizer", "data")


def _module(model: torch.nn.Module) -> torch.nn.Module:
    return model.module if isinstance(model, DistributedDataParallel) else model


class TrainState:
    """One rank's training state (see the module doc)."""

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        objects: Mapping[str, Any] | None = None,
        data: Batches | None = None,
        *,
        replica_optimizer: bool = False,
        replica_stride: int = 1,
    ) -> None:
        self.model = model
        self.module = _module(model)
        self.optimizer = optimizer
        world = dist.get_world_size() if dist.is_initialized() else 1
        #: The replica of the partner's ZeRO partition (:mod:`unbroken.worker.zero`).
        self.zero_replica: ReplicaOptimizer | None = None
        if replica_optimizer:
            if not is_zero(optimizer):
                raise ValueError(
                    "replica_optimizer=True: the optimizer is a "
                    f"{type(optimizer).__name__}, not a ZeroRedundancyOptimizer"
                )
            if optimizer.world_size != world:
                raise ValueError(
                    f"replica_optimizer=True: the ZeroRedundancyOptimizer's group has "
                    f"{optimizer.world_size} of the job's {world} ranks; a replica optimizer "
                    "needs a group of every rank"
                )
            if world > 1:
                self.zero_replica = ReplicaOptimizer(optimizer, replica_stride).install()
        self.sharding: Sharding = sharding_of(
            model, optimizer, world, partner_replicas=self.zero_replica is not None
        )
        self.objects: dict[str, Any] = {}
        for name, obj in (objects or {}).items():
            if not isinstance(name, str) or not name or name in _RESERVED:
                raise ValueError(
                    f"state name {name!r}: use a non-empty string other than {', '.join(_RESERVED)}"
                )
            for method in ("state_dict", "load_state_dict"):
                if not callable(getattr(obj, method, None)):
                    raise TypeError(
                        f"state[{name!r}] ({type(obj).__name__}) has no {method}(): register "
                        "objects that follow the state_dict/load_state_dict protocol"
                    )
            try:
                encode(obj.state_dict(), [], f"state[{name!r}].state_dict()")
            except StateCodecError as e:
                raise TypeError(str(e)) from None
            self.objects[name] = obj
        self.data = data
        self._snapshot_step: int | None = None
        self._objects_copy: dict[str, Any] = {}
        self._groups_copy: list[dict[str, Any]] = []
        self._buffers_copy: list[torch.Tensor] = []

    # -- exactly-once steps ------------------------------------------------------------------

    def begin(self, step: int, *, snapshot: bool) -> None:
        """Step ``step`` starts; with ``snapshot`` take what it may change (see the module
        doc)."""
        if self.data is not None:
            self.data.begin(step)
        if not snapshot:
            return
        self._snapshot_step = step
        self._objects_copy = {
            name: copy.deepcopy(obj.state_dict()) for name, obj in self.objects.items()
        }
        self._groups_copy = [
            {k: (v.clone() if isinstance(v, torch.Tensor) else copy.copy(v)) for k, v in g.items()}
            for g in self.optimizer.param_groups
        ]
        buffers = [b.detach() for b in self.module.buffers()]
        if [(b.shape, b.dtype) for b in buffers] != [
            (c.shape, c.dtype) for c in self._buffers_copy
        ]:
            self._buffers_copy = [b.clone() for b in buffers]
        else:
            for copy_, buffer in zip(self._buffers_copy, buffers, strict=True):
                copy_.copy_(buffer)

    def rollback(self, step: int) -> bool:
        """Undo what step ``step`` changed, when this rank began it (True then)."""
        if self.data is not None:
            self.data.rewind(step)
        if self._snapshot_step != step:
            return False
        for name, saved in self._objects_copy.items():
            self.objects[name].load_state_dict(copy.deepcopy(saved))
        for group, saved_group in zip(self.optimizer.param_groups, self._groups_copy, strict=True):
            for key, value in saved_group.items():
                if key == "params":
                    continue
                current = group.get(key)
                if isinstance(current, torch.Tensor) and isinstance(value, torch.Tensor):
                    current.copy_(value)
                else:
                    group[key] = copy.copy(value)
        with torch.no_grad():
            for buffer, saved_buffer in zip(self.module.buffers(), self._buffers_copy, strict=True):
                buffer.copy_(saved_buffer)
        self._snapshot_step = None
        return True

    # -- replicated state --------------------------------------------------------------------

    def encode_objects(self, tensors: list[torch.Tensor]) -> dict[str, Any]:
        """The registered objects' state dicts, encoded (tensors appended to ``tensors``)."""
        return {
            name: encode(obj.state_dict(), tensors, f"state[{name!r}]")
            for name, obj in self.objects.items()
        }

    def load_objects(self, encoded: Mapping[str, Any], tensors: list[torch.Tensor]) -> None:
        self.load_state_dicts({name: decode(value, tensors) for name, value in encoded.items()})

    def state_dicts(self) -> dict[str, Any]:
        """The registered objects' state dicts, by name."""
        return {name: obj.state_dict() for name, obj in self.objects.items()}

    def load_state_dicts(self, state_dicts: Mapping[str, Any]) -> None:
        missing = sorted(set(self.objects) - set(state_dicts))
        if missing:
            raise ValueError(f"no state for registered object(s) {', '.join(missing)}")
        for name, obj in self.objects.items():
            obj.load_state_dict(state_dicts[name])

    def digests(self, committed: int, hashes: TensorHashes | None = None) -> dict[str, bytes]:
        """sha256 of each part: ``model``, ``optimizer``, each registered object, ``data``
        (the position, which every replica shares) and the committed steps. Each part is a
        tree (:mod:`unbroken.worker.digest`): its structure with every tensor's own hash,
        taken from ``hashes`` (hashed in the background, or as a repair received them)."""
        hash_of = hashes if hashes is not None else tensor_hash
        model = hashlib.sha256()
        for key, value in sorted(self.module.state_dict().items()):
            model.update(key.encode())
            update_digest(model, value, hash_of)
        parts: dict[str, bytes] = {"model": model.digest()}
        optimizer = hashlib.sha256()
        update_digest(optimizer, self._optimizer_part(), hash_of)
        parts["optimizer"] = optimizer.digest()
        for name, obj in self.objects.items():
            h = hashlib.sha256()
            update_digest(h, obj.state_dict(), hash_of)
            parts[f"state[{name}]"] = h.digest()
        h = hashlib.sha256(f"committed:{committed}".encode())
        if self.data is not None:
            h.update(repr(self.data.counters(committed)).encode())
        parts["data"] = h.digest()
        return parts

    def _optimizer_part(self) -> dict[str, Any]:
        if self.zero_replica is not None:
            # The hyperparameters, the same on every rank; the partitions are compared with
            # their replicas (unbroken.worker.zero.verify).
            return {"param_groups": optimizer_state(self.optimizer)["param_groups"]}
        return optimizer_state(self.optimizer)

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor :meth:`digests` hashes, in its order (for :meth:`TensorHashes.submit`)."""
        model = self.module.state_dict()
        out = [t for key in sorted(model) for t in tensors_in(model[key])]
        out.extend(tensors_in(self._optimizer_part()))
        for obj in self.objects.values():
            out.extend(tensors_in(obj.state_dict()))
        return out

    def digest(self, committed: int, hashes: TensorHashes | None = None) -> bytes:
        """One sha256 over :meth:`digests`."""
        h = hashlib.sha256()
        for name, value in self.digests(committed, hashes).items():
            h.update(name.encode())
            h.update(value)
        return h.digest()


def optimizer_state(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer's state dict on this rank: a ``ZeroRedundancyOptimizer``'s is its local
    partition's state with the hyperparameters of every group (its own ``state_dict()`` needs
    a collective first)."""
    if is_zero(optimizer):
        local = optimizer.optim.state_dict()
        groups = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
        return {"state": local["state"], "param_groups": groups}
    return optimizer.state_dict()
