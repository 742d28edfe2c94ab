"""Gradient averaging for DDP that turns a failed collective into a failed step, not a crash.

:class:`GradSync` is a DDP communication hook (``ddp.register_comm_hook``). It all-reduces the
gradients over the process group the training session currently holds, averages them, and
when a collective fails (a peer died, or hung past the group's timeout) it records the failure,
zeroes the gradients and hands DDP completed futures, so ``loss.backward()`` returns normally.
The session then skips the optimizer update and repairs the step (see
:mod:`unbroken.worker.recovery`). torchft's hook asserts instead, taking healthy replicas down
when one peer dies mid-collective, which is the common case.

Bitwise reproducibility. The element-wise sum of a ring all-reduce depends on where an element
sits in the reduced buffer (the buffer is cut into per-rank chunks, and each chunk's sum starts
at a different rank; with three or more ranks the order of the additions differs), so every
rank must reduce the same layout, in every run. DDP normally rebuilds its buckets after the
first iteration of each process (and after a change of its process group): a replacement
process would reduce its first step in the construction-time layout while the survivors use the
rebuilt one. Two modes avoid that:

- *Fixed buckets* (``find_unused_parameters=True``, no ``static_graph``): DDP never rebuilds,
  so the construction-time layout, a pure function of the parameters and the bucket caps, is
  the same in every process for good. The hook all-reduces each bucket's flat buffer, as DDP
  itself does: no copies, no more collectives than plain DDP. This is the mode to use.
- *Per parameter* (any other configuration): each parameter's gradient is all-reduced as its
  own tensor, in one fixed order (the reverse of the parameter order, which is the order
  backward produces them in), starting as soon as the gradients before it in that order are
  ready. The result no longer depends on the buckets, at the price of one collective per
  parameter (on two CPU cores, about 20 % of a 60 ms step of the 2.4 M-parameter anchor
  workload).

DDP's own collectives are taken off the network: the hook moves DDP to a process group of this
rank alone, so its bucket-rebuild broadcast and its map of used parameters cannot fail and
cannot disagree between ranks that started at different times. The map of used parameters
therefore stays local: every rank must use the same parameters in a step (a parameter unused on
one rank but used on another would keep that rank's gradient unset). DDP's broadcast of the
module's buffers before each forward (``broadcast_buffers`` at its default) goes through a
buffer hook of :class:`GradSync` over the same group as the gradients, and fails the step the
same way. The session refuses DDP configurations that need DDP's own group for more (mixed
precision, delayed all-reduce).

*Op retry* (:mod:`unbroken.worker.opretry`, on when the job enables ``HCCL_OP_RETRY_ENABLE``
for the gradient group's level): the hook keeps a copy of every buffer (fixed buckets) or
gradient (per parameter) it all-reduces, and hands DDP its futures only at the last bucket,
after every all-reduce of the step succeeded, on the autograd thread; a failed one is
re-executed over a new group from the copies, and the step goes on. Without op retry none of
this runs: no copies, and the hot path is the one described above.
"""

from __future__ import annotations

import gc
import logging
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from unbroken.protocol.kinds import StepFailure
from unbroken.worker import devicetime, torchapi
from unbroken.worker.failure import SyncFailure, is_sticky
from unbroken.worker.opretry import OpRetrier, wait_all
from unbroken.worker.torchapi import GradBucket, ProcessGroupGloo

logger = logging.getLogger(__name__)


