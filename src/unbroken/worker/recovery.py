"""Process-level recovery inside a training process: stop, regroup, repair, verify, redo.

No healthy process restarts. The session (:mod:`unbroken.worker.session`) calls in at two
places of its step loop and :class:`Recovery` does the rest:

- **A step fails.** A gradient collective that fails inside ``loss.backward()`` is caught by
  the DDP hook (:mod:`unbroken.worker.commhook`); an exception inside ``optimizer.step()`` is
  caught by the wrapper this module puts on the optimizer, which marks the rank's state
  *suspect* (the update may have run halfway). Either way the rest of the step does nothing
  (the optimizer update is skipped) and the user's code runs on to the step boundary.
- **Or a command asks.** At every step boundary the rank polls its mailbox
  (:mod:`unbroken.worker.mailbox`; one ``stat``). ``pause`` stops it there.

Then, at the boundary, the rank

1. *leaves* the process group at once (waiting for a checkpoint save in flight first), so
   peers still blocked in a collective with it fail fast instead of waiting for a timeout;
2. reports ``stopping`` in its heartbeat with the failed step, and polls the mailbox every
   ``poll_interval_s`` for a ``rejoin`` command, up to ``command_timeout_s``;
3. *regroups*: connects to generation ``g``'s store (``master_addr:master_port``, keys under
   ``default_pg`` exactly as ``init_process_group("gloo")`` over ``env://`` puts them), builds
   the new default group with a ``comm_timeout_s`` timeout, replays the collectives a freshly
   started rank's DDP constructor runs (shape check, broadcast from rank 0, received into
   scratch copies so no state changes), rebuilds the checkpoint group, and points the DDP
   hook at the new group; the heartbeat shows ``comm-ready``;
4. *repairs* from the command's ``source`` and checks that every rank agrees
   (:mod:`unbroken.worker.replica`); the heartbeat shows ``state-loaded`` with the repaired
   step as ``committed``;
5. *redoes* the step: the session yields step ``k`` again; the step's random numbers are the
   same (:mod:`unbroken.worker.steprng`).

While it waits in step 2, a ``stress`` command makes the rank run an online stress test (its device
and its links, in a group of its own: :mod:`unbroken.worker.stress`) and go on waiting; a ``dump``
command makes the rank write *last words*: its committed state (the state the interrupted step
started from) as a checkpoint of the whole job, alone (it has left every group) and atomically
(:meth:`Checkpointer.save_last_words`), with every rank's data position at that step; the heartbeat
stamps ``dumped_step``/``dumped_at``, or ``dump_failed_at`` when it cannot (no checkpoint
directory, a suspect or corrupt state, a failed write). The rank then goes on waiting: a stop (job-
or pod-level rescheduling resumes from the last words, at most the interrupted step lost) or a
rejoin follows.

A **replacement process** (``UNBROKEN_JOIN=1``) runs the user's script from the top: its
``init_process_group`` joins the new generation (MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE of
that generation, ``TORCHELASTIC_USE_AGENT_STORE=True``), its DDP constructor runs the
collectives the survivors replay in step 3, and ``unbroken.worker.init`` waits for the
``rejoin`` command in its mailbox (the source and the step come from there, not from the
environment) and runs step 4 instead of loading a checkpoint.

Without a mailbox (plain ``torchrun``) a failed step raises :class:`RecoveryFailed` at the
step boundary: there is no one to send the command.

Every collective of a step, the script's own included, fails the step rather than raising
(:mod:`unbroken.worker.stepgroup`: the default group, and the groups built over it, are the
session's from ``unbroken.worker.init`` and every regroup on; with op retry a peer's failure is
repaired in the step: :mod:`unbroken.worker.stepretry`). Limits: the script must not run other
collectives between ``init_process_group`` and ``unbroken.worker.init``; DDP's constructor must run
its default initial synchronisation (``init_sync=True``); buffers are broadcast from rank 0 before
each forward as DDP does (``broadcast_buffers`` at its default) or not at all
(``broadcast_buffers=False``), while ``forward_sync_buffers=False`` is not supported; every rank
must use the same parameters in a step (see :mod:`unbroken.worker.commhook`); state outside the
model, the optimizer and the objects registered with the session
(:mod:`unbroken.worker.trainstate`) is not repaired; a rank's random generators are reproduced on a
replacement only with ``seed=`` given to ``unbroken.worker.init``. A peer that hangs (SIGSTOP)
blocks the others' collective until the group's timeout or until it is killed; the manager kills a
hung rank, which makes the others fail at once.

HSDP (FSDP2 on a mesh of two or more replica groups) recovers the same way: its all-gather,
reduce-scatter and replica all-reduce fail the step (:mod:`unbroken.worker.shardsync` in place
of the DDP hook), step 3 rebuilds the device mesh over the new generation's group and moves the
model onto it instead of replaying DDP's constructor, and step 4 repairs shard by shard. ZeRO
over DDP with a replica optimizer (:mod:`unbroken.worker.zero`) recovers as DDP does, its
optimizer given the new group, each lost partition repaired from its replica. Other sharded
state (ZeRO without one, FSDP2 without replicas: :mod:`unbroken.worker.sharding`) turns
in-process recovery off, with the reason in the rank's log, and the rank's heartbeat says it
cannot be repaired in process, so the manager skips the in-process rungs and restarts the job
from its newest checkpoint, which restores every shard exactly
(:mod:`unbroken.checkpoint.modelstate`).
"""

