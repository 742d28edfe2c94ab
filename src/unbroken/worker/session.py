"""The training session: the few lines a DDP script adds to resume, checkpoint and report.

::

    import unbroken.worker as ub

    dist.init_process_group("gloo")
    session = ub.init(ddp_model, opt, state={"scheduler": scheduler}, data=loader,
                      ckpt_dir=args.ckpt_dir, ckpt_every=100)
    for step in session.steps(total_steps):   # starts at the restored step
        x, y = session.batch()                 # the same batch when a step is redone
        ...
        loss.backward()
        opt.step()                             # the step commits when the body finishes
    session.close()

:func:`init` restores model, optimizer, registered state, data position and RNG states from
the newest good checkpoint. :meth:`Session.steps` yields step indices from there; between two
iterations (the *step boundary*) it commits the finished step, saves a checkpoint every
``ckpt_every`` commits (asynchronously), and honours a stop request. Under ``unbroken launch``
the session also writes the rank's heartbeat file (phases, step start and commit, step time)
and turns SIGTERM into a stop at the next boundary (:class:`TrainingStopped`). Under plain
``torchrun`` those hooks are off; checkpoints work the same, and so does the arithmetic: a DDP
model's gradients are averaged by the same hook (:mod:`unbroken.worker.commhook`) either way.

The step boundary is the one place where the loop's course changes: a step whose collectives
or optimizer update failed is not committed; the session recovers without restarting the
process (:mod:`unbroken.worker.recovery`: new process group, state repaired from a healthy
replica, agreement checked) and yields the same step again. That is why the loop is a
generator and the commit happens when it resumes. With ``seed=...`` every step's random
numbers are a function of (seed, rank, step) (:mod:`unbroken.worker.steprng`), so a redone
step, even on a replacement process, draws what a fault-free run drew.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, NoReturn

import torch
import torch.distributed as dist

from unbroken.checkpoint.checkpointer import Checkpointer, CheckpointError, Restored
from unbroken.protocol.exitreport import ExitReport, is_collective_error_text, write_exit_report
from unbroken.protocol.kinds import StepFailure
from unbroken.worker import agreement, devicetime, forks, rng, vranks, warmstart
from unbroken.worker.agreement import ReplicasDiverged
from unbroken.worker.chaos import RankChaos, install_signal_fault
from unbroken.worker.data import Batches
from unbroken.worker.elastic import VirtualGrads, plain_all_gather
from unbroken.worker.env import WorkerEnv, process_started_at
from unbroken.worker.failure import device_code
from unbroken.worker.heartbeat import DEFAULT_INTERVAL_S, HeartbeatWriter, Phase
from unbroken.worker.recovery import Recovery, checkpoint_group
from unbroken.worker.recoverysettings import RecoverySettings
from unbroken.worker.sharding import ShardingError
from unbroken.worker.shardsync import model_mesh
from unbroken.worker.statecodec import StateCodecError, pack, unpack
from unbroken.worker.steprng import StepRng
from unbroken.worker.stop import STOP_EXIT_CODE, StopSignal
from unbroken.worker.torchapi import PrefixStore, TCPStore, default_store
from unbroken.worker.trainstate import TrainState
from unbroken.worker.warmstart import ShardingMemo
from unbroken.worker.zero import fill_replicas, replica_stride

logger = logging.getLogger(__name__)

DATA_POS = "data_pos"
DATA = "data"  # the data loader's position, packed (:func:`unbroken.worker.statecodec.pack`)
_EWMA_WEIGHT = 0.2  # weight of the newest step time in the step-time average
_STOP_BASE_S = 5.0  # derived stop deadline: this plus three average steps

_active: Session | None = None
#: How long a stopped rank waits for its rejoin command, when the agent says (seconds).
COMMAND_TIMEOUT = "UNBROKEN_COMMAND_TIMEOUT_S"
DEFAULT_COMMAND_TIMEOUT_S = 120.0


class TrainingStopped(SystemExit):
    """Raised from :meth:`Session.steps` at the step boundary after a stop request.

    A ``SystemExit``: uncaught, it ends the process with status ``STOP_EXIT_CODE`` (143) and
    no traceback, and ``except Exception`` in the script does not swallow it. ``committed`` is
    the number of steps committed when the rank stopped.
    """

    def __init__(self, committed: int) -> None:
        super().__init__(STOP_EXIT_CODE)
        self.committed = committed


class Session:
    """One rank's training session; create it with :func:`init`."""

    def __init__(
        self,
        *,
        state: TrainState,
        env: WorkerEnv,
        checkpointer: Checkpointer | None,
        ckpt_every: int,
        heartbeat: HeartbeatWriter | None,
        stop_timeout_s: float | None,
        agree_every: int = 0,
    ) -> None:
        self.env = env
        self.state = state
        self.model = state.model
        self.optimizer = state.optimizer
        self.agree_every = agree_every
        self.checkpointer = checkpointer
        self.ckpt_every = ckpt_every
        self.heartbeat = heartbeat
        self.restored: Restored | None = None
        self.start_step = 0
        self._committed = 0
        self._last_ckpt_step: int | None = None
        self._stop_timeout_s = stop_timeout_s
        self._step_time_s = 0.0
        self._step_began = 0.0
        # Start of the step -> entering its gradient collective: the part a rank computes alone
        # (in lockstep training the whole step takes the slowest rank's time on every rank);
        # on a GPU, its time on the device (unbroken.worker.devicetime).
        self._compute_s = 0.0
        self._device_clock = devicetime.DeviceClock()
        self._device_clock.activate()
        self._first_commit = True
        self._closed = False
        self._stop = StopSignal(self._on_stop_request, self._stop_deadline_s)
        self._previous_excepthook = sys.excepthook
        self._chaos = RankChaos.from_env(env.rank, os.environ) if env.managed else None
        self._rng: StepRng | None = None
        self._recovery: Recovery | None = None
        self._vgrads: VirtualGrads | None = None
        self._memo: ShardingMemo | None = None  # a sharded model's: unbroken.worker.warmstart
        self._step = -1

    # -- properties --------------------------------------------------------------------------

    @property
    def rank(self) -> int:
        return dist.get_rank() if dist.is_initialized() else self.env.rank

    @property
    def world_size(self) -> int:
        return dist.get_world_size() if dist.is_initialized() else self.env.world_size

    @property
    def managed(self) -> bool:
        """Whether an Unbroken agent launched this rank (heartbeat and SIGTERM hooks on)."""
        return self.env.managed

    @property
    def committed(self) -> int:
        """Steps committed so far (restored ones included) = the index of the next step."""
        return self._committed

    @property
    def data_position(self) -> list[int] | None:
        """``[epoch, batches into the epoch]`` of the next batch of ``data=`` (None without)."""
        if self.state.data is None:
            return None
        return list(self.state.data.counters(self._committed))

    @property
    def stop_requested(self) -> bool:
        return self._stop.requested

    @property
    def virtual_ranks(self) -> range:
        """The virtual data-parallel ranks this process hosts in the current step (see
        :mod:`unbroken.worker.elastic`); they change when the world size does."""
        return self._virtual().hosted

    def virtual_rank(self, v: int) -> contextlib.AbstractContextManager[None]:
        """Run virtual rank ``v``'s forward and backward inside this context."""
        return self._virtual().virtual_rank(v, self._rng.seed if self._rng else None, self._step)

    def reduce_gradients(self) -> None:
        """Sum the virtual ranks' gradients in their fixed order (collective); a failed
        collective fails the step, as a failed DDP all-reduce does."""
        if self._compute_s == 0.0:
            self._compute_s = time.monotonic() - self._step_began
        grads = self._virtual()
        if self._recovery is None:
            grads.reduce(plain_all_gather, self.world_size)
            return
        if self._recovery.failure is not None:
            return  # the step failed already; the update is skipped and the step redone
        try:
            grads.reduce(self._recovery.sync.all_gather, self.world_size)
        except RuntimeError as e:
            self._recovery.sync.fail_step(e)

    def _virtual(self) -> VirtualGrads:
        if self._vgrads is None:
            raise RuntimeError("no virtual ranks: pass virtual_ranks=V to unbroken.worker.init")
        return self._vgrads

    def request_stop(self) -> None:
        """Stop at the next step boundary, as SIGTERM does (without its deadline)."""
        self._stop.request()

    # -- set-up ------------------------------------------------------------------------------

    def _start(self) -> None:
        if self.managed:
            self._stop.install()
            if self._chaos is not None:
                install_signal_fault(self._chaos)
            sys.excepthook = self._excepthook
        try:
            if self._recovery is not None and self._recovery.joining:
                joined = self._recovery.join(lambda: self._stop.requested)
                if joined is None:
                    self._leave()
                self._committed = joined
            elif self.checkpointer is not None:
                self.restored = self.checkpointer.load_latest(self.model, self.optimizer)
                if self.restored is not None and self.state.zero_replica is not None:
                    fill_replicas(self.state.zero_replica)  # a checkpoint has no replicas
            if self.restored is not None:
                self._restore_rank_state(self.restored)
            self.start_step = self._committed
            self._last_ckpt_step = self.restored.step if self.restored else None
            if self.heartbeat is not None:
                self.heartbeat.update(
                    phase=Phase.STATE_LOADED,
                    state_loaded_at=time.time(),
                    start_step=self._committed,
                    committed=self._committed,
                    ckpt_step=self._last_ckpt_step if self._last_ckpt_step is not None else -1,
                )
        except BaseException:
            self._fail()
            raise

    def _restore_rank_state(self, restored: Restored) -> None:
        self._committed = restored.step
        try:
            if self.state.objects:
                if not restored.shared:
                    raise CheckpointError(
                        f"checkpoint {restored.path} holds no registered state, but "
                        f"{', '.join(self.state.objects)} are registered"
                    )
                self.state.load_state_dicts(unpack(restored.shared))
            if self.state.data is not None:
                packed = {
                    k.removeprefix(DATA + "."): v
                    for k, v in restored.extra.items()
                    if k.startswith(DATA + ".")
                }
                if not packed:
                    raise CheckpointError(
                        f"checkpoint {restored.path} holds no data position for rank {self.rank}"
                    )
                self.state.data.load(unpack(packed))
        except (StateCodecError, ValueError, KeyError, TypeError) as e:
            raise CheckpointError(
                f"checkpoint {restored.path}: the registered state cannot be restored: {e}"
            ) from e
        if DATA_POS in restored.extra:
            data_pos = int(restored.extra[DATA_POS][0])
            if data_pos != restored.step:
                raise CheckpointError(
                    f"checkpoint {restored.path} holds data position {data_pos} for rank "
                    f"{self.rank}, but step {restored.step}"
                )
        restored_rngs = rng.restore(restored.extra)
        logger.info(
            "rank %d resumed at step %d from %s (RNG restored: %s)",
            self.rank,
            restored.step,
            restored.path,
            ", ".join(restored_rngs) or "none",
        )

    # -- the loop ----------------------------------------------------------------------------

    def steps(self, total: int) -> Iterator[int]:
        """Yield step indices from the committed count up to ``total`` (exclusive).

        Resuming the generator commits the step just run. Raises :class:`TrainingStopped` at
        a boundary after a stop request, and :class:`CheckpointError` when a checkpoint save
        failed.
        """
        if self._closed:
            raise RuntimeError("this training session is closed")
        if self._committed < total and self._stop.requested:
            self._leave()
        while self._committed < total:
            step = self._committed
            if self._recovery is not None and self._recovery.poll():
                self._recover()  # a command stopped this rank at the boundary
                continue
            self._begin(step)
            if self._recovery is not None:
                self._recovery.enter_step()
            try:
                yield step
            finally:
                if self._recovery is not None:
                    self._recovery.end_step()
            if self._recovery is not None and self._recovery.failure is not None:
                if self._recovery.updated:
                    # The update ran whole on gradients every rank shared; a collective
                    # after it failed (a logged loss): the step is done, the peer is not.
                    self._commit(step)
                self._recover()  # then redo the step the repair resumes at
                continue
            self._commit(step)
            if self._committed < total:
                if self._stop.requested:
                    self._leave()
                if self.ckpt_every and self._committed % self.ckpt_every == 0:
                    self.save_checkpoint()
        if self._committed == total and total > self.start_step:
            self._agree(total, closing=True)  # the replicas end as they must, or it is a fault

    def _begin(self, step: int) -> None:
        self._step = step
        if self._vgrads is not None:
            self._vgrads.begin(self.world_size, self.rank)
        if self._recovery is not None:
            self._recovery.begin_step(step)
        elif self._rng is not None:
            self._rng.begin(step, self.rank)
        self.state.begin(step, snapshot=self._recovery is not None)
        if self.agree_every and step > self.start_step and step % self.agree_every == 0:
            self._agree(step)
        if self._chaos is not None:  # after begin_step, which forgets the last step's failure
            fail = self._recovery.sync.fail_step if self._recovery is not None else None
            self._chaos.before_step(step, self.model, fail, _store_ports())
        self._step_began = time.monotonic()
        self._compute_s = 0.0
        self._device_clock.begin()
        if self.heartbeat is not None:
            if self._first_commit:
                self.heartbeat.update(phase=Phase.TRAINING, step=step, step_at=time.time())
            else:
                self.heartbeat.update(step=step, step_at=time.time())

    def batch(self) -> Any:
        """The next batch of the data loader given as ``data=``: an endless stream across
        epochs, the same batches again when a step is redone (:mod:`unbroken.worker.data`)."""
        if self.state.data is None:
            raise RuntimeError("no data loader was given to unbroken.worker.init(data=...)")
        return self.state.data.next()

    def _agree(self, step: int, *, closing: bool = False) -> None:
        """The agreement check (:mod:`unbroken.worker.agreement`) at the start of ``step``;
        a collective that fails there fails the step, as a failed gradient collective does."""
        if not dist.is_initialized() or self.world_size < 2:
            return
        try:
            if self._recovery is not None:
                agreement.check(self.state, step, self._recovery.sync.all_gather)
            else:
                agreement.check(self.state, step)
        except ReplicasDiverged as e:
            logger.error("rank %d: %s", self.rank, e)
            raise
        except Exception as e:
            if self._recovery is None or closing:
                raise
            self._recovery.sync.fail_step(e)

    def _recover(self) -> None:
        assert self._recovery is not None
        step = self._recovery.recover(self._committed, lambda: self._stop.requested)
        if step is None:
            self._leave()
        self._committed = step
        # The first commit after a recovery is a phase of that recovery (its MTTR ends there).
        self._first_commit = True
        if self.heartbeat is not None:
            self.heartbeat.update(first_commit_at=0.0)

    def _commit(self, step: int) -> None:
        elapsed_s = time.monotonic() - self._step_began
        comm_s = 0.0
        if self._compute_s == 0.0 and self._recovery is not None:
            # DDP: the all-reduce runs inside backward; the compute ends at its last bucket.
            sync = self._recovery.sync
            done = sync.backward_done_at
            if done > self._step_began:
                self._compute_s = done - self._step_began
                comm_s = max(0.0, sync.grads_done_at - done) if sync.grads_done_at else 0.0
        device_s = self._device_clock.take()
        if device_s is not None:  # on a GPU: the compute's time on the device, not queueing's
            self._compute_s = device_s
        self._committed = step + 1
        if self._first_commit:
            self._step_time_s = elapsed_s
        else:
            self._step_time_s += _EWMA_WEIGHT * (elapsed_s - self._step_time_s)
        if self.heartbeat is not None:
            now = time.time()
            if self._first_commit:
                self.heartbeat.update(
                    committed=self._committed,
                    committed_at=now,
                    step_time_s=self._step_time_s,
                    compute_time_s=self._compute_s,
                    comm_time_s=comm_s,
                    first_commit_at=now,
                )
            else:
                self.heartbeat.update(
                    committed=self._committed,
                    committed_at=now,
                    step_time_s=self._step_time_s,
                    compute_time_s=self._compute_s,
                    comm_time_s=comm_s,
                )
        self._first_commit = False
        if self._memo is not None:
            self._memo.save_if_grown()  # after the first step, and once a new shape was seen

    def save_checkpoint(self) -> None:
        """Start an asynchronous checkpoint of the committed state (at a step boundary only)."""
        if self.checkpointer is None:
            raise RuntimeError("no checkpoint directory was given to unbroken.worker.init")
        extra = {DATA_POS: torch.tensor([self._committed], dtype=torch.int64), **rng.capture()}
        extra.update(self._packed_data(self._committed))
        self.checkpointer.save_async(
            self._committed, self.model, self.optimizer, extra, self._packed_objects()
        )
        self._last_ckpt_step = self._committed

    def _packed_objects(self) -> dict[str, torch.Tensor]:
        if not self.state.objects:
            return {}
        return pack(self.state.state_dicts(), "registered state")

    def _packed_data(self, step: int) -> dict[str, torch.Tensor]:
        if self.state.data is None:
            return {}
        packed = pack(self.state.data.position(step), "data position")
        return {f"{DATA}.{k}": v for k, v in packed.items()}

    def _last_words(self, step: int) -> Path:
        """Write the committed state as the job's checkpoint of ``step``, from this rank
        alone (see :meth:`Checkpointer.save_last_words`). Every rank's data position is the
        step; random generators are not in it: with ``seed=`` each step seeds its own."""
        assert self.checkpointer is not None
        world = self.env.world_size
        # The data position is the same on every data-parallel rank (see unbroken.worker.data).
        data = self._packed_data(step)
        ranks_extra = {
            r: {DATA_POS: torch.tensor([step], dtype=torch.int64), **data} for r in range(world)
        }
        path = self.checkpointer.save_last_words(
            step, self.model, self.optimizer, ranks_extra, world, self._packed_objects()
        )
        self._last_ckpt_step = step
        return path

    def _on_saved(self, step: int) -> None:
        if self.heartbeat is not None:
            self.heartbeat.update(ckpt_step=step, ckpt_at=time.time())

    # -- stopping and closing ----------------------------------------------------------------

    def _stop_deadline_s(self) -> float:
        if self._stop_timeout_s is not None:
            return self._stop_timeout_s
        return _STOP_BASE_S + 3 * self._step_time_s

    def _on_stop_request(self) -> None:
        if self.heartbeat is not None:
            self.heartbeat.update(phase=Phase.STOPPING)

    def _leave(self) -> NoReturn:
        logger.warning(
            "rank %d stopping on request after %d committed steps", self.rank, self._committed
        )
        if self.heartbeat is not None:
            self.heartbeat.update(phase=Phase.STOPPING)
        if self.checkpointer is not None:
            try:
                self.checkpointer.wait()
            except CheckpointError as e:
                logger.error("%s", e)
        self._shutdown(exiting=True)
        raise TrainingStopped(self._committed)

    def close(self, *, final_checkpoint: bool = False, destroy_process_group: bool = True) -> None:
        """Finish: optionally checkpoint the final state, wait for the save in flight, meet
        the other ranks at a barrier, and destroy the process group."""
        if self._closed:
            return
        try:
            if (
                final_checkpoint
                and self.checkpointer is not None
                and self._committed > 0
                and self._last_ckpt_step != self._committed
            ):
                self.save_checkpoint()
            if self.checkpointer is not None:
                self.checkpointer.wait()
            if dist.is_initialized():
                if self._recovery is not None:
                    # The hook's group: an op retry replaced it, and left the default broken.
                    self._recovery.sync.barrier()
                else:
                    dist.barrier()
            if self.heartbeat is not None:
                self.heartbeat.update(phase=Phase.DONE)
            if destroy_process_group and dist.is_initialized():
                dist.destroy_process_group()
                if self._recovery is not None:
                    # Groups left behind by in-process recoveries: let their gloo threads end
                    # now, while the interpreter is whole, not in its final teardown (where a
                    # still-joinable thread aborts the process).
                    self._recovery.sync.detach()
                    if self.checkpointer is not None:
                        self.checkpointer.use_group(None)
                    if self._recovery.recoveries:
                        gc.collect()  # only recoveries leave groups behind (0.3 s with torch)
        except BaseException:
            self._fail()
            raise
        self._shutdown()

    def _fail(self) -> None:
        if self.heartbeat is not None and not self._closed:
            self.heartbeat.update(phase=Phase.FAILED)
        self._shutdown()

    def _excepthook(
        self,
        exc_type: type[BaseException],
        exc: BaseException,
        tb: TracebackType | None,
    ) -> None:
        self._report_exit(exc_type, exc)
        self._fail()
        self._previous_excepthook(exc_type, exc, tb)

    def _report_exit(self, exc_type: type[BaseException], exc: BaseException) -> None:
        """Tell the agent, as data, why this process ends (:mod:`unbroken.protocol.exitreport`):
        the exception's class and whether a collective failed under it."""
        if self.heartbeat is None or self._closed:
            return
        snap = self.heartbeat.snapshot()
        if snap.failed_step >= 0 and snap.failure:
            failure = StepFailure(snap.failure)  # the failed step's own reason
        else:
            failure = StepFailure.COLLECTIVE if _collective_error(exc) else StepFailure.NONE
        lines = str(exc).strip().splitlines()
        report = ExitReport(
            os.getpid(),
            exc_type.__name__,
            lines[0] if lines else "",
            failure,
            device_code=device_code(exc),
        )
        with contextlib.suppress(OSError):
            write_exit_report(self.heartbeat.path, report)

    def _shutdown(self, *, exiting: bool = False) -> None:
        global _active
        if self._closed:
            return
        self._closed = True
        self._stop.uninstall(exiting=exiting)
        if sys.excepthook == self._excepthook:
            sys.excepthook = self._previous_excepthook
        if self.heartbeat is not None:
            self.heartbeat.close()
        if _active is self:
            _active = None

    def __enter__(self) -> Session:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None:
            self.close()
        elif not isinstance(exc, TrainingStopped):
            self._fail()


