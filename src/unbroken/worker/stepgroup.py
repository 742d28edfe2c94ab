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
from unbroken.worker.linkfault import OpenedLinks

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


class Repairer(Protocol):
    """Op retry of a step's collectives (:mod:`unbroken.worker.stepretry`): repairs every
    :class:`StepGroup` after a peer failure on ``group``; whether the step can go on."""

    def repair(self, error: Exception, group: StepGroup, what: str) -> bool: ...


class _Faults:
    """The fault sink of every :class:`StepGroup` of this process (set by the session)."""

    def __init__(self) -> None:
        self.sink: StepFaults | None = None
        #: Op retry (None: off): a peer's failure is repaired before it fails the step.
        self.repairer: Repairer | None = None
        self._reporting = threading.local()

    def repaired(self, error: Exception, group: StepGroup, what: str) -> bool:
        """Whether op retry repaired the groups after ``error`` (a peer's failure in a step,
        in the collective ``what``)."""
        return self.repairer is not None and self.repairer.repair(error, group, what)

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


def _map_tensors(value: Any, swap: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    if isinstance(value, torch.Tensor):
        return swap(value)
    if isinstance(value, (list, tuple)):
        return type(value)(_map_tensors(v, swap) for v in value)
    return value


def _keep(kept: list[torch.Tensor], tensor: torch.Tensor) -> torch.Tensor:
    kept.append(tensor)
    return tensor


class Op:
    """One collective of a step, as op retry keeps it: enough to issue it again, the same on
    every rank (:mod:`unbroken.worker.stepretry`). ``saved``: a copy of each tensor it reads
    (in-place ones included), taken before it was issued; ``ok``: it completed here."""

    __slots__ = ("args", "name", "ok", "outputs", "saved", "seq", "work")

    def __init__(
        self, seq: int, name: str, args: tuple[Any, ...], outputs: list[torch.Tensor]
    ) -> None:
        self.seq = seq
        self.name = name
        self.args = args
        self.outputs = outputs
        written = {id(t) for t in outputs}
        inputs: list[torch.Tensor] = []
        _map_tensors(args, lambda t: _keep(inputs, t))
        inputs = [t for t in inputs if id(t) not in written]
        self.saved = [(t, t.detach().clone()) for t in inputs]
        self.work: dist.Work | None = None
        self.ok = False

    def issue(self, group: dist.ProcessGroup, *, scratch: bool) -> dist.Work:
        """Issue the collective again on ``group`` from its saved inputs. ``scratch``: into
        tensors of its own (it completed here already, and the script may hold its outputs
        by now), so that peers that did not complete it get their results."""
        if not scratch:
            for tensor, saved in self.saved:
                tensor.copy_(saved)
            return getattr(group, self.name)(*self.args)  # type: ignore[no-any-return]
        copies = {id(t): saved.clone() for t, saved in self.saved}
        copies.update({id(t): torch.empty_like(t) for t in self.outputs})
        args = _map_tensors(self.args, lambda t: copies.get(id(t), t))
        return getattr(group, self.name)(*args)  # type: ignore[no-any-return]

    def settle(self) -> Exception | None:
        """Wait for the issued work; None if it completed (``ok``), else its error."""
        work, self.work = self.work, None
        if work is None:
            return None if self.ok else RuntimeError("no process group: its links were cut")
        try:
            work.wait()
        except Exception as e:
            return e.with_traceback(None)
        self.ok = True
        return None


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
        self,
        work: dist.Work,
        outputs: list[torch.Tensor],
        results: list[torch.Tensor],
        op: Op | None = None,
        group: StepGroup | None = None,
    ) -> None:
        super().__init__()
        self._work = work
        self._outputs = outputs
        self._results = results
        self._failed = False
        self._op = op  # op retry: the work is the op's (a repair issues it again)
        self._group = group

    def _swallow(self, error: Exception) -> None:
        if not is_peer_failure(error) or not _faults.active():
            raise error
        if not self._failed:
            self._failed = True
            _zero(self._outputs)
            _faults.report(error.with_traceback(None))

    def wait(self, timeout: timedelta | None = None) -> bool:
        op = self._op
        if op is not None:  # op retry: a repair waits for, or issues again, every op
            if not op.ok and not self._failed:
                error = op.settle()
                if error is not None:
                    if not is_peer_failure(error) or not _faults.active():
                        raise error
                    assert self._group is not None
                    if not _faults.repaired(error, self._group, op.name):
                        self._swallow(error)
            return True
        try:
            if timeout is None:
                self._work.wait()
            else:
                self._work.wait(timeout)
        except Exception as e:
            self._swallow(e)
        return True

    def is_completed(self) -> bool:
        if self._op is not None and (self._op.ok or self._op.work is None):
            return True
        return self._failed or bool(self._work.is_completed())

    def is_success(self) -> bool:
        if self._op is not None and self._op.ok:
            return True
        return not self._failed and bool(self._work.is_success())

    def exception(self) -> Any:
        return None

    def result(self) -> list[torch.Tensor]:
        return self._results

    def synchronize(self) -> None:
        if self._op is not None:
            self.wait()
            return
        try:
            self._work.synchronize()
        except Exception as e:
            self._swallow(e)

    def get_future(self) -> torch.futures.Future[list[torch.Tensor]]:
        results = self._results
        if self._op is not None:  # op retry: a repair runs on the caller's thread, not gloo's
            self.wait()
            done: torch.futures.Future[list[torch.Tensor]] = torch.futures.Future()
            done.set_result(results)
            return done

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

    def __init__(
        self, inner: dist.ProcessGroup, rank: int, size: int, links: OpenedLinks | None = None
    ) -> None:
        super().__init__(rank, size)  # type: ignore[call-arg]  # Python groups: no store
        self._inner: dist.ProcessGroup | None = inner
        self._links = links  # the real group's connections (op retry cuts them)
        self._rank = rank
        self._size = size
        self._name: GroupName = ""  # type: ignore[assignment]  # named when registered
        #: Op retry: the collectives issued on this group since it was made (the same count
        #: on every member), and those of the current step.
        self.seq = 0
        self.log: list[Op] = []
        self.left = False  # released for good (the rank left it)
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
        goes; an NCCL communicator is aborted), so peers blocked with this rank fail at once;
        collectives fail from now on."""
        if self._inner is not None:
            torchapi.abort_group(self._inner)
        self._inner = None
        self.left = True
        self.log.clear()

    def cut(self) -> None:
        """Shut the real group's links down (every collective waiting on them fails at once,
        here and at the peers) and let go of it."""
        if self._links is not None:
            self._links.cut()
        if self._inner is not None:
            torchapi.abort_group(self._inner)
        self._inner, self._links = None, None

    def rebuild(self, store: torchapi.Store, timeout: timedelta) -> None:
        """A new real group of the same ranks over ``store`` (collective over its members)."""
        self._inner, self._links = _plain(store, self._rank, self._size, timeout)

    def global_ranks(self) -> list[int]:
        """The job's ranks of this group's members, in group-rank order."""
        return list(dist.get_process_group_ranks(self))

    @property
    def inner(self) -> dist.ProcessGroup | None:
        return self._inner

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
        self.seq += 1
        if _faults.failed():
            _zero(outputs)
            return _DoneWork(results)
        if _faults.repairer is not None and _faults.active():
            return self._run_kept(Op(self.seq, name, args, outputs), results)
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

    def _run_kept(self, op: Op, results: list[torch.Tensor]) -> dist.Work:
        """Op retry: issue ``op`` and keep it for the step, to be issued again by a repair."""
        self.log.append(op)
        try:
            if self._inner is None:
                raise RuntimeError("no process group: this rank left it")
            op.work = getattr(self._inner, op.name)(*op.args)
        except Exception as e:
            if not is_peer_failure(e):
                self.log.pop()
                raise
            if not _faults.repaired(e.with_traceback(None), self, op.name):
                _zero(op.outputs)
                _faults.report(e.with_traceback(None))
                return _DoneWork(results)
        return _StepWork(_DoneWork(results), op.outputs, results, op, self)

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


def _plain(
    store: torchapi.Store, rank: int, size: int, timeout: timedelta
) -> tuple[dist.ProcessGroup, OpenedLinks]:
    with OpenedLinks() as links:  # gloo connects its full mesh as the group is made
        group = torchapi.plain_group(store, rank, size, timeout, _inner_backends)
    return group, links


def _create(store: torchapi.Store, rank: int, size: int, timeout: timedelta) -> StepGroup:
    inner, links = _plain(store, rank, size, timeout)
    return StepGroup(inner, rank, size, links)


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


def use_repairer(repairer: Repairer | None) -> None:
    """Op retry for the step's collectives from now on (None: off)."""
    _faults.repairer = repairer


def live_groups() -> list[StepGroup]:
    """Every :class:`StepGroup` of this process that its rank has not left."""
    return [group for group in list(_groups) if not group.left]


def release_all() -> int:
    """Let go of every :class:`StepGroup`'s real group (see :meth:`StepGroup.release`):
    how a rank leaving its groups makes peers blocked with it fail at once."""
    released = 0
    for group in list(_groups):
        if not group.left:
            group.release()
            released += 1
    return released
