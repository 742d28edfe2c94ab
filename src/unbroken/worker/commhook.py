"""Gradient averaging for DDP that turns a failed collective into a failed step, not a crash.

:class:`GradSync` is a DDP communication hook (``ddp.register_comm_hook``). It all-reduces the
gradients over the process group the training session currently holds, averages them, and
when a collective fails (a peer died, or hung past the group's timeout) it records the failure,
zeroes the gradients and hands DDP completed futures, so ``loss.backward()`` returns normally.
The session then skips the optimizer update and repairs the step (see
:mod:`unbroken.worker.recovery`). torchft's hook asserts instead, taking healthy replicas down
when one peer dies mid-collective, which is the common case.

Bitwise reproducibility. DDP rebuilds its buckets after the first iteration of every process
(and after each change of its process group), so a rank that joined late has a different
bucket layout, or a different moment of rebuild, than the ranks that kept running. The
element-wise sum of a ring all-reduce depends on where an element sits in the reduced
buffer (the buffer is cut into per-rank chunks, and each chunk's sum starts at a different
rank), so all-reducing DDP's bucket buffers would make the result depend on the layout. This
hook instead all-reduces each parameter's gradient as its own tensor, in one fixed order (the
reverse of the parameter order, which is the order backward produces them in): the sum of every
element is then a function of the gradients alone, equal on every rank, in every run, whatever
the buckets are. Each bucket's collectives start as soon as the parameters before them in that
order are ready, so communication still overlaps the rest of backward; the futures complete
once the last bucket arrives.

DDP's own collectives are taken off the network: the hook moves DDP to a process group of this
rank alone, so its bucket-rebuild broadcast (and any other collective DDP would run on its
group) cannot fail and cannot disagree between ranks that started at different times. That
is also why the session refuses configurations in which DDP would need its group for
correctness (``find_unused_parameters=True``, buffer broadcasts before each forward).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import GradBucket
from torch.nn.parallel import DistributedDataParallel

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SyncFailure:
    """A gradient collective that failed: when, and what the backend said."""

    reason: str
    at: float  # time.time()


def unsupported_reason(ddp: DistributedDataParallel) -> str | None:
    """Why this DDP module cannot have its gradients averaged by :class:`GradSync` (None: it
    can)."""
    if ddp.find_unused_parameters:
        return (
            "DDP was built with find_unused_parameters=True, which all-reduces a map of used "
            "parameters over DDP's own process group in every backward; build it with "
            "find_unused_parameters=False"
        )
    if ddp.will_sync_module_buffers():  # type: ignore[no-untyped-call]
        return (
            "DDP broadcasts the module's buffers from rank 0 before every forward over its own "
            "process group; build it with broadcast_buffers=False"
        )
    if ddp.mixed_precision is not None or getattr(ddp, "_delay_all_reduce_all_params", False):
        return "DDP runs its own gradient hook (mixed precision or delayed all-reduce)"
    if not ddp.require_backward_grad_sync:
        return "DDP's gradient synchronisation is switched off"
    return None


class GradSync:
    """The comm hook's state: which group to use, and whether this step's collectives failed.

    Create it with :meth:`install`. Call :meth:`begin_step` at the start of every training
    step, and :meth:`attach` after the session replaced its process group.
    """

    def __init__(self, ddp: DistributedDataParallel, group: dist.ProcessGroup) -> None:
        self.ddp = ddp
        params: list[torch.nn.Parameter] = ddp._build_params_for_reducer()[0]  # type: ignore[no-untyped-call]
        self._index = {id(p): i for i, p in enumerate(params)}
        self._count = len(params)
        self.group: dist.ProcessGroup | None = group
        self.world_size = group.size()
        self.failure: SyncFailure | None = None
        self._reset_round()

    @classmethod
    def install(cls, ddp: DistributedDataParallel, group: dist.ProcessGroup) -> GradSync:
        """Register the hook on ``ddp`` and move DDP's own collectives to a one-rank group."""
        reason = unsupported_reason(ddp)
        if reason is not None:
            raise ValueError(reason)
        sync = cls(ddp, group)
        ddp.register_comm_hook(sync, _allreduce_hook)
        sync.attach(group)
        return sync

    def attach(self, group: dist.ProcessGroup) -> None:
        """Average over ``group`` from now on (after the process group was replaced)."""
        self.group = group
        self.world_size = group.size()
        solo = dist.new_group(
            ranks=[dist.get_rank()], backend="gloo", use_local_synchronization=True
        )
        # DDP keeps its process group only for its own collectives (bucket rebuild, used-map
        # and buffer syncs), none of which this configuration needs across ranks.
        self.ddp._update_process_group(solo)  # type: ignore[no-untyped-call]
        self._reset_round()

    def detach(self) -> None:
        """Let go of the process group (a gloo group closes its connections only when the
        last reference to it is gone): peers blocked in a collective with this rank then fail
        at once. Collectives fail until :meth:`attach`."""
        self.group = None
        self._reset_round()

    def begin_step(self) -> None:
        """Forget the previous step's failure and any round a raised exception cut short."""
        self.failure = None
        self._reset_round()

    def _reset_round(self) -> None:
        self._pending: list[tuple[torch.futures.Future[torch.Tensor], GradBucket]] = []
        self._ready: dict[int, torch.Tensor] = {}
        self._next = 0  # position in the fixed order of the next gradient to reduce
        self._works: list[tuple[dist.Work, torch.Tensor]] = []

    def _launch_ready(self) -> None:
        # Fixed order: parameter indices from last to first.
        while self._next < self._count:
            index = self._count - 1 - self._next
            grad = self._ready.get(index)
            if grad is None:
                return
            if self.group is None:
                raise RuntimeError("no process group: this rank left it")
            work = dist.all_reduce(grad, group=self.group, async_op=True)
            assert work is not None
            self._works.append((work, grad))
            self._next += 1

    def _on_bucket(self, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
        future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        self._pending.append((future, bucket))
        if self.failure is None:
            try:
                for param, grad in zip(bucket.parameters(), bucket.gradients(), strict=True):
                    self._ready[self._index[id(param)]] = grad
                self._launch_ready()
                if bucket.is_last():
                    if self._next < self._count:
                        raise RuntimeError(
                            f"{self._count - self._next} of {self._count} gradients never "
                            "reached the communication hook"
                        )
                    self._finish()
            except Exception as e:
                self._fail(e)
        if self.failure is not None:
            self._complete(zero=True)
        elif bucket.is_last():
            self._complete(zero=False)
        return future

    def _finish(self) -> None:
        works, self._works = self._works, []
        try:
            for work, _ in works:
                work.wait()
        except Exception:
            _drain(works)
            raise
        grads = [grad for _, grad in works]
        torch._foreach_div_(grads, float(self.world_size))

    def _fail(self, error: Exception) -> None:
        _drain(self._works)
        self._works = []
        reason = " ".join(str(error).split()) or type(error).__name__
        self.failure = SyncFailure(reason=f"{type(error).__name__}: {reason}", at=time.time())
        logger.warning("gradient all-reduce failed: %s", self.failure.reason)

    def _complete(self, *, zero: bool) -> None:
        pending, self._pending = self._pending, []
        for future, bucket in pending:
            buffer = bucket.buffer()
            if zero:
                buffer.zero_()
            future.set_result(buffer)
        if not zero:
            self._reset_round()


def _drain(works: list[tuple[dist.Work, torch.Tensor]]) -> None:
    """Wait for collectives still in flight after one failed: they write into the buckets."""
    for work, _ in works:
        try:
            work.wait()
        except Exception as e:
            logger.debug("collective after the failed one: %s", e)


def _allreduce_hook(state: GradSync, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
    return state._on_bucket(bucket)


# DDP checks a hook's annotations against the classes themselves, not against their names
# (which is all ``from __future__ import annotations`` leaves).
_allreduce_hook.__annotations__ = {
    "state": GradSync,
    "bucket": GradBucket,
    "return": torch.futures.Future[torch.Tensor],
}
