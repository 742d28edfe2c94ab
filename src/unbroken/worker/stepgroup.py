"""Collectives as data: every collective of a step goes through the session's process groups.

A script calls collectives the session never sees: ``clip_grad_norm_`` on ``DTensor`` gradients
all-reduces the norm over the device mesh (a functional collective, outside FSDP's hooks), a
loss is all-reduced for logging, a metric gathered, ZeRO broadcasts its updated partitions. When
a peer dies, any of them raises into the script, far from the step boundary, and the rank dies
with its peer: two faults where there was one.

:class:`StepGroup` is a ``torch.distributed.ProcessGroup`` written in Python (the shape of
torchft's error-swallowing wrapper) around a real one (gloo; NCCL for CUDA tensors when the
script's group used it). The session registers it as the backend ``unbroken`` and makes it the
default group (:func:`adopt_default_group`), so the groups built over it afterwards (the
device mesh's dimensions, ``dist.new_group()`` without a backend) are made of it too. Each of
its collectives is handed to the real group; when one fails because of a peer (a closed or
reset connection, a timeout, an abort: :func:`is_peer_failure`), the error is reported to the
step (:class:`StepFaults`) instead of raised, its output tensors are zeroed, and from then on
every collective of the step on every :class:`StepGroup` returns at once, done, with zeroed
outputs (in-place ones, like an all-reduce's, are left as they are). The script runs on to the
step boundary in its own process; the optimizer update of a failed step is skipped there and the
recovery ladder decides (:mod:`unbroken.worker.recovery`). An error that is not a peer's failure
(a wrong shape, a wrong dtype) still raises where the script made the call.

Leaving a group (:meth:`StepGroup.release`) drops the only reference to the real group, whose
links then close, so peers blocked in one of its collectives fail at once rather than waiting
for the group's timeout.

Covered: every collective and point-to-point call of ``torch.distributed`` and of the
functional collectives (``DTensor``) on the default group and on every group built over it
after :func:`adopt_default_group`. Not covered: groups the script built with an explicit
``backend=`` or before ``unbroken.worker.init`` (other than the one device mesh the session
rebuilds), which raise as before.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable, Iterable
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Protocol

import torch
import torch.distributed as dist

from unbroken.worker import torchapi

if TYPE_CHECKING:
    from torch.distributed.distributed_c10d import GroupName

logger = logging.getLogger(__name__)

BACKEND = "unbroken"

#: The words with which gloo and NCCL say that a collective failed because of another rank or
#: the link to it (gloo raises most of them as a plain ``RuntimeError``).
PEER_FAILURE_MARKERS = (
    "Connection closed by peer",
    "Connection reset by peer",
    "Connection refused",
    "Broken pipe",
    "Socket closed",
    "Software caused connection abort",
    "Timed out",
    "timed out",
    "Timeout",
    "aborted",
    "Aborted",
    "no process group",
)


def is_peer_failure(error: BaseException) -> bool:
    """Whether ``error`` (or what it was raised from) says a collective failed because of a
    peer or a link: a ``torch.distributed`` backend or network error, or gloo's words for one."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, (dist.DistBackendError, dist.DistNetworkError)):
            return True
        text = str(current)
        if any(marker in text for marker in PEER_FAILURE_MARKERS):
            return True
        current = current.__cause__ or current.__context__
    return False


class StepFaults(Protocol):
    """Where a :class:`StepGroup` reports a failed collective: the session's current step.
    Collectives are taken as the step's only between the step's start and its boundary
    (``in_step``); outside a step (the boundary's agreement check, a checkpoint, a recovery's
    own collectives) a failure raises as it would without the session."""

    @property
    def in_step(self) -> bool: ...

    @property
    def step_failed(self) -> bool: ...

    def collective_failed(self, error: Exception) -> None: ...


class _Faults:
    """The fault sink of every :class:`StepGroup` of this process (set by the session)."""

    def __init__(self) -> None:
        self.sink: StepFaults | None = None
        self._reporting = threading.local()

    def active(self) -> bool:
        """Whether collectives are the step's now (a failure is reported, not raised)."""
        return self.sink is not None and self.sink.in_step

    def failed(self) -> bool:
        return self.sink is not None and self.sink.in_step and self.sink.step_failed

    def report(self, error: Exception) -> None:
        sink = self.sink
        if sink is None or not sink.in_step:
            raise error
        if getattr(self._reporting, "on", False):  # the sink waited on another failed work
            logger.debug("collective failed while another failure was reported: %s", error)
            return
        self._reporting.on = True
        try:
            if not sink.step_failed:
                sink.collective_failed(error)
        finally:
            self._reporting.on = False