from __future__ import annotations

import functools
import logging
import os
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from unbroken.checkpoint.checkpointer import Checkpointer
from unbroken.worker.commhook import GradSync, unsupported_reason
from unbroken.worker.decisionwait import undecided_too_long
from unbroken.worker.failure import SyncFailure, is_sticky
from unbroken.worker.heartbeat import HeartbeatWriter, Phase, StepFailure, pack_op_retry
from unbroken.worker.linkfault import OpenedLinks
from unbroken.worker.mailbox import (
    MAILBOX,
    Command,
    Dump,
    MailboxError,
    MailboxReader,
    Pause,
    Rejoin,
    Stress,
    parse_command,
)
from unbroken.worker.opretry import (
    OpRetrier,
    OpRetryDone,
)
from unbroken.worker.recoverysettings import JOIN, RecoverySettings
from unbroken.worker.replica import ReplicaError, repair
from unbroken.worker.sharding import Layout, in_process_refusal
from unbroken.worker.shardsync import ShardSync
from unbroken.worker.stepgroup import adopt_default_group, release_all, use_repairer
from unbroken.worker.stepretry import StepRetry
from unbroken.worker.steprng import StepRng
from unbroken.worker.stress import device_checksum, run_stress
from unbroken.worker.torchapi import (
    PrefixStore,
    broadcast_coalesced,
    ddp_parameters,
    ddp_syncs_buffers,
    set_group_timeout,
    unbind_default_group_arguments,
    verify_params_across_processes,
)
from unbroken.worker.trainstate import TrainState

logger = logging.getLogger(__name__)
_R = TypeVar("_R")


class RecoveryFailed(BaseException):
    """In-process recovery could not bring this rank back; the process must not train on.

    A ``BaseException``, like ``SystemExit``: a script's ``except Exception`` does not swallow
    it, so the rank cannot train on over a failed recovery."""


