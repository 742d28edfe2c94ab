"""The training session of a MindSpore rank: the lines a MindSpore script adds to resume,
checkpoint, report, and ride through a step's device memory or link error.

::

    import mindspore as ms
    from mindspore.communication import init as init_comm
    import unbroken.mindspore as ub

    init_comm()                                   # the dynamic cluster msrun (or Unbroken) set up
    session = ub.init(network, optimizer, ckpt_dir="ckpt", ckpt_every=50, seed=1234)
    grad_fn = ms.value_and_grad(forward, None, optimizer.parameters)
    for step in session.steps(total_steps):       # starts at the restored step
        loss, grads = grad_fn(*batch(step, session.rank))
        session.apply(grads, clip_norm=1.0)       # mean over the ranks, clip, optimizer step
    session.close()

:func:`init` restores every parameter of the network and the optimizer (moments, step count,
learning rate) and the step from the newest good checkpoint (:mod:`unbroken.mindspore.checkpoint`).
:meth:`Session.steps` yields step indices from there; between two iterations it commits the
finished step, saves every ``ckpt_every`` commits, and honours a stop request (SIGTERM).
With ``seed=...`` MindSpore's global seed is set from (seed, rank, step) at the start of every
step; a random primitive that keeps its own counter (``nn.Dropout``) still draws anew when a step
is redone, so a recovered run equals a fault-free one only without such primitives.

The gradients are averaged by MindSpore's own collective (``AllReduce`` over the dynamic
cluster's world group) in :meth:`Session.apply`, which first agrees with the other ranks, in one
small all-reduce, whether any rank's step failed. ``MS_ENABLE_TFT`` decides what a failure does:

- ``UCE:1``, a device memory error (a corrupt parameter): every rank leaves the step's update
  out, the corrupt rank takes every parameter from the lowest healthy rank (an all-reduce to
  which only that rank contributes, so the copy is exact), and the step is redone on every rank;
- ``HCCE:1``, a link error of the step's collective: the step is left out and redone;
- otherwise the error ends the process (the job manager restarts the ranks: ``RSC``); with
  ``TTP:1`` and a state the error did not touch (not a memory error, not in the optimizer
  update), the rank first writes *last words*: the committed state as a checkpoint. When a
  peer dies, a healthy rank writes them (stopped at a boundary, or once its all-reduce gives
  up); the first to claim the step writes, the others exit, no committed step lost.

Every rank resumes at the same step: the newest good checkpoint any rank found (one all-reduce).

Not here: a MindSpore rank cannot join a new communicator in a live process (MindSpore's
dynamic-cluster recovery runs on GPUs in graph mode only), so the rungs that keep healthy
processes (``ARF``, elastic training) are off for these ranks (their heartbeat says so): every
rank restarts, from the newest checkpoint or the last words.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, NoReturn

from unbroken.checkpoint.manifest import step_dir
from unbroken.mindspore import checkpoint
from unbroken.mindspore.codec import (
    as_float32,
    found_steps_got,
    found_steps_sent,
    from_float32,
    params_digest,
    replicas_apart,
)
from unbroken.mindspore.data import Batches
from unbroken.mindspore.registered import Registered
from unbroken.protocol.exitreport import ExitReport, write_exit_report
from unbroken.protocol.kinds import StepFailure
from unbroken.spec.envknobs import (
    KnobSyntaxError,
    TftSwitch,
    ms_comm_op_timeout_s,
    parse_ms_enable_tft,
)
from unbroken.worker.chaosentries import ChaosEntry, claim, entries_from_env
from unbroken.worker.env import WorkerEnv, process_started_at
from unbroken.worker.failure import DeviceMemoryError, device_code
from unbroken.worker.heartbeat import HeartbeatWriter, Phase
from unbroken.worker.stop import STOP_EXIT_CODE, StopSignal

logger = logging.getLogger(__name__)

_EWMA_WEIGHT = 0.2
_STOP_BASE_S = 5.0
#: What a stop request's deadline adds for last words (the agent's grace is longer).
_LAST_WORDS_S = 30.0
#: The fault code of an uncorrectable device memory error (unbroken/faults/codes.yaml).
MEMORY_ERROR_CODE = "80E01801"
#: What a failed step's agreement carries, per rank: [memory error, link error].
_MEMORY, _LINK = 0, 1


class TrainingStopped(SystemExit):
    """Raised from :meth:`Session.steps` at the step boundary after a stop request (SIGTERM):
    the process ends with ``STOP_EXIT_CODE`` and no traceback."""

    def __init__(self, committed: int) -> None:
        super().__init__(STOP_EXIT_CODE)
        self.committed = committed


class ReplicasDiverged(RuntimeError):
    """The data-parallel ranks' states differ where they must be equal."""


