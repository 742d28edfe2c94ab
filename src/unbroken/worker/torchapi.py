"""Every private torch API the worker library uses, each behind one thin function.

The worker leans on torch internals where no public API does the job: DDP's reducer parameters
and process group, the collectives DDP's constructor runs, the default group's store and
timeout, gloo process groups not registered with ``torch.distributed``. Those names change
between torch releases without notice, so no other module names them: a torch upgrade that
moves one breaks here, and in the test of the function that wraps it
(``tests/multiproc/test_torchapi.py``), not somewhere in the middle of a recovery.

Each function says what it does, the torch version it was checked against, and the public API
that would replace it, if there is one. The store and group classes are re-exported under the
names of ``torch._C._distributed_c10d``, which is where their type stubs live; at run time they
are the very classes ``torch.distributed`` exports publicly.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import GradBucket, PrefixStore, ProcessGroupGloo, Store, TCPStore
from torch.nn.parallel import DistributedDataParallel
from torch.nn.parallel.distributed import _BufferCommHookLocation

__all__ = [
    "GradBucket",
    "PrefixStore",
    "ProcessGroupGloo",
    "Store",
    "TCPStore",
    "abort_group",
    "broadcast_coalesced",
    "ddp_delays_all_reduce",
    "ddp_parameters",
    "ddp_register_buffer_hook",
    "ddp_syncs_buffers",
    "ddp_use_process_group",
    "default_store",
    "device_backends",
    "foreach_div_",
    "gloo_allgather",
    "gloo_allreduce",
    "gloo_barrier",
    "gloo_broadcast",
    "gloo_group",
    "make_default_group",
    "plain_group",
    "set_group_timeout",
    "sharding_class",
    "sharding_mesh",
    "sharding_rehash",
    "unbind_default_group_arguments",
    "verify_params_across_processes",
    "wrap_sharding_propagation",
]

# -- the default group -----------------------------------------------------------------------


def default_store() -> Store:
    """The store ``init_process_group`` built the default group on (a new group's rendezvous
    goes under a prefix of it).

    ``torch.distributed.distributed_c10d._get_default_store``; checked against torch 2.13.
    Public replacement: none; a script that builds the store itself and passes it as
    ``init_process_group(store=...)`` holds it already."""
    return dist.distributed_c10d._get_default_store()


def set_group_timeout(group: dist.ProcessGroup, timeout: timedelta) -> None:
    """Change the timeout of ``group``'s collectives after it was built.

    ``torch.distributed.distributed_c10d._set_pg_timeout``; checked against torch 2.13. Public
    replacement: ``timeout=`` of ``init_process_group``/``new_group``, when the group is built
    (the script builds the default group, before the session knows its timeout)."""
    dist.distributed_c10d._set_pg_timeout(timeout, group)


def unbind_default_group_arguments() -> None:
    """Drop the default group that ``torch.distributed.nn.functional`` bound as a default
    argument of its functions when it was imported (DDP's constructor imports it): that
    binding keeps the group, and its connections, alive for good. ``None`` means the same (the
    current default group).

    Relies on the module's functions taking ``group=group.WORLD``, evaluated at import;
    checked against torch 2.13. Public replacement: none."""
    module = sys.modules.get("torch.distributed.nn.functional")
    if module is None:
        return
    for value in vars(module).values():
        defaults = getattr(value, "__defaults__", None)
        if isinstance(defaults, tuple) and any(isinstance(d, dist.ProcessGroup) for d in defaults):
            value.__defaults__ = tuple(
                None if isinstance(d, dist.ProcessGroup) else d for d in defaults
            )


def make_default_group(group: dist.ProcessGroup) -> None:
    """Make ``group`` (registered with ``torch.distributed``, of every rank) the default group:
    what ``group=None`` and ``dist.group.WORLD`` mean from now on, and what groups built
    without a backend are built like.

    ``torch.distributed.distributed_c10d._update_default_pg``; checked against torch 2.11 and
    2.13. Public replacement: ``destroy_process_group`` then ``init_process_group``, which
    would take down the script's groups with the old one."""
    dist.distributed_c10d._update_default_pg(group)


def device_backends(group: dist.ProcessGroup | None) -> dict[str, str]:
    """Device type -> backend name of ``group``'s collectives (``{"cpu": "gloo"}``,
    ``{"cuda": "nccl"}``...), from its backend configuration (``"cpu:gloo,cuda:nccl"``).

    Public: ``dist.get_backend_config``; checked against torch 2.11 and 2.13."""
    config = dist.get_backend_config(group)
    backends: dict[str, str] = {}
    for part in config.split(","):
        device, sep, name = part.strip().partition(":")
        if sep:
            backends[device] = name
    return backends or {"cpu": config.strip()}


def plain_group(
    store: Store, rank: int, size: int, timeout: timedelta, backends: dict[str, str]
) -> dist.ProcessGroup:
    """A process group over ``store`` not registered with ``torch.distributed``, gloo for CPU
    tensors and ``backends["cuda"]`` (NCCL or gloo) for CUDA ones: dropping its last reference
    closes its links.

    Builds ``torch._C._distributed_c10d.ProcessGroup`` and registers backends on it as
    ``init_process_group`` does inside (``_register_backend``); checked against torch 2.13.
    Public replacement: none (``new_group`` registers the group)."""
    group = dist.ProcessGroup(store, rank, size)
    gloo = ProcessGroupGloo(PrefixStore("cpu/", store), rank, size, timeout)
    backend_type = dist.ProcessGroup.BackendType
    group._set_default_backend(backend_type.GLOO)
    group._register_backend(torch.device("cpu"), backend_type.GLOO, gloo)
    if torch.cuda.is_available():
        if backends.get("cuda") == "nccl":
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = timeout
            nccl = dist.ProcessGroupNCCL(PrefixStore("cuda/", store), rank, size, options)
            group._set_default_backend(backend_type.NCCL)
            group._register_backend(torch.device("cuda"), backend_type.NCCL, nccl)
        else:
            group._register_backend(torch.device("cuda"), backend_type.GLOO, gloo)
    return group


def abort_group(group: dist.ProcessGroup) -> bool:
    """Abort ``group``'s NCCL communicator, if it has one: every collective waiting on it ends
    with an error at once (NCCL's kernels otherwise wait for a dead peer for ever, and hold the
    device's streams), and the communicator is never used again. False: the group has no NCCL
    backend (gloo closes its links when the group's last reference goes).

    ``ProcessGroup._get_backend(torch.device("cuda"))`` and ``ProcessGroupNCCL.abort()``;
    checked against torch 2.11 and 2.13. Public replacement: ``dist.distributed_c10d.
    _abort_process_group`` (private too, and for registered groups only)."""
    nccl = getattr(dist, "ProcessGroupNCCL", None)
    if nccl is None or not torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        return False
    try:
        backend = group._get_backend(torch.device("cuda"))
    except (RuntimeError, ValueError):  # no backend for CUDA tensors
        return False
    if not isinstance(backend, nccl):
        return False
    backend.abort()
    return True


# -- gloo groups of the worker's own ---------------------------------------------------------


def gloo_group(store: Store, rank: int, world_size: int, timeout: timedelta) -> ProcessGroupGloo:
    """A gloo group built directly over ``store``, not registered with ``torch.distributed``:
    dropping its last reference closes its links (``abort()`` does not, for gloo).

    Constructs ``torch._C._distributed_c10d.ProcessGroupGloo``; checked against torch 2.13.
    Public replacement: ``dist.new_group(backend="gloo")``, which registers the group, so its
    links stay open until ``destroy_process_group``."""
    return ProcessGroupGloo(store, rank, world_size, timeout)


def gloo_allreduce(group: ProcessGroupGloo, tensor: torch.Tensor) -> dist.Work:
    """Start summing ``tensor`` in place over ``group`` (from :func:`gloo_group`).

    ``ProcessGroupGloo.allreduce``, a backend method without type stubs; checked against torch
    2.13. Public replacement: ``dist.all_reduce(tensor, group=g, async_op=True)`` on a
    registered group."""
    work: dist.Work = group.allreduce([tensor])  # type: ignore[attr-defined]
    return work


def gloo_broadcast(group: ProcessGroupGloo, tensor: torch.Tensor) -> dist.Work:
    """Start sending rank 0's ``tensor`` to every rank of ``group``, in place.

    ``ProcessGroupGloo.broadcast``; checked against torch 2.13. Public replacement:
    ``dist.broadcast(tensor, src, group=g, async_op=True)`` on a registered group."""
    work: dist.Work = group.broadcast([tensor])  # type: ignore[attr-defined]
    return work


def gloo_allgather(
    group: ProcessGroupGloo, outputs: list[torch.Tensor], tensor: torch.Tensor
) -> dist.Work:
    """Start gathering every rank's ``tensor`` into ``outputs`` (one tensor per rank).

    ``ProcessGroupGloo.allgather``; checked against torch 2.13. Public replacement:
    ``dist.all_gather(outputs, tensor, group=g, async_op=True)`` on a registered group."""
    work: dist.Work = group.allgather([outputs], [tensor])  # type: ignore[attr-defined]
    return work


def gloo_barrier(group: ProcessGroupGloo) -> dist.Work:
    """Start a barrier over ``group``.

    ``ProcessGroupGloo.barrier``; checked against torch 2.13. Public replacement:
    ``dist.barrier(group=g, async_op=True)`` on a registered group."""
    work: dist.Work = group.barrier()  # type: ignore[attr-defined]
    return work


# -- what DistributedDataParallel does inside ------------------------------------------------


def ddp_parameters(ddp: DistributedDataParallel) -> list[torch.nn.Parameter]:
    """The parameters DDP's reducer averages, in the reducer's order (the order its buckets
    and its comm hook see them in).

    ``DistributedDataParallel._build_params_for_reducer()[0]``; checked against torch 2.13.
    Public replacement: none (``module.parameters()`` differs for shared and ignored
    parameters)."""
    params: list[torch.nn.Parameter] = ddp._build_params_for_reducer()[0]  # type: ignore[no-untyped-call]
    return params


def ddp_use_process_group(ddp: DistributedDataParallel, group: dist.ProcessGroup) -> None:
    """Run DDP's own collectives (bucket rebuild, used-parameter map, buffer sync) over
    ``group`` from now on.

    ``DistributedDataParallel._update_process_group``; checked against torch 2.13. Public
    replacement: none."""
    ddp._update_process_group(group)  # type: ignore[no-untyped-call]


def ddp_delays_all_reduce(ddp: DistributedDataParallel) -> bool:
    """Whether DDP all-reduces every gradient in a hook of its own after backward
    (``delay_all_reduce_named_params`` covering all parameters), bypassing the comm hook.

    ``DistributedDataParallel._delay_all_reduce_all_params``; checked against torch 2.13.
    Public replacement: none."""
    return bool(getattr(ddp, "_delay_all_reduce_all_params", False))


def ddp_syncs_buffers(ddp: DistributedDataParallel) -> bool:
    """Whether DDP broadcasts the module's buffers from rank 0 before each forward (and so
    also broadcast them in its constructor).

    ``forward_sync_buffers`` from torch 2.13 (which renamed ``broadcast_buffers``), the
    attribute ``broadcast_buffers`` before it (2.11, 2.12). Public: both are constructor
    arguments, read back from the instance."""
    value = getattr(ddp, "forward_sync_buffers", None)
    if value is None:
        value = ddp.broadcast_buffers
    return bool(value)


def ddp_register_buffer_hook(
    ddp: DistributedDataParallel,
    state: Any,
    hook: Callable[[Any, dict[str, torch.Tensor]], None],
) -> None:
    """Have ``hook(state, buffers)`` sync the module's buffers before each forward, in place
    of DDP's broadcast over its own group.

    ``DistributedDataParallel._register_buffer_comm_hook`` with
    ``_BufferCommHookLocation.PRE_FORWARD``; checked against torch 2.13. Public replacement:
    none (``broadcast_buffers=False`` and a broadcast in the script)."""
    ddp._register_buffer_comm_hook(state, hook, _BufferCommHookLocation.PRE_FORWARD)


def verify_params_across_processes(
    group: dist.ProcessGroup, params: Sequence[torch.Tensor]
) -> None:
    """The check DDP's constructor runs over ``group``: every rank has as many parameters,
    of the same shapes and strides, as rank 0 (raises otherwise). A replacement process
    constructing DDP runs it, so survivors must meet it there.

    ``torch.distributed._verify_params_across_processes``; checked against torch 2.13. Public
    replacement: none."""
    dist._verify_params_across_processes(group, list(params), None)  # type: ignore[attr-defined]


def broadcast_coalesced(
    group: dist.ProcessGroup, tensors: Sequence[torch.Tensor], bucket_size: int, src: int = 0
) -> None:
    """Copy rank ``src``'s ``tensors`` into every rank's, in place, packed into buckets of
    ``bucket_size`` bytes: the broadcast DDP's constructor and its buffer sync run.

    ``torch.distributed._broadcast_coalesced``; checked against torch 2.13. Public
    replacement: ``dist.broadcast`` per tensor, which does not meet the collectives DDP's
    constructor runs on a replacement process."""
    dist._broadcast_coalesced(group, list(tensors), bucket_size, src)  # type: ignore[attr-defined]


def foreach_div_(tensors: Sequence[torch.Tensor], divisor: float) -> None:
    """Divide every tensor of ``tensors`` by ``divisor`` in place, in one call.

    ``torch._foreach_div_``; checked against torch 2.13. Public replacement: ``t.div_(divisor)``
    per tensor (the same values, one kernel launch per tensor)."""
    torch._foreach_div_(list(tensors), divisor)


# -- DTensor's sharding propagation ----------------------------------------------------------


def wrap_sharding_propagation(wrap: Callable[[Callable[[Any], Any]], Callable[[Any], Any]]) -> bool:
    """Put ``wrap(propagate)`` in place of the function that computes the output sharding of a
    ``DTensor`` operator from its ``OpSchema`` when no cache of this thread has it yet (what
    costs a fresh process its first sharded step). False: this torch has no such function.

    ``DTensor._op_dispatcher.sharding_propagator.propagate_op_sharding_non_cached``, called
    through the instance by the C++ fast path's miss, and its per-thread cache
    ``propagate_op_sharding`` (a ``LocalLRUCache`` made around the bound method at
    construction, which torch 2.11 calls first) made anew around the wrapped one; checked
    against torch 2.11 and 2.13. Public replacement: none."""
    from torch.distributed.tensor import DTensor

    propagator: Any = getattr(getattr(DTensor, "_op_dispatcher", None), "sharding_propagator", None)
    inner = getattr(propagator, "propagate_op_sharding_non_cached", None)
    if propagator is None or inner is None:
        return False
    wrapped = wrap(inner)
    propagator.propagate_op_sharding_non_cached = wrapped
    cache = getattr(propagator, "propagate_op_sharding", None)
    if cache is not None and hasattr(cache, "cache"):  # LocalLRUCache(user_function)
        propagator.propagate_op_sharding = type(cache)(wrapped)
    return True


def sharding_class(module: str, name: str) -> type | None:
    """The class ``module.name`` if an operator's sharding is made of it, else None: the
    dataclasses, named tuples, enums and placements of ``torch.distributed.tensor``'s modules
    already imported (``OpSchema``, ``OutputSharding``, ``DTensorSpec``, ``TensorMeta``,
    ``ShardOrderEntry``, ``Shard``...).

    Those modules are private but for ``placement_types``; checked against torch 2.13.
    Public replacement: none."""
    import enum

    from torch.distributed.tensor.placement_types import Placement

    if module != "torch.distributed.tensor" and not module.startswith("torch.distributed.tensor."):
        return None
    found = getattr(sys.modules.get(module), name, None)
    if not isinstance(found, type):
        return None
    if (
        dataclasses.is_dataclass(found)
        or issubclass(found, (Placement, enum.Enum))
        or (issubclass(found, tuple) and hasattr(found, "_fields"))
    ):
        return found
    return None


def sharding_mesh(schema: Any) -> Any:
    """The device mesh of the first ``DTensor`` argument of the operator schema ``schema``
    (None if it has none).

    ``OpSchema.args_spec`` and ``DTensorSpec.mesh``; checked against torch 2.13. Public
    replacement: none (``DTensor.device_mesh`` of the arguments, which the schema replaces)."""
    specs = getattr(schema, "args_spec", ())
    return specs[0].mesh if specs else None


def sharding_rehash(value: Any) -> None:
    """Recompute the hashes cached inside ``value`` (an unpickled ``OpSchema`` or
    ``OutputSharding``, and what they hold): a hash depends on the process (string hashing is
    salted per process), so one written by another process matches nothing.

    ``DTensorSpec._hash`` and ``OpSchema._recompute_comparison_key``; checked against torch
    2.11 and 2.13. Public replacement: none."""
    from torch.distributed.tensor._dtensor_spec import DTensorSpec
    from torch.distributed.tensor._op_schema import OpSchema

    seen: set[int] = set()

    def visit(item: Any) -> None:
        if id(item) in seen:
            return
        seen.add(id(item))
        if isinstance(item, (list, tuple)):
            for element in item:
                visit(element)
        elif isinstance(item, dict):
            for key, element in item.items():
                visit(key)
                visit(element)
        elif dataclasses.is_dataclass(item) and not isinstance(item, type):
            for field in dataclasses.fields(item):
                visit(getattr(item, field.name, None))
            if isinstance(item, DTensorSpec):
                object.__setattr__(item, "_hash", None)
            elif isinstance(item, OpSchema):
                item._recompute_comparison_key()

    visit(value)