_faults = _Faults()
_groups: weakref.WeakSet[StepGroup] = weakref.WeakSet()


def _zero(tensors: Iterable[torch.Tensor]) -> None:
    for tensor in tensors:
        tensor.zero_()


class _DoneWork(dist.Work):
    """A collective of a failed step: done at once, its outputs zeroed."""

    def __init__(self, results: list[torch.Tensor]) -> None:
        super().__init__()
        self._results = results

    def wait(self, timeout: timedelta | None = None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True

    def exception(self) -> Any:
        return None

    def result(self) -> list[torch.Tensor]:
        return self._results

    def synchronize(self) -> None:
        return None

    def get_future(self) -> torch.futures.Future[list[torch.Tensor]]:
        future: torch.futures.Future[list[torch.Tensor]] = torch.futures.Future()
        future.set_result(self._results)
        return future


class _StepWork(dist.Work):
    """The real group's work; a peer's failure is reported to the step, not raised."""

    def __init__(
        self, work: dist.Work, outputs: list[torch.Tensor], results: list[torch.Tensor]
    ) -> None:
        super().__init__()
        self._work = work
        self._outputs = outputs
        self._results = results
        self._failed = False

    def _swallow(self, error: Exception) -> None:
        if not is_peer_failure(error) or not _faults.active():
            raise error
        if not self._failed:
            self._failed = True
            _zero(self._outputs)
            _faults.report(error.with_traceback(None))

    def wait(self, timeout: timedelta | None = None) -> bool:
        try:
            if timeout is None:
                self._work.wait()
            else:
                self._work.wait(timeout)
        except Exception as e:
            self._swallow(e)
        return True

    def is_completed(self) -> bool:
        return self._failed or bool(self._work.is_completed())

    def is_success(self) -> bool:
        return not self._failed and bool(self._work.is_success())

    def exception(self) -> Any:
        return None

    def result(self) -> list[torch.Tensor]:
        return self._results

    def synchronize(self) -> None:
        try:
            self._work.synchronize()
        except Exception as e:
            self._swallow(e)

    def get_future(self) -> torch.futures.Future[list[torch.Tensor]]:
        results = self._results

        def settle(done: torch.futures.Future[Any]) -> list[torch.Tensor]:
            try:
                done.wait()
            except Exception as e:  # on the backend's thread: must not raise a peer's failure
                self._swallow(e)
            return results

        future: torch.futures.Future[list[torch.Tensor]] = self._work.get_future().then(settle)
        return future


def _flat(lists: Any) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []
    for item in lists:
        if isinstance(item, torch.Tensor):
            out.append(item)
        else:
            out.extend(_flat(item))
    return out


def _as_list(value: Any) -> list[torch.Tensor]:
    return [value] if isinstance(value, torch.Tensor) else _flat(value)


def _collective(
    name: str, outputs_at: int | None, results_at: int | None
) -> Callable[..., dist.Work]:
    """The :class:`StepGroup` method ``name``: the real group's, through :meth:`StepGroup._run`
    (``outputs_at``/``results_at``: the argument holding its output tensors/the tensors its
    future completes with)."""

    def collective(self: StepGroup, *args: Any, **kwargs: Any) -> dist.Work:
        call = (*args, *kwargs.values())  # torch passes ``opts=`` by name to some
        outputs = _as_list(call[outputs_at]) if outputs_at is not None and call else []
        results = _as_list(call[results_at]) if results_at is not None and call else []
        return self._run(name, call, outputs, results)

    collective.__name__ = collective.__qualname__ = name
    return collective


class StepGroup(dist.ProcessGroup):
    """A process group whose collectives fail the step, not the rank (see the module doc)."""

    def __init__(self, inner: dist.ProcessGroup, rank: int, size: int) -> None:
        super().__init__(rank, size)  # type: ignore[call-arg]  # Python groups: no store
        self._inner: dist.ProcessGroup | None = inner
        self._rank = rank
        self._size = size
        self._name: GroupName = ""  # type: ignore[assignment]  # named when registered
        _groups.add(self)

    # -- identity ----------------------------------------------------------------------------

    def getBackendName(self) -> str:
        return BACKEND

    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size

    def _set_group_name(self, name: GroupName) -> None:
        self._name = name
        super()._set_group_name(name)

    @property
    def group_name(self) -> GroupName:
        return self._name

    def release(self) -> None:
        """Let go of the real group: its links close (gloo closes them when the last reference
        goes), so peers blocked with this rank fail at once; collectives fail from now on."""
        self._inner = None

    def abort(self) -> None:
        self.release()

    def shutdown(self) -> None:
        self.release()

    # -- the collectives -----------------------------------------------------------------------

    def _run(
        self,
        name: str,
        args: tuple[Any, ...],
        outputs: list[torch.Tensor],
        results: list[torch.Tensor],
    ) -> dist.Work:
        if _faults.failed():
            _zero(outputs)
            return _DoneWork(results)
        try:
            if self._inner is None:
                raise RuntimeError("no process group: this rank left it")
            work: dist.Work = getattr(self._inner, name)(*args)
        except Exception as e:
            if not is_peer_failure(e) or not _faults.active():
                raise
            _zero(outputs)
            _faults.report(e.with_traceback(None))
            return _DoneWork(results)
        if not _faults.active():
            return work
        return _StepWork(work, outputs, results)

    # Every collective of ``ProcessGroup``, by the positions of its outputs: (name, where its
    # output tensors are, where the tensors its future completes with are). ``None``: none.
    # In-place collectives (all-reduce, broadcast) have no outputs to zero.
    allreduce = _collective("allreduce", None, 0)
    allreduce_coalesced = _collective("allreduce_coalesced", None, 0)
    reduce = _collective("reduce", None, 0)
    broadcast = _collective("broadcast", None, 0)
    allgather = _collective("allgather", 0, 0)
    allgather_coalesced = _collective("allgather_coalesced", 0, 0)
    _allgather_base = _collective("_allgather_base", 0, 0)
    all_gather_single = _collective("all_gather_single", 0, 0)
    allgather_into_tensor_coalesced = _collective("allgather_into_tensor_coalesced", 0, 0)
    all_gather_single_coalesced = _collective("all_gather_single_coalesced", 0, 0)
    gather = _collective("gather", 0, 0)
    scatter = _collective("scatter", 0, 0)
    reduce_scatter = _collective("reduce_scatter", 0, 0)
    _reduce_scatter_base = _collective("_reduce_scatter_base", 0, 0)
    reduce_scatter_single = _collective("reduce_scatter_single", 0, 0)
    reduce_scatter_tensor_coalesced = _collective("reduce_scatter_tensor_coalesced", 0, 0)
    reduce_scatter_single_coalesced = _collective("reduce_scatter_single_coalesced", 0, 0)
    alltoall_base = _collective("alltoall_base", 0, 0)
    all_to_all_single = _collective("all_to_all_single", 0, 0)
    alltoall = _collective("alltoall", 0, 0)
    barrier = _collective("barrier", None, None)
    send = _collective("send", None, 0)
    recv = _collective("recv", 0, 0)


def _create(store: torchapi.Store, rank: int, size: int, timeout: timedelta) -> StepGroup:
    return StepGroup(torchapi.plain_group(store, rank, size, timeout, _inner_backends), rank, size)


#: device type -> backend of the real groups (what the script's default group used).
_inner_backends: dict[str, str] = {"cpu": "gloo"}
_registered = False


def register() -> None:
    """Register the ``unbroken`` backend with ``torch.distributed`` (once per process)."""
    global _registered
    if _registered:
        return
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    dist.Backend.register_backend(BACKEND, _create, devices=devices)
    _registered = True


def adopt_default_group(sink: StepFaults, timeout: timedelta) -> dist.ProcessGroup:
    """Make a :class:`StepGroup` of every rank the default group, its failures reported to
    ``sink`` (collective: every rank calls it, right after the script's or the regroup's
    ``init_process_group``). The script's own default group stays registered, unused, until
    the rank leaves (``destroy_process_group``)."""
    register()
    _faults.sink = sink
    _inner_backends.clear()
    _inner_backends.update(torchapi.device_backends(dist.group.WORLD))
    group = dist.new_group(backend=BACKEND, timeout=timeout)
    assert isinstance(group, dist.ProcessGroup)
    torchapi.make_default_group(group)
    return group


def release_all() -> int:
    """Let go of every :class:`StepGroup`'s real group (see :meth:`StepGroup.release`):
    how a rank leaving its groups makes peers blocked with it fail at once."""
    released = 0
    for group in list(_groups):
        if group._inner is not None:
            group.release()
            released += 1
    return released