class Recovery:
    """One rank's recovery machinery; the session owns it (see the module doc)."""

    def __init__(
        self,
        settings: RecoverySettings,
        *,
        ddp: DistributedDataParallel | None,
        state: TrainState,
        rng: StepRng,
        heartbeat: HeartbeatWriter | None,
        generation: int,
    ) -> None:
        self.settings = settings
        self.ddp = ddp
        self.state = state
        self.optimizer = state.optimizer
        self.rng = rng
        self.heartbeat = heartbeat
        self.generation = generation
        self.rank = dist.get_rank()
        self.checkpointer: Checkpointer | None = None
        self.recoveries = 0
        _set_timeout(settings.comm_timeout_s)
        self._in_step = False
        self._updated = False
        self._update_failure: SyncFailure | None = None
        # Every collective of a step, the script's own included, fails the step (not the
        # rank) from here on: the default group, and the groups built over it, are the
        # session's (:mod:`unbroken.worker.stepgroup`).
        self._adopt_default_group()
        self.sync: GradSync | ShardSync
        if ddp is None:  # HSDP
            self.sync = ShardSync.install(state.model, _default_group(), settings.comm_timeout_s)
        else:
            self.sync = GradSync.install(ddp, _default_group())
        self._op_retries = 0
        if settings.op_retry is not None and isinstance(self.sync, GradSync):
            self.sync.use_op_retry(self._retrier(OpRetrier, settings.op_retry), generation)
        self._step_retry: StepRetry | None = None  # the step's other collectives, every group
        if settings.step_retry is not None:
            self._step_retry = self._retrier(StepRetry, settings.step_retry, step=self._at)
        use_repairer(self._step_retry)
        self._reader = (
            MailboxReader(settings.mailbox, skip_existing=not settings.join)
            if settings.mailbox is not None
            else None
        )
        self._command: Command | None = None
        #: The device check's checksum at the start, what a stress test compares with.
        self.stress_expected = device_checksum(settings.device) if self._reader else ""
        self._suspect = False
        self._half = False  # ZeRO's update ran here, its broadcast failed (replica.repair)
        self._resumed = False
        self._step = -1
        #: Writes the last words of ``step`` committed steps (set by the session); None:
        #: this rank cannot (no checkpoint directory).
        self.last_words: Callable[[int], Path] | None = None
        _wrap_optimizer_step(state.optimizer, self)

    @classmethod
    def for_model(
        cls,
        settings: RecoverySettings,
        *,
        state: TrainState,
        rng: StepRng | None,
        heartbeat: HeartbeatWriter | None,
        generation: int,
        checkpointer: Checkpointer | None,
    ) -> Recovery | None:
        """Recovery for a DDP model on more than one rank, when DDP's configuration allows it,
        or for an HSDP model whose every shard has a replica (None otherwise: a replacement
        process then cannot start, anything else trains on without it)."""
        model = state.model
        ranks = dist.get_world_size() if dist.is_initialized() else 1
        refusal = in_process_refusal(state.sharding) if ranks > 1 else None
        if refusal is not None:
            if settings.join:
                raise ValueError(f"cannot join as a replacement: {refusal}")
            log = logger.warning if settings.mailbox is not None else logger.info
            log("in-process recovery is off: %s", refusal)
            return None
        hsdp = ranks > 1 and state.sharding.layout is Layout.HSDP
        if not hsdp and (not isinstance(model, DistributedDataParallel) or ranks < 2):
            if settings.join:
                raise ValueError(
                    f"this process was started as a replacement ({JOIN}=1), but in-process "
                    "recovery needs a DistributedDataParallel model on more than one rank"
                )
            return None
        reason = None if hsdp else unsupported_reason(model)  # type: ignore[arg-type]
        if reason is not None:
            if settings.join:
                raise ValueError(f"cannot join as a replacement: {reason}")
            log = logger.warning if settings.mailbox is not None else logger.info
            log("in-process recovery is off: %s", reason)
            return None
        recovery = cls(
            settings,
            ddp=None if hsdp else model,  # type: ignore[arg-type]
            state=state,
            rng=rng or StepRng(None, snapshot=settings.mailbox is not None),
            heartbeat=heartbeat,
            generation=generation,
        )
        recovery.checkpointer = checkpointer
        return recovery

    @property
    def joining(self) -> bool:
        return self.settings.join

    @property
    def failure(self) -> SyncFailure | None:
        """Why the current step failed (None: it did not)."""
        return self._update_failure or self.sync.failure

    # -- the hot path ------------------------------------------------------------------------

    # -- the step's collectives (unbroken.worker.stepgroup.StepFaults) ------------------------

    @property
    def in_step(self) -> bool:
        """Whether the script is inside a step (its collectives' failures fail the step)."""
        return self._in_step

    @property
    def updated(self) -> bool:
        """Whether the step's update ran whole before a collective failed (the step is done)."""
        return self._updated

    @property
    def step_failed(self) -> bool:
        return self.failure is not None

    def collective_failed(self, error: Exception) -> None:
        """A collective of the step failed because of a peer: the step fails."""
        if self.failure is None:
            self.sync.fail_step(error)

    def _adopt_default_group(self) -> None:
        timeout = timedelta(seconds=self.settings.comm_timeout_s)
        adopt_default_group(self, timeout)
        if self.state.zero_replica is not None:
            # ZeRO broadcasts its updated partitions over the group it was built with.
            self.state.zero_replica.zero.process_group = _default_group()

    # -- the hot path ------------------------------------------------------------------------

    def begin_step(self, step: int) -> None:
        """Forget the last step's failure (the boundary's own collectives still raise)."""
        self._step = step
        self._update_failure = None
        self._updated = self._half = False
        self.sync.begin_step(step)
        self.rng.begin(step, self.rank)
        if self._resumed:
            self._resumed = False
            self._heartbeat(phase=Phase.TRAINING)

    def enter_step(self) -> None:
        """The script's step begins: its collectives' failures fail the step from now on."""
        self._in_step = True

    def end_step(self) -> None:
        """The step's body is over (the boundary)."""
        if self._step_retry is not None:
            self._step_retry.end_step()  # a peer's repair may need this rank's collectives
        self._in_step = False

    def poll(self) -> bool:
        """At a step boundary: whether a command asks this rank to stop here."""
        if self._reader is None:
            return False
        command = self._next_command()
        if command is None:
            return False
        self._command = command
        return True

    def _next_command(self) -> Command | None:
        assert self._reader is not None
        try:
            data = self._reader.poll()
            return None if data is None else parse_command(data)
        except MailboxError as e:
            raise RecoveryFailed(f"rank {self.rank}: bad recovery command: {e}") from e

    # -- op retry (inside a step's backward, on the autograd thread) -------------------------

    def _command_arrived(self) -> bool:
        """Whether a recovery command arrived (kept for the step boundary)."""
        if self._reader is None:
            return False
        if self._command is None:
            self._command = self._next_command()
        return self._command is not None

    def _regroup_checkpoints(self) -> None:
        """A new checkpoint group for an op retry: the fault broke the old one's links too."""
        if self.checkpointer is None:
            return
        self.checkpointer.abandon(wait_s=0.5)  # a save in flight may wait on a broken link
        old = self.checkpointer.pg
        self.checkpointer.use_group(None)
        if old is not None:
            try:  # unregistered, it closes its links with its last reference
                dist.destroy_process_group(old)
            except Exception as e:
                logger.debug("releasing the old checkpoint group: %s", e)
            del old
        self.checkpointer.use_group(*checkpoint_group(self.settings.ckpt_timeout_s))

    def _retrier(self, cls: Callable[..., _R], config: object, **more: Any) -> _R:
        return cls(
            config,
            timeout_s=self.settings.comm_timeout_s,
            generation=lambda: self.generation,
            interrupted=self._command_arrived,
            regroup=self._regroup_checkpoints,
            report=self._op_retried,
            poll_interval_s=self.settings.poll_interval_s,
            **more,
        )

    def _at(self) -> int:
        return self._step

    def _op_retried(self, done: OpRetryDone) -> None:
        self._op_retries += 1
        self._heartbeat(
            op_retries=self._op_retries,
            op_retry_at=done.at,
            op_retry_last=pack_op_retry(done.step, done.attempt, int(done.level.value[1:])),
        )

    def _failure_code(self) -> StepFailure:
        failure = self.failure
        return StepFailure.NONE if failure is None else failure.kind

    def _update_failed(self, error: Exception) -> None:
        if is_sticky(error):  # this process cannot redo the update: a new one must
            raise error
        self._update_failure = failure = SyncFailure.of(error, StepFailure.UPDATE)
        self._suspect = True
        logger.error(
            "rank %d: the optimizer update of step %d failed (%s); its state is suspect",
            self.rank,
            self._step,
            failure.message,
        )

    # -- recovering --------------------------------------------------------------------------

    def recover(self, committed: int, should_stop: Callable[[], bool]) -> int | None:
        """Stop, wait for a rejoin command, regroup, repair; returns the step to run next,
        or None when a stop was requested while waiting."""
        failure = self.failure
        # A step whose update ran before a later collective failed was committed.
        step = self._step if failure is not None and not self._updated else committed
        rank = self.rank
        if self._failure_code() in (StepFailure.DEVICE_MEMORY, StepFailure.OUT_OF_MEMORY):
            # Corrupt memory, or a step cut short where it failed to allocate: never a replica
            # source, always repaired.
            self._suspect = True
        if failure is not None and self._updated:
            what = f"a collective after step {self._step}'s update failed ({failure.reason})"
        elif failure is not None:
            what = f"step {step} failed ({failure.reason})"
        else:
            assert self._command is not None
            what = f"{self._command.op} command {self._command.seq} at step boundary {step}"
        logger.warning("rank %d: %s; leaving the process group", rank, what)
        failed_at = failure.at if failure is not None else time.time()
        if self._reader is not None and not should_stop():
            # Said first, so that the fault is decided on while this rank leaves its group:
            # a command that comes meanwhile waits in the mailbox until it has.
            self._stopping(step, failed_at)
        self._leave()  # at once, even to fail: peers blocked with this rank then fail too
        # What the failed step changed goes back now: last words and the replicas' comparison
        # must see the state the step started from.
        self.state.rollback(committed)
        if should_stop():
            # A stop was requested (SIGTERM): the peers that already left are stopping too.
            logger.warning("rank %d: %s while stopping; not recovering", rank, what)
            return None
        if self._reader is None:
            raise RecoveryFailed(
                f"rank {rank}: {what}, and this process has no recovery command channel "
                f"({MAILBOX} is not set: it was not launched by an Unbroken agent)"
            )
        self._stopping(step, failed_at)
        pending, self._command = self._command, None
        if isinstance(pending, Stress):  # it came before the pause was seen: the same stop
            self._stress(pending)
        command = pending if isinstance(pending, Rejoin) else None
        if command is None:
            # A pause (or stress test) that stopped this rank was the manager's decision.
            decided = pending is not None
            command = self._wait_for_rejoin(what, should_stop, committed, decided)
            if command is None:
                return None
        return self._rejoin(command, committed, regroup=True)

    def _stopping(self, step: int, failed_at: float) -> None:
        self._heartbeat(
            phase=Phase.STOPPING,
            failed_step=step,
            failed_at=failed_at,
            failure=self._failure_code(),
            **({"command_seq": self._command.seq} if self._command is not None else {}),
        )

    def join(self, should_stop: Callable[[], bool]) -> int | None:
        """A replacement process: wait for the rejoin command and take the source's state."""
        rank = dist.get_rank()
        command = self._wait_for_rejoin("started as a replacement", should_stop)
        if command is None:
            return None
        expected = (self.settings.master_addr, self.settings.master_port)
        here = (command.rank, command.world_size)
        if here != (rank, dist.get_world_size()) or (
            self.settings.master_port and (command.master_addr, command.master_port) != expected
        ):
            raise RecoveryFailed(
                f"rejoin command {command.seq} puts this replacement at {command.master_addr}:"
                f"{command.master_port} as rank {command.rank} of {command.world_size}, but it "
                f"joined {expected[0]}:{expected[1]} as rank {rank} of {dist.get_world_size()}"
            )
        return self._rejoin(command, 0, regroup=False)

    def _wait_for_rejoin(
        self,
        what: str,
        should_stop: Callable[[], bool],
        committed: int | None = None,
        decided: bool = False,
    ) -> Rejoin | None:
        """Wait for the rejoin command; ``committed``: this rank's committed steps, the state
        a ``dump`` command saves (None: a replacement process, which has no state to save)."""
        started = time.monotonic()
        deadline = started + self.settings.command_timeout_s
        # A replacement process was started by a decision already; a stopped rank waits for
        # one (any order) at most the decision wait.
        decided = decided or committed is None
        while True:
            if should_stop():
                return None
            command = self._next_command()
            decided = decided or command is not None
            if isinstance(command, Rejoin):
                return command
            if isinstance(command, Pause):
                self._heartbeat(command_seq=command.seq)
            if isinstance(command, Dump | Stress):
                began = time.monotonic()
                if isinstance(command, Dump):
                    self._dump(command, committed)
                else:
                    self._stress(command)
                deadline += time.monotonic() - began
            undecided = undecided_too_long(
                time.monotonic() - started, decided, self.settings.decision_wait_s
            )
            if undecided is not None:
                raise RecoveryFailed(f"rank {self.rank}: {what}; {undecided}")
            if time.monotonic() >= deadline:
                raise RecoveryFailed(
                    f"rank {self.rank}: {what}; no "
                    f"rejoin command arrived in {self.settings.mailbox} within "
                    f"{self.settings.command_timeout_s:.0f} s, giving up"
                )
            time.sleep(self.settings.poll_interval_s)

    def _stress(self, command: Stress) -> None:
        """Online stress test ``command.round``; a test that cannot run is logged (the manager
        sees no result from this rank: a timeout) and the rank goes on waiting."""
        self._heartbeat(command_seq=command.seq)
        try:
            run_stress(
                command,
                self.stress_expected,
                self.settings.device,
                timeout_s=self.settings.comm_timeout_s,
            )
        except (RuntimeError, ValueError) as e:
            logger.error("rank %d: stress test %d failed: %s", self.rank, command.round, e)

    def _dump(self, command: Dump, committed: int | None) -> None:
        self._heartbeat(command_seq=command.seq)
        problem = None
        if committed is None:
            problem = "a replacement process holds no state yet"
        elif self._suspect:
            problem = "its state is suspect (a failed update or a device memory error)"
        elif self._half:
            problem = "ZeRO's broadcast of its last update failed: its parameters are not whole"
        elif self.state.sharding.sharded_parts:
            problem = f"its state is sharded ({self.state.sharding.layout}): one rank holds a part"
        elif self.last_words is None:
            problem = "it has no checkpoint directory"
        if problem is None:
            assert committed is not None and self.last_words is not None
            try:
                path = self.last_words(committed)
            except Exception as e:
                problem = f"writing them failed: {e}"
            else:
                self._heartbeat(dumped_step=committed, dumped_at=time.time())
                logger.warning(
                    "rank %d: last words of step %d written to %s", self.rank, committed, path
                )
                return
        self._heartbeat(dump_failed_at=time.time())
        logger.error("rank %d: no last words: %s", self.rank, problem)

    def _leave(self) -> None:
        if self.checkpointer is not None:
            # A save in flight may be stuck in a collective with the peer that is gone.
            self.checkpointer.abandon(wait_s=0.5)
        if isinstance(self.sync, ShardSync):
            self.sync.cut()  # the mesh's groups: peers in an all-gather with this rank fail now
        # Drop every reference to the old groups first: gloo closes a group's connections
        # only when its last reference goes, and peers must see them close.
        self.sync.detach()
        release_all()  # the step groups' links close now, whoever else holds the groups
        if self.state.zero_replica is not None:
            self.state.zero_replica.zero.process_group = None  # the regroup sets the new one
        if self.checkpointer is not None:
            self.checkpointer.use_group(None)
        unbind_default_group_arguments()
        if dist.is_initialized():
            dist.destroy_process_group()

    def _abandon(self) -> None:
        """Leave a group a failed recovery built, so that peers still in it fail at once."""
        try:
            self._leave()
        except Exception as e:  # already failing: report the first error, not this one
            logger.debug("leaving the group after a failed recovery: %s", e)

    def _rejoin(self, command: Rejoin, committed: int, *, regroup: bool) -> int:
        self._heartbeat(command_seq=command.seq)
        if regroup and command.generation <= self.generation:
            raise RecoveryFailed(
                f"rejoin command {command.seq} names generation {command.generation}, but "
                f"this rank is already in generation {self.generation}"
            )
        try:
            if regroup:
                self._regroup(command)
            self.generation = command.generation
            self.rank = command.rank
            self._heartbeat(
                phase=Phase.COMM_READY,
                comm_ready_at=time.time(),
                generation=command.generation,
                rank=command.rank,
            )
            repaired = repair(
                self.state,
                committed,
                source=command.source,
                step=command.step,
                suspect=self._suspect,
                fresh=self.joining and self.recoveries == 0,
                half=self._half,
                timeout_s=self.settings.comm_timeout_s,
            )
        except RecoveryFailed:
            self._abandon()
            raise
        except (ReplicaError, RuntimeError) as e:
            self._abandon()
            raise RecoveryFailed(
                f"rank {command.rank}: recovery into generation {command.generation} "
                f"(replica source rank {command.source}, step {command.step}) failed: {e}"
            ) from e
        self._suspect = self._half = False
        self.recoveries += 1
        # With a seed the redone step seeds its generators itself. Without one, a rank that
        # began the step rewinds to its snapshot; one stopped at the boundary before it is
        # where the step starts; a rank that took another's state cannot know its own.
        if self.rng.seed is None and (
            repaired.received
            or (self._step == repaired.step and not self.rng.rewind(repaired.step))
        ):
            logger.warning(
                "rank %d: no seed was given to unbroken.worker.init, so the random numbers of "
                "step %d cannot be reproduced here; the run goes on but is not bitwise "
                "reproducible",
                command.rank,
                repaired.step,
            )
        self._resumed = True
        self._heartbeat(
            phase=Phase.STATE_LOADED,
            state_loaded_at=time.time(),
            committed=repaired.step,
            failed_step=-1,
            recoveries=self.recoveries,
        )
        logger.warning(
            "rank %d: recovered into generation %d at step %d (%s)",
            command.rank,
            command.generation,
            repaired.step,
            f"state from rank {repaired.source}" if repaired.received else "own state kept",
        )
        return repaired.step

    def _regroup(self, command: Rejoin) -> None:
        timeout = timedelta(seconds=self.settings.comm_timeout_s)
        if command.ifname:
            # Another network plane (link failover): gloo reads the variable each time it
            # makes a group, so the new group's connections use that interface.
            os.environ["GLOO_SOCKET_IFNAME"] = command.ifname
        store = dist.TCPStore(  # type: ignore[attr-defined]
            command.master_addr,
            command.master_port,
            world_size=command.world_size,
            is_master=False,
            timeout=timeout,
        )
        excepthook = sys.excepthook  # init_process_group wraps it once more each time
        try:
            dist.init_process_group(
                "gloo",
                store=PrefixStore("default_pg", store),
                rank=command.rank,
                world_size=command.world_size,
                timeout=timeout,
            )
        finally:
            sys.excepthook = excepthook
        if isinstance(self.sync, ShardSync):
            self.sync.replay_mesh()  # what a replacement's script builds before init
        else:
            self._replay_ddp_init()
        # Then what a replacement's unbroken.worker.init does, in the same order.
        if self.checkpointer is not None:
            self.checkpointer.use_group(*checkpoint_group(self.settings.ckpt_timeout_s))
        self._adopt_default_group()
        self.sync.attach(_default_group())
        if self.sync.op_retry is not None:
            self.sync.use_op_retry(self.sync.op_retry, command.generation)

    def _replay_ddp_init(self) -> None:
        """The collectives ``DistributedDataParallel(module)`` runs on the default group, so
        that a replacement process constructing DDP meets its peers there. Received into
        copies: this rank's state stays as it is."""
        group = _default_group()
        assert self.ddp is not None
        verify_params_across_processes(group, ddp_parameters(self.ddp))
        ignore = self.ddp.parameters_to_ignore
        module = self.ddp.module
        copies = [p.detach().clone() for name, p in module.named_parameters() if name not in ignore]
        if ddp_syncs_buffers(self.ddp):  # then DDP's constructor broadcast the buffers too
            copies += [b.detach().clone() for n, b in module.named_buffers() if n not in ignore]
        if copies:
            broadcast_coalesced(group, copies, self.ddp.broadcast_bucket_size)

    def _heartbeat(self, **values: Any) -> None:
        if self.heartbeat is not None:
            self.heartbeat.update(**values)


