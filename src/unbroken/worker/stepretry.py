"""Op retry for every collective of a step: a link that fails transiently costs a re-execution,
not a recovery.

With op retry on (``HCCL_OP_RETRY_ENABLE`` for the level of the failed collective's group: L1
when its ranks sit on more than one node, L0 otherwise; :class:`~unbroken.worker.opretry.
RetryConfig`), every collective a step issues on a :class:`~unbroken.worker.stepgroup.StepGroup`
(the default group, the device mesh's dimensions, the script's own groups) is kept for the step
with a copy of what it reads (:class:`~unbroken.worker.stepgroup.Op`), numbered by its place in
its group's sequence (the same number on every member: every member issues a group's
collectives in the same order). When one fails because of a peer, :class:`StepRetry` repairs
every group of the job at once, in a round that every rank joins:

1. *Cut.* Each rank shuts down the links of all its groups, so every collective waiting on one
   fails at once, here and at the peers (which enter the round the same way), and notes which of
   its kept collectives completed.
2. *Hold.* ``HoldTime`` before the first attempt, ``IntervalTime`` before each next one,
   polling the rank's mailbox: a recovery command means the manager handles a bigger fault, so
   the round stops (:class:`~unbroken.worker.opretry.OpRetryStopped`) and the step fails.
3. *Meet.* Every rank writes, in the generation's store under ``op-retry/<generation>/steps/
   <round>/<attempt>/``, its step and, per group, the first collective it has not completed;
   ranks at different steps stop the round (the step fails, and the ladder takes it).
4. *Rebuild.* Each group is made again over the store, in the order of the group names (the
   same on every rank, so no two ranks wait on each other's next group), then the checkpoint
   group (``regroup``). Every rank then says whether all its groups were made and waits for
   every other's word (:func:`~unbroken.worker.opretry.agree`): one whose rebuild failed here
   goes to the next attempt together with its peers, instead of waiting at the next meeting
   alone while they wait out the group timeout in this one.
5. *Issue again.* Per group, every kept collective from the lowest first-not-completed of its
   members on is issued again in its order, from the saved inputs: into its own tensors where
   it had not completed here, into scratch tensors where it had (its peers need this rank's
   part; the script may hold its outputs already). Same ranks, same order, same inputs: the
   results, and so the model, are bitwise those of a fault-free run.

An attempt that fails (a group not made, a collective failing again) is followed by the next,
``MaxCnt`` in all; then the step fails and the recovery ladder takes over. A rank that has
completed the step's collectives before a peer's failed one still takes part: at the step's end
(:meth:`StepRetry.end_step`, one store look-up per step while op retry is on) it checks for a
round it has not joined. Every re-execution is reported in the heartbeat and logged.

Not covered: collectives whose futures are awaited on the backend's thread (their failure fails
the step as without op retry), and groups the script built with an explicit backend. DDP's
gradient all-reduce keeps its own re-execution (:mod:`unbroken.worker.opretry`, over the
hook's group).
"""

from __future__ import annotations

import gc
import json
import logging
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from functools import partial

import torch.distributed as dist

from unbroken.worker import torchapi
from unbroken.worker.opretry import (
    OpRetryDone,
    OpRetryExhausted,
    OpRetryFailed,
    OpRetrySettings,
    OpRetryStopped,
    RetryConfig,
    agree,
    describe_error,
    hold,
    meet,
)
from unbroken.worker.stepgroup import StepGroup, live_groups

logger = logging.getLogger(__name__)