class LinkError(RuntimeError):
    """The step's collective failed on this rank's link (the seed's HCCE)."""


def _world() -> tuple[int, int]:
    """(rank, world size) of MindSpore's world group; (env rank, env size) before
    ``mindspore.communication.init``."""
    try:
        from mindspore.communication import get_group_size, get_rank

        return int(get_rank()), int(get_group_size())
    except (RuntimeError, ValueError):
        env = WorkerEnv.from_environ(os.environ)
        return env.rank, env.world_size


def tracked_parameters(network: Any, optimizer: Any) -> dict[str, Any]:
    """Every parameter a checkpoint holds, by name: the network's (buffers too) and the
    optimizer's own (moments, step count, learning rate)."""
    params: dict[str, Any] = {}
    for p in network.get_parameters():
        params.setdefault(p.name, p)
    if optimizer is not None:
        for p in optimizer.get_parameters():
            params.setdefault(p.name, p)
    return params


def state_digest(network: Any, optimizer: Any = None) -> str:
    """sha256 over every tracked parameter's name, dtype, shape and bytes, in name order: equal
    digests mean bitwise-equal states."""
    return params_digest(tracked_parameters(network, optimizer)).hex()


class Session:
    """One MindSpore rank's session; create it with :func:`init`."""

    def __init__(
        self,
        network: Any,
        optimizer: Any,
        *,
        env: WorkerEnv,
        ckpt_dir: Path | None,
        ckpt_every: int,
        seed: int | None,
        keep: int,
        switches: dict[TftSwitch, bool],
        heartbeat: HeartbeatWriter | None,
        state: Mapping[str, Any] | None = None,
        data: Any = None,
    ) -> None:
        import mindspore as ms
        from mindspore import ops

        self._ms = ms
        self.network = network
        self.optimizer = optimizer
        self.env = env
        self.ckpt_dir = ckpt_dir
        self.ckpt_every = ckpt_every
        self.seed = seed
        self.keep = keep
        self.switches = switches
        self.heartbeat = heartbeat
        self.rank, self.world_size = _world()
        self.params = tracked_parameters(network, optimizer)
        self.state = Registered(state)
        self._batches: Batches | None = None
        if data is not None:
            import mindspore.dataset as ds

            self._batches = Batches(data, seed if seed is not None else ds.config.get_seed())
        self.restored: checkpoint.Restored | None = None
        self.start_step = 0
        self.recoveries = 0  # steps redone after a memory or link error
        self._redone = 0  # of those, the ones this rank's own failure caused
        self._committed = 0
        self._allreduce = ops.AllReduce(ops.ReduceOp.SUM) if self.world_size > 1 else None
        self._failure: tuple[int, Exception] | None = None  # this step's, before its agreement
        self._redo = False  # the step failed somewhere: its update was left out, redo it
        self._updating = False
        self._corrupt = False
        self._step = -1
        self._step_began = 0.0
        self._step_time_s = 0.0
        self._first_commit = True
        self._closed = False
        entries, fired = entries_from_env(self.rank, os.environ) if env.managed else ((), None)
        self._chaos: dict[int, list[ChaosEntry]] = {}
        for e in entries:
            self._chaos.setdefault(e.at_step, []).append(e)
        self._fired_dir = fired
        self._writing = False  # this rank is writing last words
        self._stop = StopSignal(self._on_stop_request, self._stop_deadline_s, self._needed)
        self._previous_excepthook = sys.excepthook

    # -- properties ---------------------------------------------------------------------------

    @property
    def committed(self) -> int:
        """Steps committed so far (restored ones included) = the index of the next step."""
        return self._committed

    @property
    def managed(self) -> bool:
        return self.env.managed

    @property
    def data_position(self) -> list[int] | None:
        """``[epoch, batches into the epoch]`` of the committed step's data (None without
        ``data=``)."""
        return self._batches.committed_position if self._batches is not None else None

    @property
    def stop_requested(self) -> bool:
        return self._stop.requested

    def request_stop(self) -> None:
        """Stop at the next step boundary, as SIGTERM does (without its deadline)."""
        self._stop.request()

    def batch(self) -> Any:
        """The next batch of ``data=``: an endless stream across epochs, the same batches
        again when a step is redone (:mod:`unbroken.mindspore.data`)."""
        if self._batches is None:
            raise RuntimeError("no data was given to unbroken.mindspore.init(data=...)")
        return self._batches.next()

    # -- what a checkpoint holds besides the parameters -------------------------------------

    def _extra(self) -> dict[str, Any]:
        """What a checkpoint of the committed state holds besides the parameters."""
        extra: dict[str, Any] = {"step": self._committed, "world_size": self.world_size}
        if self._batches is not None:
            extra["data"] = self._batches.committed_position
        if self.state:
            extra["state"] = self.state.committed
        return extra

    def _restore_extra(self, restored: checkpoint.Restored) -> None:
        """The data position and the registered state of a restored checkpoint."""
        extra = restored.extra
        if self._batches is not None:
            if "data" not in extra:
                raise checkpoint.CheckpointError(
                    f"checkpoint {restored.path} holds no data position: it was written by a "
                    "run without data=, so where this one's data resumes is unknown"
                )
            self._batches.load(extra["data"])
        saved = extra.get("state", {})
        missing = self.state.missing_from(saved)
        if missing:
            raise checkpoint.CheckpointError(
                f"checkpoint {restored.path} holds no state {', '.join(map(repr, missing))}: "
                "it was written by a run that did not register it"
            )
        self.state.load(saved)

    # -- start ---------------------------------------------------------------------------------

    def _start(self) -> None:
        if self.managed:
            self._stop.install()
            sys.excepthook = self._excepthook
        try:
            if self.ckpt_dir is not None:
                self.restored = checkpoint.load_latest(self.ckpt_dir, self.params)
                self._agree_on_restored(self.ckpt_dir)
            if self.restored is not None:
                self._restore_extra(self.restored)
                self._committed = self.restored.step
                logger.warning(
                    "rank %d: resumed at step %d from %s",
                    self.rank,
                    self._committed,
                    self.restored.path,
                )
            self.start_step = self._committed
            if self.heartbeat is not None:
                ckpt_step = self.restored.step if self.restored else -1
                self.heartbeat.update(
                    phase=Phase.STATE_LOADED,
                    state_loaded_at=time.time(),
                    start_step=self._committed,
                    committed=self._committed,
                    ckpt_step=ckpt_step,
                    comm_ready_at=time.time(),
                )
        except BaseException:
            self._fail()
            raise

    def _agree_on_restored(self, root: Path) -> None:
        """Every rank resumes at the same step: the newest good checkpoint any rank found (the
        ranks tell each other in one all-reduce); a rank that found an older one loads that
        step. Then rank 0 clears what earlier processes left (last words' claims, saves that
        never finished): every one of them has ended before this cluster was built."""
        if self._allreduce is not None:
            found = self.restored.step if self.restored is not None else None
            mine = found_steps_sent(found, self.rank, self.world_size)
            steps = found_steps_got(self._allreduce(self._ms.Tensor(mine)).asnumpy())
            newest = max((s for s in steps if s is not None), default=None)
            if newest is not None and found != newest:
                logger.warning(
                    "rank %d: rank %d found step %d, newer than this rank's %s: loading it",
                    self.rank,
                    steps.index(newest),
                    newest,
                    "none" if found is None else found,
                )
                self.restored = checkpoint.load_latest(root, self.params, step=newest)
        if self.rank == 0:
            checkpoint.clear_leftovers(root)

    # -- the loop ------------------------------------------------------------------------------

    def steps(self, total: int) -> Iterator[int]:
        """Yield the step indices from the restored step to ``total`` - 1; a step left out
        after a failure is yielded again."""
        try:
            step = self._committed
            while step < total:
                if self._stop.requested:
                    self._leave()
                self._begin(step)
                yield step
                if self._failure is not None:
                    # The body never reached apply(): the failure is this rank's alone.
                    _, error = self._failure
                    raise error
                if self._redo:
                    self._redo = False
                    continue
                self._commit(step)
                if self.ckpt_every and self._committed % self.ckpt_every == 0:
                    self.save_checkpoint()
                step += 1
            if self._stop.requested:
                self._leave()
        except (GeneratorExit, TrainingStopped):
            raise
        except BaseException as e:
            self._report_exit(type(e), e)  # the loop is over: say why before the record closes
            self._fail()
            raise

    def _begin(self, step: int) -> None:
        self._step = step
        self._failure = None
        if self._batches is not None:
            self._batches.begin_step()
        if self.seed is not None:
            self._ms.set_seed(_step_seed(self.seed, self.rank, step))
        self._fire_chaos(step)
        self._step_began = time.monotonic()
        if self.heartbeat is not None:
            if self._first_commit:
                self.heartbeat.update(phase=Phase.TRAINING, step=step, step_at=time.time())
            else:
                self.heartbeat.update(step=step, step_at=time.time())

    def apply(self, grads: Sequence[Any], *, clip_norm: float | None = None) -> bool:
        """The step's update: average ``grads`` over the ranks, agreeing on failures in the same
        all-reduce, clip them to ``clip_norm`` (global norm), run the optimizer. False when the
        step was left out (it is redone)."""
        from mindspore import ops

        if self._stop.requested:  # a peer may be gone: leave before its collective blocks
            self._leave()  # the step's gradients are dropped; the committed state is whole
        if self._failure is not None:
            kind, error = self._failure
            if not self._retries(kind):
                raise error
        grads, failed = self._reduce(tuple(grads))
        if failed is not None:
            self._recover(failed)
            return False
        if clip_norm is not None:
            grads = ops.clip_by_global_norm(grads, clip_norm)
        self._updating = True
        self.optimizer(grads)
        self._updating = False
        return True

    def _retries(self, kind: int) -> bool:
        switch = TftSwitch.UCE if kind == _MEMORY else TftSwitch.HCCE
        return self.switches.get(switch, False)

    def _reduce(
        self, grads: tuple[Any, ...]
    ) -> tuple[tuple[Any, ...], tuple[list[int], list[int]] | None]:
        """The mean of ``grads`` over the ranks and every rank's failure of this step (None:
        none), in one all-reduce of the flattened gradients followed by a [memory, link] flag
        per rank (a collective per tensor costs more than the arithmetic at this size)."""
        import numpy as np
        from mindspore import ops

        world = self.world_size
        flags = np.zeros((2, world), np.float32)
        if self._failure is not None:
            flags[self._failure[0], self.rank] = 1.0
        if self._allreduce is not None and grads:
            dtype = grads[0].dtype
            flat = ops.cat([g.reshape(-1) for g in grads] + [self._ms.Tensor(flags.reshape(-1))])
            summed = self._allreduce(flat.astype(dtype))
            flags = summed[-2 * world :].asnumpy().reshape(2, world)
            out, at = [], 0
            for g in grads:
                n = int(np.prod(g.shape))
                out.append((summed[at : at + n] / world).reshape(g.shape))
                at += n
            grads = tuple(out)
        memory = [r for r in range(world) if flags[_MEMORY, r] > 0]
        link = [r for r in range(world) if flags[_LINK, r] > 0]
        return grads, ((memory, link) if memory or link else None)

    def _recover(self, failed: tuple[list[int], list[int]]) -> None:
        """Leave the step's update out; a rank whose memory failed takes every parameter from
        the lowest healthy rank; the step is redone."""
        memory, link = failed
        if memory:
            healthy = [r for r in range(self.world_size) if r not in memory]
            if not healthy:
                raise DeviceMemoryError(
                    f"uncorrectable device memory error {MEMORY_ERROR_CODE} on every rank: "
                    "no replica to repair from"
                )
            self._copy_from(healthy[0], self.rank in memory)
        what = []
        if memory:
            what.append(f"device memory error on rank(s) {memory}")
        if link:
            what.append(f"link error on rank(s) {link}")
        self.recoveries += 1
        logger.warning(
            "rank %d: step %d left out and redone (%s)%s",
            self.rank,
            self._step,
            "; ".join(what),
            f"; parameters repaired from rank {min(set(range(self.world_size)) - set(memory))}"
            if self.rank in memory
            else "",
        )
        mine = self._failure
        self._failure = None
        self._corrupt = False
        self._redo = True
        if self._batches is not None:
            self._batches.redo()
        self.state.roll_back()
        if self.heartbeat is not None and mine is not None:
            # The rank whose step failed tells the job manager (it records the redone step).
            self._redone += 1
            failure = StepFailure.DEVICE_MEMORY if mine[0] == _MEMORY else StepFailure.COLLECTIVE
            self.heartbeat.update(failure=int(failure), recoveries=self._redone)

    def _copy_from(self, source: int, receive: bool) -> None:
        """Every tracked parameter from rank ``source``, in one all-reduce to which every other
        rank adds -0.0 (x + -0.0 = x for every float32, signed zeros included); only
        ``receive`` ranks keep the result. MindSpore's CPU all-reduce sums float32 and float16
        only, so every other dtype travels as its bytes, one float32 per byte (exact)."""
        import numpy as np
        from mindspore import ops

        ms = self._ms
        assert self._allreduce is not None
        params = sorted(self.params.items())
        parts = [as_float32(p.asnumpy()) for _, p in params]
        flat = np.concatenate(parts) if parts else np.zeros(0, np.float32)
        if self.rank != source:
            flat = np.full_like(flat, -0.0)
        got = self._allreduce(ms.Tensor(flat)).asnumpy()
        if not receive:
            return
        at = 0
        for (_, p), part in zip(params, parts, strict=True):
            data = p.asnumpy()
            # In place: set_data would give the Parameter a new tensor that the compiled step
            # and the optimizer never see (they go on with the old one).
            ops.assign(p, ms.Tensor(from_float32(got[at : at + part.size], data)))
            at += part.size

    def _commit(self, step: int) -> None:
        elapsed = time.monotonic() - self._step_began
        self._committed = step + 1
        if self._batches is not None:
            self._batches.commit()
        self.state.commit()
        if self._first_commit:
            self._step_time_s = elapsed
        else:
            self._step_time_s += _EWMA_WEIGHT * (elapsed - self._step_time_s)
        if self.heartbeat is not None:
            now = time.time()
            values: dict[str, Any] = {
                "committed": self._committed,
                "committed_at": now,
                "step_time_s": self._step_time_s,
            }
            if self._first_commit:
                values["first_commit_at"] = now
            self.heartbeat.update(**values)
        self._first_commit = False

    # -- faults injected by --chaos -----------------------------------------------------------

    def _fire_chaos(self, step: int) -> None:
        if self._fired_dir is None:
            return
        entry = next(
            (e for e in self._chaos.get(step, ()) if claim(self._fired_dir, e)),
            None,
        )
        if entry is None:
            return
        where = f"rank {self.rank} at step {step}"
        if entry.kind == "kill":
            import signal

            os.kill(os.getpid(), signal.SIGKILL)
        elif entry.kind == "memory":
            from mindspore import ops

            first = next(iter(self.network.get_parameters()))
            data = first.asnumpy().copy()
            data.reshape(-1)[0] = float("nan")
            ops.assign(first, self._ms.Tensor(data))  # in the memory training uses
            self._corrupt = True
            self._failure = (
                _MEMORY,
                DeviceMemoryError(
                    f"uncorrectable device memory error {MEMORY_ERROR_CODE} in {where} "
                    "(injected): parameter memory is corrupt"
                ),
            )
        elif entry.kind == "link":
            self._failure = (_LINK, LinkError(f"collective failed on the link of {where}"))
        elif entry.kind == "exception":
            raise RuntimeError(f"injected exception in {where}")
        else:
            logger.error("chaos kind %r is not one a MindSpore rank injects", entry.kind)

    # -- checkpoints and last words -----------------------------------------------------------

    def save_checkpoint(self) -> Path:
        """Save the committed state (rank 0 only: every rank holds the same), at a step
        boundary."""
        step = self._committed
        if self.ckpt_dir is None:
            raise RuntimeError("no checkpoint directory was given to unbroken.mindspore.init")
        if self.rank != 0:
            return step_dir(self.ckpt_dir, step)
        path = checkpoint.save(
            self.ckpt_dir, step, self.params, self._extra(), self.world_size, self.keep
        )
        if self.heartbeat is not None:
            self.heartbeat.update(ckpt_step=step, ckpt_at=time.time())
        return path

    def _last_words(self, error: BaseException | None) -> None:
        """TTP: the committed state as a checkpoint when the error left it whole (this rank's
        own error, or its step's collective failing because a peer died) or when the rank
        stops on request at a step boundary (``error`` None: the job manager restarts the
        ranks). Every rank that can tries; the first to claim the step writes
        (:func:`checkpoint.save_last_words`)."""
        if not self.switches.get(TftSwitch.TTP) or self.ckpt_dir is None:
            return
        if self.heartbeat is not None:  # acting on the failure: the agent waits for it
            now = time.time()
            self.heartbeat.update(phase=Phase.STOPPING, failed_step=self._step, failed_at=now)
        if self._updating or self._corrupt or isinstance(error, DeviceMemoryError):
            logger.error(
                "rank %d: no last words: %s",
                self.rank,
                "the optimizer update was under way"
                if self._updating
                else "its parameters are corrupt",
            )
            if self.heartbeat is not None:
                self.heartbeat.update(dump_failed_at=time.time())
            return
        self._writing = True
        try:
            path = checkpoint.save_last_words(
                self.ckpt_dir,
                self._committed,
                self.params,
                self._extra(),
                self.world_size,
                self.keep,
            )
        except Exception as e:  # a failed write must not hide the error that ended the rank
            logger.error("rank %d: no last words: writing them failed: %s", self.rank, e)
            if self.heartbeat is not None:
                self.heartbeat.update(dump_failed_at=time.time())
            return
        if path is None:
            logger.warning(
                "rank %d: last words of step %d left to the rank that claimed them",
                self.rank,
                self._committed,
            )
            return
        logger.warning(
            "rank %d: last words of step %d written to %s", self.rank, self._committed, path
        )
        if self.heartbeat is not None:
            self.heartbeat.update(dumped_step=self._committed, dumped_at=time.time())

    # -- stopping and closing -----------------------------------------------------------------

    def _stop_deadline_s(self) -> float:
        """A stop request's deadline; with last words on, time for them too (the step's
        collective may fail only after the request, a peer having died)."""
        last_words_s = 0.0
        if self.switches.get(TftSwitch.TTP):  # the collective gives up, then they are written
            last_words_s = ms_comm_op_timeout_s(os.environ) + _LAST_WORDS_S
        return _STOP_BASE_S + 3 * self._step_time_s + last_words_s

    def _needed(self) -> bool:
        """While a stop waits: False once another rank took the committed step's last words."""
        if not self.switches.get(TftSwitch.TTP) or self.ckpt_dir is None:
            return True
        taken = checkpoint.last_words_taken(self.ckpt_dir, self._committed)
        return self._writing or not taken  # read after the claim: set before it is made

    def _on_stop_request(self) -> None:
        if self.heartbeat is not None:
            self.heartbeat.update(phase=Phase.STOPPING)

    def _leave(self) -> NoReturn:
        logger.warning(
            "rank %d stopping on request after %d committed steps", self.rank, self._committed
        )
        self._last_words(None)
        self._shutdown(exiting=True)
        raise TrainingStopped(self._committed)

    def close(self) -> None:
        """End the session (collective: every rank calls it). The ranks first compare their
        states' digests: replicas that differ fail the job, loudly, rather than report a
        result that one rank's state alone would give (:class:`ReplicasDiverged`)."""
        if self._closed:
            return
        try:
            self._agree_on_state()
        except BaseException:
            self._fail()
            raise
        if self.heartbeat is not None:
            self.heartbeat.update(phase=Phase.DONE)
        self._shutdown()

    def _agree_on_state(self) -> None:
        if self._allreduce is None:
            return
        allreduce = self._allreduce

        def sums(sent: Any) -> Any:
            return allreduce(self._ms.Tensor(sent)).asnumpy()

        apart = replicas_apart(sums, self.params, self.rank, self.world_size)
        if apart is not None:
            ranks, names = apart
            raise ReplicasDiverged(
                f"rank {self.rank}: after {self._committed} steps the state of rank(s) "
                f"{ranks} differs from rank 0's in {', '.join(names) or '?'}: the replicas "
                "were not equal, so no rank's result can be trusted"
            )

    def _fail(self) -> None:
        if self.heartbeat is not None and not self._closed:
            self.heartbeat.update(phase=Phase.FAILED)
        self._shutdown()

    def _excepthook(
        self, exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None
    ) -> None:
        self._report_exit(exc_type, exc)
        self._fail()
        self._previous_excepthook(exc_type, exc, tb)

    def _report_exit(self, exc_type: type[BaseException], exc: BaseException) -> None:
        if self.heartbeat is None or self._closed:
            return
        self._last_words(exc)
        if isinstance(exc, DeviceMemoryError):
            failure, code = StepFailure.DEVICE_MEMORY, MEMORY_ERROR_CODE
        elif isinstance(exc, LinkError):
            failure, code = StepFailure.COLLECTIVE, ""
        else:
            failure, code = StepFailure.NONE, device_code(exc)
        lines = str(exc).strip().splitlines()
        report = ExitReport(
            os.getpid(), exc_type.__name__, lines[0] if lines else "", failure, device_code=code
        )
        with contextlib.suppress(OSError):
            write_exit_report(self.heartbeat.path, report)

    def _shutdown(self, *, exiting: bool = False) -> None:
        if self._closed:
            return
        self._closed = True
        self._stop.uninstall(exiting=exiting)
        if sys.excepthook == self._excepthook:
            sys.excepthook = self._previous_excepthook
        if self.heartbeat is not None:
            self.heartbeat.close()