def unsupported_reason(ddp: DistributedDataParallel) -> str | None:
    """Why this DDP module cannot have its gradients averaged by :class:`GradSync` (None: it
    can)."""
    if ddp.mixed_precision is not None or torchapi.ddp_delays_all_reduce(ddp):
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
        params = torchapi.ddp_parameters(ddp)
        self._index = {id(p): i for i, p in enumerate(params)}
        self._count = len(params)
        self.group: dist.ProcessGroup | None = group
        self.world_size = group.size()
        self.failure: SyncFailure | None = None
        #: Whether DDP's bucket layout never changes (see the module doc).
        self.fixed_buckets = bool(ddp.find_unused_parameters and not ddp.static_graph)
        #: Re-executes a failed all-reduce (None: op retry is off).
        self.op_retry: OpRetrier | None = None
        #: With op retry: the hook's own gradient group (see :mod:`unbroken.worker.opretry`).
        self.own: ProcessGroupGloo | None = None
        self.step = -1
        #: When backward handed this step's last bucket (``time.monotonic()``; 0.0: not yet):
        #: the rank's own compute of the step ends there, and what follows is waiting for its
        #: peers' gradients. A straggler's comes late (:mod:`unbroken.policy.straggler`).
        self.backward_done_at = 0.0
        #: When this step's gradient collectives were all done (``time.monotonic()``; 0.0: not
        #: yet): from ``backward_done_at`` to here the rank waited on the network alone, the
        #: part of the communication no compute hides (slow on a slow network plane).
        self.grads_done_at = 0.0
        self._reset_round()

    @classmethod
    def install(cls, ddp: DistributedDataParallel, group: dist.ProcessGroup) -> GradSync:
        """Register the hook on ``ddp`` and move DDP's own collectives to a one-rank group."""
        reason = unsupported_reason(ddp)
        if reason is not None:
            raise ValueError(reason)
        sync = cls(ddp, group)
        ddp.register_comm_hook(sync, _allreduce_hook)
        if ddp.will_sync_module_buffers():  # type: ignore[no-untyped-call]
            torchapi.ddp_register_buffer_hook(ddp, sync, _broadcast_buffers_hook)
        sync.attach(group)
        return sync

    def broadcast_buffers(self, buffers: list[torch.Tensor]) -> None:
        """DDP's buffer sync before a forward: rank 0's buffers to every rank, over the group
        the hook reduces over; a failure fails the step, like a failed gradient collective."""
        if self.failure is not None or not buffers:
            return
        try:
            if self.own is not None:
                for buffer in buffers:
                    torchapi.gloo_broadcast(self.own, buffer).wait()
            elif self.group is None:
                raise RuntimeError("no process group: this rank left it")
            else:
                torchapi.broadcast_coalesced(self.group, buffers, self.ddp.broadcast_bucket_size)
        except Exception as e:
            self._fail(e)

    def attach(self, group: dist.ProcessGroup) -> None:
        """Average over ``group`` from now on (after the process group was replaced)."""
        self.group = group
        self.world_size = group.size()
        solo = dist.new_group(
            ranks=[dist.get_rank()], backend="gloo", use_local_synchronization=True
        )
        # DDP keeps its process group only for its own collectives (bucket rebuild, used-map
        # and buffer syncs), none of which this configuration needs across ranks.
        torchapi.ddp_use_process_group(self.ddp, solo)
        self._reset_round()

    def use_op_retry(self, retrier: OpRetrier, generation: int) -> None:
        """Re-execute failed all-reduces from now on, over a group of the hook's own
        (collective: every rank calls it, after every :meth:`attach` too)."""
        self.op_retry = retrier
        self.own = None
        gc.collect()
        self.own = retrier.group(generation, "0")

    def barrier(self) -> None:
        """A barrier over the group the hook reduces over (an op retry replaced it)."""
        if self.own is not None:
            torchapi.gloo_barrier(self.own).wait()
        else:
            dist.barrier(group=self.group)

    def all_gather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        """All-gather ``tensor`` over the group the hook reduces over (an op retry replaced
        it): what the session's agreement check runs on."""
        gathered = [torch.empty_like(tensor) for _ in range(self.world_size)]
        if self.own is not None:
            torchapi.gloo_allgather(self.own, gathered, tensor).wait()
        elif self.group is None:
            raise RuntimeError("no process group: this rank left it")
        else:
            dist.all_gather(gathered, tensor, group=self.group)
        return gathered

    def detach(self) -> None:
        """Let go of the process group (a gloo group closes its connections only when the
        last reference to it is gone): peers blocked in a collective with this rank then fail
        at once. Collectives fail until :meth:`attach`."""
        self.group = None
        self.own = None
        self._reset_round()

    def begin_step(self, step: int = -1) -> None:
        """Forget the previous step's failure and any round a raised exception cut short."""
        self.failure = None
        self.step = step
        self.backward_done_at = 0.0
        self.grads_done_at = 0.0
        self._reset_round()

    def _reset_round(self) -> None:
        self._pending: list[tuple[torch.futures.Future[torch.Tensor], GradBucket]] = []
        self._ready: dict[int, torch.Tensor] = {}
        self._next = 0  # position in the fixed order of the next gradient to reduce
        self._works: list[tuple[dist.Work, torch.Tensor]] = []
        # Op retry only: each reduced tensor with a copy of its input, in launch order, and
        # the first error of launching one.
        self._saved: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._launch_error: Exception | None = None

    def _launch_ready(self) -> None:
        # Fixed order: parameter indices from last to first.
        while self._next < self._count:
            index = self._count - 1 - self._next
            grad = self._ready.get(index)
            if grad is None:
                return
            self._next += 1
            if self.op_retry is not None:
                self._launch_saved(grad)
                continue
            if self.group is None:
                raise RuntimeError("no process group: this rank left it")
            work = dist.all_reduce(grad, group=self.group, async_op=True)
            assert work is not None
            self._works.append((work, grad))

    def _launch_saved(self, tensor: torch.Tensor) -> None:
        """Op retry: keep a copy of the input, then all-reduce (once a launch failed, the
        rest waits for the re-execution)."""
        self._saved.append((tensor, tensor.clone()))
        if self._launch_error is not None:
            return
        try:
            if self.own is None:
                raise RuntimeError("no process group: this rank left it")
            work = torchapi.gloo_allreduce(self.own, tensor)
        except Exception as e:
            self._launch_error = e.with_traceback(None)
        else:
            self._works.append((work, tensor))

    def _on_bucket(self, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
        if bucket.is_last():
            self.backward_done_at = time.monotonic()
            devicetime.mark()  # and on the device, where the rank trains on a GPU
        if self.op_retry is not None:
            return self._reduce_retrying(bucket)
        if self.fixed_buckets:
            return self._reduce_buffer(bucket)
        return self._reduce_parameters(bucket)

    def _reduce_buffer(self, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
        buffer = bucket.buffer()
        if self.failure is None:
            try:
                if self.group is None:
                    raise RuntimeError("no process group: this rank left it")
                work = dist.all_reduce(buffer, group=self.group, async_op=True)
                assert work is not None
            except Exception as e:
                self._fail(e)
            else:
                world_size = float(self.world_size)

                def average(done: torch.futures.Future[list[torch.Tensor]]) -> torch.Tensor:
                    try:
                        done.wait()
                    except Exception as e:  # runs on the backend's thread: must not raise
                        self._fail(e)
                        return buffer.zero_()
                    self.grads_done_at = max(self.grads_done_at, time.monotonic())
                    return buffer.div_(world_size)

                averaged: torch.futures.Future[torch.Tensor] = work.get_future().then(average)
                return averaged
        future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        future.set_result(buffer.zero_())
        return future

    def _reduce_parameters(self, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
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
                    self.grads_done_at = time.monotonic()
            except Exception as e:
                self._fail(e)
        if self.failure is not None:
            self._complete(zero=True)
        elif bucket.is_last():
            self._complete(zero=False)
        return future

    def _reduce_retrying(self, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
        """Op retry: launch now, complete every future at the last bucket, once the step's
        all-reduces succeeded (re-executed if one failed)."""
        future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        self._pending.append((future, bucket))
        if self.failure is None:
            try:
                if self.fixed_buckets:
                    self._launch_saved(bucket.buffer())
                else:
                    for param, grad in zip(bucket.parameters(), bucket.gradients(), strict=True):
                        self._ready[self._index[id(param)]] = grad
                    self._launch_ready()
                if bucket.is_last():
                    if not self.fixed_buckets and self._next < self._count:
                        raise RuntimeError(
                            f"{self._count - self._next} of {self._count} gradients never "
                            "reached the communication hook"
                        )
                    self._finish_retrying()
                    self.grads_done_at = time.monotonic()
            except Exception as e:
                self._fail(e)
        if self.failure is not None:
            self._complete(zero=True)
        elif bucket.is_last():
            self._complete(zero=False)
        return future

    def _finish_retrying(self) -> None:
        assert self.op_retry is not None
        # Wait for every one (they all write into the buffers), keeping no reference to a
        # work: each holds its group, whose links must close when the hook drops it.
        error = wait_all([work for work, _ in self._works]) or self._launch_error
        self._works = []
        saved, self._saved = self._saved, []
        tensors = [tensor for tensor, _ in saved]
        if error is not None:
            self._launch_error = None
            self.own = None  # the broken group's links close with its last reference
            self.own = self.op_retry.reexecute(
                tensors, [copy for _, copy in saved], error, self.step
            )
        torchapi.foreach_div_(tensors, float(self.world_size))

    def _finish(self) -> None:
        works, self._works = self._works, []
        try:
            for work, _ in works:
                work.wait()
        except Exception:
            _drain(works)
            raise
        grads = [grad for _, grad in works]
        torchapi.foreach_div_(grads, float(self.world_size))

    def fail_step(self, error: Exception) -> None:
        """Fail this step from outside the collectives (a device error found before them):
        this rank shares no gradient and skips its update. The failure's kind comes from
        ``error`` (:mod:`unbroken.worker.failure`). A sticky device error is raised again: this
        process cannot redo the step, a new one must (:func:`.failure.is_sticky`)."""
        if is_sticky(error):
            raise error
        self._fail(error)

    def _fail(self, error: Exception) -> None:
        _drain(self._works)
        self._works = []
        if self.failure is not None:  # the first failure of the step is the one to report
            logger.debug("another gradient all-reduce failed: %s", error)
            return
        self.failure = SyncFailure.of(error, StepFailure.COLLECTIVE)
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


def _broadcast_buffers_hook(state: GradSync, buffers: dict[str, torch.Tensor]) -> None:
    state.broadcast_buffers(list(buffers.values()))


# DDP checks a hook's annotations against the classes themselves, not against their names
# (which is all ``from __future__ import annotations`` leaves).
_allreduce_hook.__annotations__ = {
    "state": GradSync,
    "bucket": GradBucket,
    "return": torch.futures.Future[torch.Tensor],
}