def checkpoint_group(timeout_s: float) -> tuple[dist.ProcessGroup, Callable[[], int]]:
    """A gloo group of every rank of the default group for the checkpoint collectives (saves
    in the background never interleave with the training's own), and what cuts its links
    when a save stuck on a lost peer is let go (see :meth:`Checkpointer.abandon`)."""
    with OpenedLinks() as links:
        group = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))
    return group, links.cut


def _default_group() -> dist.ProcessGroup:
    group = dist.group.WORLD
    assert isinstance(group, dist.ProcessGroup)
    return group


def _set_timeout(timeout_s: float) -> None:
    """Give the default group a finite timeout: a hung peer must fail the step, not hang it."""
    set_group_timeout(_default_group(), timedelta(seconds=timeout_s))


def _wrap_optimizer_step(optimizer: torch.optim.Optimizer, recovery: Recovery) -> None:
    """Skip the update of a failed step; turn an exception in the update into a failed step."""
    original = optimizer.step

    @functools.wraps(original)
    def step(*args: Any, **kwargs: Any) -> Any:
        if recovery.failure is not None:
            logger.debug("skipping the optimizer update of failed step %d", recovery._step)
            return None
        try:
            result = original(*args, **kwargs)
        except RuntimeError as e:
            recovery._update_failed(e)
            return None
        if recovery.sync.failure is None:
            recovery._updated = True
        elif recovery.state.zero_replica is not None:
            # ZeRO's broadcast of the updated partitions failed after its update (and the
            # replica's) ran here: the step is done but for parameters of other partitions,
            # which the repair completes from the ranks that took it (replica._complete_update).
            recovery._updated = recovery._half = True
        else:
            # A collective inside the update failed (a closure's backward, a broadcast of
            # another optimizer): the update may have run halfway.
            recovery._suspect = True
        return result

    optimizer.step = step  # type: ignore[method-assign]
