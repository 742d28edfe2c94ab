"""HSDP's collectives made to fail a step, not the process: what :class:`GradSync` is for DDP.

FSDP2 runs its collectives inside ``forward()`` and ``backward()``: the all-gather of each
module's parameters (forward, and again in backward), the reduce-scatter of its gradients,
and for HSDP the all-reduce of the reduced shard across the replica groups. A failed one
raises out of the user's ``model(x)`` or ``loss.backward()``, far from the step boundary.
:class:`ShardSync` puts its own all-gather and reduce-scatter on every FSDP module (FSDP's
``set_custom_all_gather``/``set_custom_reduce_scatter``) and runs the replica all-reduce
itself, in FSDP's all-reduce hook (``set_all_reduce_hook``), with FSDP's own all-reduce moved
to a group of this rank alone (as :class:`GradSync` moves DDP's): each catches the error,
records the step's failure, and from then on the step's collectives do nothing but zero their
output, so the forward and backward run on to the step boundary. The optimizer update is
skipped there (:mod:`unbroken.worker.recovery`), so the sharded parameters and optimizer state
stay those of the last committed step, and the session recovers in process.

Each generation's groups are the session's own: :meth:`ShardSync.attach` builds a device mesh
of the same shape over the current default group inside :class:`OpenedLinks` and moves the
model onto it (:func:`unbroken.worker.sharding.rebind`), so that a rank leaving its group cuts
those links (:meth:`ShardSync.cut`) and every peer blocked with it in an all-gather or
all-reduce fails at once, whichever replica or shard group it shares with the rank.

A replacement process runs the user's script from the top, and its ``init_device_mesh``
builds the mesh's groups over the new generation before ``unbroken.worker.init``; the ranks
that kept their processes build the same groups at that point of their regroup
(:meth:`ShardSync.replay_mesh`), so that every rank creates the generation's groups in the same
order. The script must build exactly one device mesh (over every rank) before
``unbroken.worker.init`` and no other process group.

Bitwise: the gradient of a shard is reduce-scattered (average over the shard group) then summed
over the replica groups and divided by their number, in every run, so a redone step and a
replacement compute what a fault-free run computes.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule
from torch.distributed.fsdp._fully_shard._fsdp_collectives import (
    DefaultAllGather,
    DefaultReduceScatter,
)
from torch.distributed.fsdp._fully_shard._fsdp_common import DDPMeshInfo

from unbroken.protocol.kinds import StepFailure
from unbroken.worker.failure import SyncFailure
from unbroken.worker.linkfault import OpenedLinks
from unbroken.worker.sharding import ShardingError, rebind
from unbroken.worker.torchapi import set_group_timeout

logger = logging.getLogger(__name__)


def _fsdp_modules(model: torch.nn.Module) -> list[FSDPModule]:
    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def _param_groups(model: torch.nn.Module) -> list[Any]:
    groups = []
    for module in _fsdp_modules(model):
        group = module._get_fsdp_state()._fsdp_param_group
        if group is not None:
            groups.append(group)
    return groups


def model_mesh(model: torch.nn.Module) -> DeviceMesh:
    """The one device mesh of ``model``'s FSDP modules."""
    meshes = {id(g.mesh_info.mesh): g.mesh_info.mesh for g in _param_groups(model)}
    if len(meshes) != 1:
        raise ShardingError(
            f"the model's FSDP modules use {len(meshes)} device meshes: in-process recovery "
            "needs one mesh for all of them"
        )
    (mesh,) = meshes.values()
    assert isinstance(mesh, DeviceMesh)
    return mesh


class _AllGather(DefaultAllGather):
    def __init__(self, sync: ShardSync) -> None:
        self.sync = sync

    def __call__(
        self,
        output_tensor: torch.Tensor,
        input_tensor: torch.Tensor,
        group: dist.ProcessGroup,
        async_op: bool = False,
    ) -> dist.Work | None:
        if self.sync.failure is None:
            try:
                super().__call__(output_tensor, input_tensor, group, async_op=False)
            except Exception as e:
                self.sync.fail_step(e)
            else:
                return None
        output_tensor.zero_()
        return None


class _ReduceScatter(DefaultReduceScatter):
    def __init__(self, sync: ShardSync) -> None:
        self.sync = sync

    def __call__(  # type: ignore[override]
        self,
        output_tensor: torch.Tensor,
        input_tensor: torch.Tensor,
        group: dist.ProcessGroup,
        op: Any,
        async_op: bool = False,
    ) -> dist.Work | None:
        if self.sync.failure is None:
            try:
                super().__call__(output_tensor, input_tensor, group, op, async_op=False)
            except Exception as e:
                self.sync.fail_step(e)
            else:
                return None
        output_tensor.zero_()
        return None