class StepRetry:
    """Repairs every :class:`StepGroup` of the job after a peer's failure (see the module
    doc). The owner (:class:`unbroken.worker.recovery.Recovery`) supplies the generation and
    step of the moment, a mailbox check, the checkpoint group's rebuilding, and where to
    report."""

    def __init__(
        self,
        retry: RetryConfig,
        *,
        timeout_s: float,
        generation: Callable[[], int],
        step: Callable[[], int],
        interrupted: Callable[[], bool],
        regroup: Callable[[], None],
        report: Callable[[OpRetryDone], None],
        poll_interval_s: float = 0.02,
    ) -> None:
        self.retry = retry
        self.timeout_s = timeout_s
        self._generation = generation
        self._step = step
        self._interrupted = interrupted
        self._regroup = regroup
        self._report = report
        self.poll_interval_s = poll_interval_s
        self.done = 0  # successful repairs by this process
        self._lock = threading.RLock()
        self._rounds_generation = -1
        self._rounds = 0  # rounds this process took part in, in the current generation
        self._given_up = -1  # the step whose repair failed: it is not tried again

    # -- entry points ----------------------------------------------------------------------

    def repair(self, error: Exception, group: StepGroup, what: str) -> bool:
        """After ``error`` (a peer's failure) in the collective ``what`` on ``group``: repair
        every group; whether the step can go on (False: op retry is off for the group's
        level, or it failed)."""
        ranks = group.global_ranks()
        settings = self.retry.settings_for(ranks)
        if settings is None:
            logger.warning(
                "rank %d: %s over ranks %s failed; op retry is off for its level (%s)",
                dist.get_rank(),
                what,
                ranks,
                self.retry.level_of(ranks),
            )
            return False
        return self._run(settings, error, f"{what} over ranks {ranks}")

    def end_step(self) -> None:
        """At the step's end: join a round a peer opened (it needs this rank's part of
        collectives this rank completed), then forget the step's collectives."""
        with self._lock:
            try:
                if self._given_up != self._step() and self._opened_by_peer():
                    settings = self.retry.settings_for(range(dist.get_world_size()))
                    if settings is not None:
                        self._run(settings, None, "a peer's collective")
            finally:
                for group in live_groups():
                    group.log.clear()

    # -- the round -------------------------------------------------------------------------

    def _prefix(self, generation: int, round_: int) -> str:
        return f"op-retry/{generation}/steps/{round_}/"

    def _opened_by_peer(self) -> bool:
        generation = self._generation()
        rounds = self._rounds if generation == self._rounds_generation else 0
        key = self._prefix(generation, rounds + 1) + "open"
        return bool(torchapi.default_store().check([key]))

    def _run(self, settings: OpRetrySettings, error: Exception | None, what: str) -> bool:
        with self._lock:
            step = self._step()
            if self._given_up == step:
                return False
            try:
                self._round(settings, error, step, what)
            except OpRetryFailed as e:
                self._given_up = step
                logger.error("rank %d: %s", dist.get_rank(), e)
                return False
            return True

    def _round(self, s: OpRetrySettings, error: Exception | None, step: int, what: str) -> None:
        generation = self._generation()
        if generation != self._rounds_generation:
            self._rounds_generation, self._rounds = generation, 0
        self._rounds += 1
        prefix = self._prefix(generation, self._rounds)
        store = torchapi.default_store()
        store.set(prefix + "open", str(step))
        rank = dist.get_rank()
        failed_at = time.time()
        first = last = describe_error(error) if error is not None else "it failed at a peer"
        for attempt in range(1, s.max_count + 1):
            groups = sorted(live_groups(), key=lambda g: str(g.group_name))
            for group in groups:
                group.cut()
            for group in groups:
                for op in group.log:
                    op.settle()
            gc.collect()  # the old groups' last references: their descriptors close
            wait_s = s.hold_s if attempt == 1 else s.interval_s
            logger.warning(
                "rank %d: %s of step %d failed (%s); op retry %d/%d (%s) of every group in %.2f s",
                rank,
                what,
                step,
                last,
                attempt,
                s.max_count,
                s.level,
                wait_s,
            )
            self._wait(wait_s, attempt, step)
            try:
                self._attempt(store, f"{prefix}{attempt}/", groups, step, attempt)
            except OpRetryFailed:
                raise
            except Exception as e:
                last = describe_error(e)
                logger.warning(
                    "rank %d: op retry %d/%d of step %d failed: %s",
                    rank,
                    attempt,
                    s.max_count,
                    step,
                    last,
                )
                continue
            done = OpRetryDone(step, attempt, s.level, failed_at, time.time(), first)
            self.done += 1
            self._report(done)
            logger.warning(
                "rank %d: the collectives of step %d issued again (op retry %d/%d, %s) %.3f s "
                "after one failed",
                rank,
                step,
                attempt,
                s.max_count,
                s.level,
                done.at - failed_at,
            )
            return
        raise OpRetryExhausted(
            f"op retry exhausted: {s.max_count} re-execution(s) of the collectives of step "
            f"{step} failed ({s.level}; last: {last}; first failure: {first})"
        )

    def _attempt(
        self,
        store: torchapi.Store,
        prefix: str,
        groups: list[StepGroup],
        step: int,
        attempt: int,
    ) -> None:
        firsts = {
            str(g.group_name): min((op.seq for op in g.log if not op.ok), default=g.seq + 1)
            for g in groups
        }
        here = torchapi.PrefixStore(prefix, store)
        check = partial(self._check, attempt, step)
        note = json.dumps({"step": step, "first": firsts})
        notes = meet(here, prefix, self.timeout_s, check, self.poll_interval_s, note)
        arrivals = [json.loads(n.decode()) for n in notes]
        steps = sorted({int(a["step"]) for a in arrivals})
        if len(steps) > 1:
            raise OpRetryFailed(
                f"op retry of step {step} stopped: the ranks are at steps {steps} (a rank went "
                "on before the round began); the recovery ladder takes the fault"
            )
        timeout = timedelta(seconds=self.timeout_s)
        error: Exception | None = None
        try:
            for group in groups:  # in name order on every rank: no two wait on each other
                pg_store = torchapi.PrefixStore(f"{prefix}pg/{group.group_name}/", store)
                group.rebuild(pg_store, timeout)
            self._regroup()
        except OpRetryStopped:
            raise
        except Exception as e:
            error = e.with_traceback(None)
        # Every rank rebuilds every group: they agree on whether all did before any issues
        # again. (Not after issuing: a peer's issue may wait for this rank to go on with its
        # step and issue a collective it had not reached when the link failed.)
        agree(here, error, 2 * self.timeout_s, check, self.poll_interval_s)
        issued = 0
        for group in groups:
            name = str(group.group_name)
            start = min(int(a["first"][name]) for a in arrivals if name in a["first"])
            inner = group.inner
            assert inner is not None
            for op in group.log:
                if op.seq >= start:
                    op.work = op.issue(inner, scratch=op.ok)
                    issued += 1
        failure: Exception | None = None
        for group in groups:
            for op in group.log:
                failure = op.settle() or failure
        if failure is not None:
            raise failure
        logger.debug("rank %d: %d collective(s) issued again", dist.get_rank(), issued)

    def _wait(self, wait_s: float, attempt: int, step: int) -> None:
        hold(wait_s, lambda: self._check(attempt, step), self.poll_interval_s)

    def _check(self, attempt: int, step: int) -> None:
        if self._interrupted():
            raise OpRetryStopped(
                f"op retry {attempt}/{self.retry.config.max_count} of step {step} stopped: a "
                "recovery command arrived (the manager is handling the fault)"
            )