def _store_ports() -> list[int]:
    """The ports of the rendezvous stores this process talks to (MASTER_PORT, and the store
    of the current generation's default group)."""
    ports = [int(p) for p in (os.environ.get("MASTER_PORT", ""),) if p.isdigit()]
    if dist.is_initialized():
        store = default_store()
        while isinstance(store, PrefixStore):
            store = store.underlying_store
        if isinstance(store, TCPStore):
            ports.append(store.port)
    return ports


def _replica_stride() -> int:
    """Where a ZeRO partition's replica lives (:func:`unbroken.worker.zero.replica_stride`):
    ``LOCAL_WORLD_SIZE`` ranks on, on another node, when the job spans nodes."""
    world = os.environ.get("WORLD_SIZE", "1")
    local = os.environ.get("LOCAL_WORLD_SIZE", world)
    if not world.isdigit() or not local.isdigit():
        return 1
    return replica_stride(int(world), int(local))


def init(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    ckpt_dir: Path | str | None = None,
    ckpt_every: int = 0,
    keep: int = 3,
    heartbeat_interval_s: float = DEFAULT_INTERVAL_S,
    stop_timeout_s: float | None = None,
    ckpt_timeout_s: float = 600.0,
    seed: int | None = None,
    comm_timeout_s: float = 30.0,
    command_timeout_s: float | None = None,
    state: Mapping[str, Any] | None = None,
    data: Any = None,
    agree_every: int = 100,
    virtual_ranks: int | None = None,
    replica_optimizer: bool = False,
) -> Session:
    """Start this rank's training session (collective: every rank calls it).

    Call after ``dist.init_process_group`` and after wrapping the model (DDP). ``ckpt_dir``
    (overridden by ``UNBROKEN_CKPT_DIR``) enables checkpoints: the newest good one is restored
    now, and one is saved every ``ckpt_every`` committed steps (0: only on request), keeping
    the newest ``keep``. ``stop_timeout_s`` bounds the time from SIGTERM to exit (default: 5 s
    plus three average steps); ``ckpt_timeout_s`` bounds each checkpoint collective.

    ``state`` registers the script's other training state by name: objects with
    ``state_dict()``/``load_state_dict()`` that are the same on every data-parallel rank (LR
    schedulers, ``GradScaler``, EMA weights, counters); ``data`` a ``DataLoader`` or
    ``StatefulDataLoader`` read through :meth:`Session.batch`. Both are checkpointed, sent from
    a replica and rolled back with a failed step (:mod:`unbroken.worker.trainstate`,
    :mod:`unbroken.worker.data`). Every ``agree_every`` steps (0: only after recoveries and
    at the end) the ranks compare digests of their state (:mod:`unbroken.worker.agreement`).

    ``virtual_ranks=V`` (an elastic job: ``V`` its largest data-parallel size) makes the
    gradients' sum independent of the world size: the script runs each of
    :attr:`Session.virtual_ranks` inside :meth:`Session.virtual_rank` and calls
    :meth:`Session.reduce_gradients` before the optimizer (:mod:`unbroken.worker.elastic`).

    ``replica_optimizer=True`` with a ``ZeroRedundancyOptimizer`` over every rank keeps on each
    rank a replica of the previous rank's optimizer partition (:mod:`unbroken.worker.zero`),
    so a lost rank's partition is repaired in process instead of from a checkpoint.

    ``seed`` makes each step's random numbers a function of (seed, rank, step). A DDP model
    on more than one rank gets its gradients averaged by a hook that survives a failed
    collective (:mod:`unbroken.worker.commhook`) and, under an agent that gives the rank a
    mailbox, recovers in process (:mod:`unbroken.worker.recovery`): ``comm_timeout_s`` is the
    process groups' collective timeout, ``command_timeout_s`` how long a stopped rank waits
    for its rejoin command (default: ``UNBROKEN_COMMAND_TIMEOUT_S``, which the control plane
    sets for a job whose rung may keep the ranks waiting longer, else 120 s).
    """
    global _active
    if _active is not None:
        raise RuntimeError("a training session is already active in this process; close it first")
    if ckpt_every < 0:
        raise ValueError(f"ckpt_every must be >= 0 (0: no periodic checkpoints), got {ckpt_every}")
    if stop_timeout_s is not None and stop_timeout_s <= 0:
        raise ValueError(f"stop_timeout_s must be > 0, got {stop_timeout_s}")
    if agree_every < 0:
        raise ValueError(f"agree_every must be >= 0 (0: only after recoveries), got {agree_every}")
    train_state = TrainState(
        model,
        optimizer,
        state,
        Batches(data) if data is not None else None,
        replica_optimizer=replica_optimizer,
        replica_stride=_replica_stride(),
    )
    if command_timeout_s is None:
        raw = os.environ.get(COMMAND_TIMEOUT, "")
        try:
            command_timeout_s = float(raw) if raw else DEFAULT_COMMAND_TIMEOUT_S
        except ValueError:
            raise ValueError(f"{COMMAND_TIMEOUT}={raw!r} is not a number of seconds") from None
    for name, value in (
        ("comm_timeout_s", comm_timeout_s),
        ("command_timeout_s", command_timeout_s),
    ):
        if value <= 0:
            raise ValueError(f"{name} must be > 0, got {value}")
    env = WorkerEnv.from_environ(os.environ)
    if env.world_size > 1 and not dist.is_initialized():
        raise RuntimeError(
            f"WORLD_SIZE={env.world_size} but no process group: call "
            "torch.distributed.init_process_group before unbroken.worker.init"
        )
    vgrads = None
    if virtual_ranks is not None:
        vranks.check_sizes(virtual_ranks, env.world_size)
        vgrads = VirtualGrads(model, virtual_ranks)
    heartbeat = None
    if env.managed and env.heartbeat_file is not None:
        heartbeat = HeartbeatWriter(
            env.heartbeat_file,
            rank=env.rank,
            generation=env.generation,
            started_at=process_started_at(),
            interval_s=heartbeat_interval_s,
        )
        heartbeat.update(phase=Phase.COMM_READY, comm_ready_at=time.time())
    root = env.ckpt_dir or (Path(ckpt_dir) if ckpt_dir else None)
    session = Session(
        state=train_state,
        env=env,
        checkpointer=None,
        ckpt_every=ckpt_every if root is not None else 0,
        heartbeat=heartbeat,
        stop_timeout_s=stop_timeout_s,
        agree_every=agree_every,
    )
    session._vgrads = vgrads
    if root is not None:
        try:
            pg, cut = checkpoint_group(ckpt_timeout_s) if dist.is_initialized() else (None, None)
            session.checkpointer = Checkpointer(
                root, pg, keep=keep, on_saved=session._on_saved, cut=cut
            )
        except BaseException:
            session._fail()
            raise
    try:
        session._rng = StepRng(seed, snapshot=False) if seed is not None else None
        session._recovery = Recovery.for_model(
            RecoverySettings.from_environ(
                os.environ,
                command_timeout_s=command_timeout_s,
                comm_timeout_s=comm_timeout_s,
                ckpt_timeout_s=ckpt_timeout_s,
            ),
            state=train_state,
            rng=session._rng,
            heartbeat=heartbeat,
            generation=env.generation,
            checkpointer=session.checkpointer,
        )
        if session._recovery is not None and session.checkpointer is not None:
            session._recovery.last_words = session._last_words
        if heartbeat is not None and session._recovery is not None:
            heartbeat.update(recoverable=int(session._recovery.settings.mailbox is not None))
    except BaseException:
        session._fail()
        raise
    session._memo = _sharding_memo(env, model)
    # Data loader workers forked from now on must not hold this rank's links open.
    forks.install()
    _active = session
    session._start()
    return session


def _sharding_memo(env: WorkerEnv, model: torch.nn.Module) -> ShardingMemo | None:
    """A sharded model's sharding memo, read from and written to the pod's directory (see
    :mod:`unbroken.worker.warmstart`); None for a model that is not FSDP2 on one mesh, or
    without a pod directory (not launched by Unbroken)."""
    if env.warm_dir is None:
        return None
    try:
        mesh = model_mesh(model)
    except ShardingError:
        return None
    memo = warmstart.start(warmstart.path_of(env.warm_dir, env.rank))
    if memo is not None:
        memo.attach(mesh)
    return memo


def _collective_error(exc: BaseException) -> bool:
    """Whether ``exc``, or an exception it was raised from, is a failed collective: a
    ``torch.distributed`` error, or a gloo error (a plain ``RuntimeError``) by its words."""
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            return False
        if isinstance(seen, dist.DistError) or is_collective_error_text(str(seen)):
            return True
        seen = seen.__cause__ or seen.__context__
    return False