class ShardSync:
    """The step's HSDP collectives and their failure; create it with :meth:`install`.

    Offers what the session and :class:`unbroken.worker.recovery.Recovery` use of
    :class:`unbroken.worker.commhook.GradSync`: ``failure``, :meth:`begin_step`,
    :meth:`fail_step`, :meth:`attach`, :meth:`detach`, :meth:`barrier`, :meth:`all_gather`.
    """

    op_retry = None  # op retry re-executes DDP's all-reduce only
    #: When the step's compute ended, as DDP's hook tells it (0: unknown): FSDP's collectives
    #: run between the modules' compute, so no one point of the step ends it.
    backward_done_at = 0.0
    grads_done_at = 0.0  # nor when its gradients are all reduced

    def __init__(self, model: torch.nn.Module, mesh: DeviceMesh, timeout_s: float) -> None:
        self.model = model
        self.timeout = timedelta(seconds=timeout_s)
        self.mesh = mesh  # the object every DTensor of the model and optimizer refers to
        self.group: dist.ProcessGroup | None = None
        self.world_size = 0
        self.failure: SyncFailure | None = None
        self.step = -1
        self._links: OpenedLinks | None = None
        self._replicate: dist.ProcessGroup | None = None  # the replica groups' all-reduce
        self._replicas = 1
        self._solo: dist.ProcessGroup | None = None
        #: Groups to destroy at the next attach: the script's mesh's, at first.
        self._owned = [mesh.get_group(d) for d in range(mesh.ndim)]
        names = mesh.mesh_dim_names
        self._shape = tuple(mesh.mesh.shape)
        self._names = tuple(names) if names is not None else None
        self._device = mesh.device_type

    @classmethod
    def install(
        cls, model: torch.nn.Module, group: dist.ProcessGroup, timeout_s: float
    ) -> ShardSync:
        """Put the failure-tolerant collectives on every FSDP module of ``model`` and move it
        onto the session's own groups, each with a ``timeout_s`` collective timeout
        (collective: every rank calls it)."""
        sync = cls(model, model_mesh(model), timeout_s)
        for module in _fsdp_modules(model):
            if module._get_fsdp_state()._fsdp_param_group is None:
                continue
            module.set_custom_all_gather(_AllGather(sync))
            module.set_custom_reduce_scatter(_ReduceScatter(sync))
            module.set_all_reduce_hook(sync._all_reduce)
        sync.attach(group)
        return sync

    def _mesh(self) -> DeviceMesh:
        return init_device_mesh(self._device, self._shape, mesh_dim_names=self._names)

    def replay_mesh(self) -> None:
        """Build the mesh a replacement's script builds before ``unbroken.worker.init``
        (collective over the new default group; see the module doc). Its groups are let go
        at :meth:`attach`, once every rank connected the next mesh: a peer still connecting
        this one (a replacement is slower to get there) would see its links close."""
        mesh = self._mesh()
        self._owned = [mesh.get_group(d) for d in range(mesh.ndim)]

    def attach(self, group: dist.ProcessGroup) -> None:
        """Move the model onto a new mesh of the same shape over ``group`` (the default group
        of the current generation), whose links this rank cuts when it leaves."""
        with OpenedLinks() as links:
            mesh = self._mesh()
        for d in range(mesh.ndim):  # a hung peer fails the step within the timeout
            set_group_timeout(mesh.get_group(d), self.timeout)
        rebind(self.model, mesh)
        # The script's own mesh's groups (or the replayed ones), not used from now on: every
        # rank is past them, since it connected the mesh just built.
        for stale in self._owned:
            try:
                dist.destroy_process_group(stale)
            except (ValueError, RuntimeError) as e:
                logger.debug("releasing a previous mesh group: %s", e)
        self._owned = []
        self._links = links
        self.group = group
        self.world_size = group.size()
        self._solo = dist.new_group(
            ranks=[dist.get_rank()], backend="gloo", use_local_synchronization=True
        )
        self._replicate = None
        self._replicas = 1
        for param_group in _param_groups(self.model):
            for info in (param_group.mesh_info, param_group.post_forward_mesh_info):
                if isinstance(info, DDPMeshInfo):  # infos are shared: read the mesh itself
                    self._replicate = self.mesh.get_group(info.replicate_mesh_dim)
                    self._replicas = info.replicate_mesh_size
                    # FSDP's own replica all-reduce runs over this rank alone (a no-op that
                    # cannot fail); the hook runs the real one.
                    info.replicate_process_group = self._solo

    def begin_step(self, step: int = -1) -> None:
        self.failure = None
        self.step = step

    def fail_step(self, error: Exception) -> None:
        """Fail this step: its remaining collectives do nothing; the first failure is kept."""
        if self.failure is not None:
            logger.debug("another sharded collective failed: %s", error)
            return
        self.failure = SyncFailure.of(error, StepFailure.COLLECTIVE)
        logger.warning("sharded collective failed: %s", self.failure.reason)

    def _all_reduce(self, reduced: torch.Tensor) -> None:
        if self._replicate is None or self._replicas < 2:
            return
        if self.failure is None:
            try:
                dist.all_reduce(reduced, op=dist.ReduceOp.SUM, group=self._replicate)
            except Exception as e:
                self.fail_step(e)
            else:
                reduced.div_(self._replicas)
                return
        reduced.zero_()

    def barrier(self) -> None:
        dist.barrier(group=self.group)

    def all_gather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        if self.group is None:
            raise RuntimeError("no process group: this rank left it")
        gathered = [torch.empty_like(tensor) for _ in range(self.world_size)]
        dist.all_gather(gathered, tensor, group=self.group)
        return gathered

    def cut(self) -> int:
        """Shut down the links of this generation's mesh groups (leaving them): peers blocked
        in a collective with this rank fail at once."""
        return self._links.cut() if self._links is not None else 0

    def detach(self) -> None:
        """Drop this rank's references to the generation's groups (collectives fail until
        :meth:`attach`)."""
        self.group = None
        self._replicate = None
        self._solo = None
        self._links = None
        self._owned = []
        self.mesh._pg_registry = {}