def _step_seed(seed: int, rank: int, step: int) -> int:
    digest = hashlib.sha256(f"{seed}:{rank}:{step}".encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


def init(
    network: Any,
    optimizer: Any,
    *,
    ckpt_dir: str | Path | None = None,
    ckpt_every: int = 0,
    seed: int | None = None,
    keep: int = 2,
    state: Mapping[str, Any] | None = None,
    data: Any = None,
) -> Session:
    """Start the rank's session: restore the newest good checkpoint and, under an Unbroken
    agent, write the rank's heartbeat and take SIGTERM as a stop request. Call it after
    ``mindspore.communication.init()``.

    ``data`` (a ``mindspore.dataset`` pipeline, or any iterable of batches that can be
    iterated again) is read through :meth:`Session.batch` (:mod:`unbroken.mindspore.data`);
    build it the same way in every process, after the same ``mindspore.set_seed``. ``state``
    registers the script's other training state by name: objects with ``state_dict()`` and
    ``load_state_dict()`` whose state is numbers, strings, lists and dicts, the same on every
    rank. Both are checkpointed and go back with a step that is redone."""
    env = WorkerEnv.from_environ(os.environ)
    tft = os.environ.get("MS_ENABLE_TFT", "").strip()
    try:
        switches = parse_ms_enable_tft(tft) if tft else {}
    except KnobSyntaxError as e:
        raise ValueError(f"environment variable MS_ENABLE_TFT: {e.message} ({e.allowed})") from None
    if env.ckpt_dir is not None:
        ckpt_dir = env.ckpt_dir
    heartbeat = None
    if env.heartbeat_file is not None:
        heartbeat = HeartbeatWriter(
            env.heartbeat_file,
            rank=env.rank,
            generation=env.generation,
            started_at=process_started_at(),
        )
        # The job manager reads this: these ranks cannot regroup in a live process.
        heartbeat.update(recoverable=0)
    session = Session(
        network,
        optimizer,
        env=env,
        ckpt_dir=Path(ckpt_dir) if ckpt_dir is not None else None,
        ckpt_every=ckpt_every,
        seed=seed,
        keep=keep,
        switches=switches,
        heartbeat=heartbeat,
        state=state,
        data=data,
    )
    session._start()
    return session


__all__ = [
    "LinkError",
    "ReplicasDiverged",
    "Session",
    "TrainingStopped",
    "init",
    "state_digest",
    "tracked_parameters",
]
