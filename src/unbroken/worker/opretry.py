"""Operator-level op retry: a gradient all-reduce that fails transiently is run again, in place.

The job's container environment carries the seed's two knobs into every rank:
``HCCL_OP_RETRY_ENABLE`` (``"L0:0, L1:1, L2:1"``: on or off per communication level) and
``HCCL_OP_RETRY_PARAMS`` (``"MaxCnt:3, HoldTime:5000, IntervalTime:1000"``), parsed here with
:mod:`unbroken.spec.envknobs` (a malformed value is a :class:`ValueError` naming the variable).
When the level of the gradient group is enabled, the DDP hook (:mod:`unbroken.worker.commhook`)
keeps a copy of every buffer it all-reduces until the step's all-reduces succeeded, and a
failed one is re-executed by :class:`OpRetrier` up to ``MaxCnt`` times, ``HoldTime`` after the
failure and ``IntervalTime`` between re-executions. The step's other collectives (on the
default group and the groups built over it) are re-executed by :mod:`unbroken.worker.stepretry`
with the same settings (:class:`RetryConfig`); a step failed by ``fail_step`` (a device memory
error) or by the optimizer update goes to recovery as before.

**Level.** The level of a collective is the widest span of its group's ranks: ``L1`` when they
sit on more than one node, ``L0`` when all are on one. The gradient group is every rank of the
job, so it is ``L1`` when ``WORLD_SIZE > LOCAL_WORLD_SIZE`` (more than one pod, each pod being
one node) and ``L0`` otherwise (``LOCAL_WORLD_SIZE`` unset: all ranks in one node, as torchrun
with one node starts them). ``L2`` (between super-nodes) is never derived: a local cluster has
no super-nodes, so ``L2:1`` alone enables nothing.

**Re-execution on gloo.** A gloo pair that failed stays failed, so a re-execution needs a new
group. With op retry on, the hook all-reduces over a gloo group of its own, not registered with
``torch.distributed`` (``ProcessGroup.abort()`` does not close a gloo group's links in torch
2.13; dropping the last reference does). Each attempt: drop the broken group (its links close,
so peers blocked in the same collective fail at once and enter their own retry); wait
``HoldTime`` (first attempt) or ``IntervalTime``; meet every rank at a barrier in the store of
the current generation (keys under ``op-retry/<generation>/<n>/step-<step>/``, where ``n``
counts the attempts this process made in its generation: every rank fails the same collective,
so the counters agree, and ranks that disagree on the step never meet and fail instead of
mixing steps); build a new gradient group there (and a new checkpoint group: the fault broke it
too) with the group timeout; restore the saved inputs and all-reduce them again in the original
order. Same ranks, same order, same buffers: the sums, and so the model, are bitwise those of a
fault-free run. On success the new group is the hook's from then on and the step goes on: no
recovery, no restart, no step lost.
Building the group or re-running the collective failing or timing out is a failed attempt,
and every rank's: after its part, each rank says in the store how it went and waits for the
others' word (:func:`agree`), so one whose part failed here (before a peer's rendezvous could
see it, say) does not go on to the next attempt's barrier alone, to time out there while its
peers still wait out the group timeout in this one. After ``MaxCnt`` failed attempts the step
fails (:class:`OpRetryExhausted`) and in-process recovery
takes over. While it waits the retrier polls the rank's recovery mailbox: a command (``pause``,
``rejoin``) means the manager is handling a bigger fault (a dead peer), so it stops at once
(:class:`OpRetryStopped`) and the step fails; a dead peer delays recovery by at most the waits.

The default process group is not rebuilt here: its collectives, when the step issues any, fail
next and :mod:`unbroken.worker.stepretry` rebuilds it then. Every re-execution is reported in
the heartbeat (``op_retries``, ``op_retry_*``) and logged.

The settings part of this module (:func:`op_retry_from_environ`, :func:`collective_level`)
imports no torch.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from typing import TYPE_CHECKING

from unbroken.spec.envknobs import KnobSyntaxError, parse_op_retry_enable, parse_op_retry_params
from unbroken.spec.knobs import OpRetry, RetryLevel

if TYPE_CHECKING:
    import torch
    import torch.distributed as dist

    from unbroken.worker import torchapi
    from unbroken.worker.torchapi import ProcessGroupGloo

logger = logging.getLogger(__name__)

ENABLE = "HCCL_OP_RETRY_ENABLE"
PARAMS = "HCCL_OP_RETRY_PARAMS"


#: Called in each re-execution once its group is built, before the all-reduce runs: the fault
#: injector's flapping link (:meth:`unbroken.worker.chaos.RankChaos.flap`) breaks it there.
def _no_fault() -> None:
    pass


before_attempt: Callable[[], None] = _no_fault


@dataclass(frozen=True)
class OpRetrySettings:
    """Op retry for the gradient group: the job's parameters and the group's level."""

    level: RetryLevel
    max_count: int
    hold_s: float
    interval_s: float


def collective_level(world_size: int, local_world_size: int) -> RetryLevel:
    """The level of a group of ``world_size`` ranks, ``local_world_size`` per node."""
    if world_size < 1 or local_world_size < 1:
        raise ValueError(
            f"a group needs at least one rank per node, got WORLD_SIZE={world_size}, "
            f"LOCAL_WORLD_SIZE={local_world_size}"
        )
    return RetryLevel.L1 if world_size > local_world_size else RetryLevel.L0


def _positive_int(environ: Mapping[str, str], name: str, default: int) -> int:
    raw = environ.get(name, "").strip()
    if not raw:
        return default
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"environment variable {name}={raw!r} is not a positive integer")
    return int(raw)


@dataclass(frozen=True)
class RetryConfig:
    """The job's op retry (``HCCL_OP_RETRY_*``) and where its nodes end, for groups of any
    ranks: the level of a group, and so whether its collectives are retried, depends on which
    nodes its ranks sit on (``rank // local_world_size``: one pod, one node)."""

    config: OpRetry
    local_world_size: int

    def level_of(self, ranks: Sequence[int]) -> RetryLevel:
        nodes = {rank // self.local_world_size for rank in ranks}
        return RetryLevel.L1 if len(nodes) > 1 else RetryLevel.L0

    def settings_for(self, ranks: Sequence[int]) -> OpRetrySettings | None:
        """Op retry for a group of global ``ranks``, or None when its level is off."""
        level = self.level_of(ranks)
        if not self.config.applies_to(level):
            return None
        c = self.config
        return OpRetrySettings(level, c.max_count, c.hold_s, c.interval_s)


def retry_config_from_environ(environ: Mapping[str, str]) -> RetryConfig | None:
    """The job's op retry, or None when ``HCCL_OP_RETRY_ENABLE`` is unset or enables no
    level. Raises :class:`ValueError` naming the variable."""
    enable = environ.get(ENABLE)
    if enable is None:
        return None
    try:
        enabled = parse_op_retry_enable(enable)
    except KnobSyntaxError as e:
        raise ValueError(
            f"environment variable {ENABLE}={enable!r}: {e.message} (expected {e.allowed})"
        ) from None
    params = environ.get(PARAMS)
    try:
        config = parse_op_retry_params(params, enabled) if params else OpRetry(enabled=enabled)
    except KnobSyntaxError as e:
        raise ValueError(
            f"environment variable {PARAMS}={params!r}: {e.message} (expected {e.allowed})"
        ) from None
    if not config.enabled:
        return None
    world_size = _positive_int(environ, "WORLD_SIZE", 1)
    local = _positive_int(environ, "LOCAL_WORLD_SIZE", world_size)
    collective_level(world_size, local)  # the same check of the two
    return RetryConfig(config, local)


def op_retry_from_environ(environ: Mapping[str, str]) -> OpRetrySettings | None:
    """Op retry for this rank's gradient all-reduce (every rank of the job), or None when its
    level is not enabled (or ``HCCL_OP_RETRY_ENABLE`` is unset). Raises :class:`ValueError`
    naming the variable."""
    retry = retry_config_from_environ(environ)
    if retry is None:
        return None
    world_size = _positive_int(environ, "WORLD_SIZE", 1)
    return retry.settings_for(range(world_size))


class OpRetryFailed(RuntimeError):
    """The re-execution of a failed gradient all-reduce did not succeed."""


class OpRetryExhausted(OpRetryFailed):
    """Every one of the ``MaxCnt`` re-executions failed."""


class OpRetryStopped(OpRetryFailed):
    """A recovery command arrived while retrying: the manager handles a bigger fault."""


@dataclass(frozen=True)
class OpRetryDone:
    """One successful re-execution, as the heartbeat reports it."""

    step: int
    attempt: int  # 1..max_count
    level: RetryLevel
    failed_at: float  # time.time() of the failure
    at: float  # time.time() of the success
    error: str  # what the failed collective said


def describe_error(error: BaseException) -> str:
    """An error in one line of at most 300 characters of text, for logs and heartbeats."""
    text = " ".join(str(error).split()) or type(error).__name__
    return f"{type(error).__name__}: {text[:300]}"


class OpRetrier:
    """Re-executes a step's failed gradient all-reduces (see the module doc).

    The owner (:class:`unbroken.worker.recovery.Recovery`) supplies the generation of the
    moment, a mailbox check, the rebuilding of its other groups (``regroup``, run in every
    attempt right after the new gradient group is up), and where to report.
    """

    def __init__(
        self,
        settings: OpRetrySettings,
        *,
        timeout_s: float,
        generation: Callable[[], int],
        interrupted: Callable[[], bool],
        regroup: Callable[[], None],
        report: Callable[[OpRetryDone], None],
        poll_interval_s: float = 0.02,
    ) -> None:
        self.settings = settings
        self.timeout_s = timeout_s
        self._generation = generation
        self._interrupted = interrupted
        self._regroup = regroup
        self._report = report
        self.poll_interval_s = poll_interval_s
        self.done = 0  # successful re-executions by this process
        self._rounds_generation = -1
        self._rounds = 0  # attempts made in the current generation

    def group(self, generation: int, name: str) -> ProcessGroupGloo:
        """A gloo group of every rank, of the hook's own (not registered with
        ``torch.distributed``: dropping the last reference closes its links, which is how a
        broken one is aborted), from the generation's store under ``op-retry/<generation>/``."""
        import torch.distributed as dist

        from unbroken.worker import torchapi

        store = torchapi.PrefixStore(f"op-retry/{generation}/{name}/", torchapi.default_store())
        return torchapi.gloo_group(
            store, dist.get_rank(), dist.get_world_size(), timedelta(seconds=self.timeout_s)
        )

    def reexecute(
        self,
        tensors: Sequence[torch.Tensor],
        inputs: Sequence[torch.Tensor],
        error: BaseException,
        step: int,
    ) -> ProcessGroupGloo:
        """All-reduce ``tensors`` again from their saved ``inputs`` over a new group; returns
        the group. The caller has dropped its references to the broken group (so that its
        links close). Raises :class:`OpRetryExhausted` or :class:`OpRetryStopped`."""
        import torch.distributed as dist

        from unbroken.worker import torchapi

        s = self.settings
        rank = dist.get_rank()
        failed_at = time.time()
        first = last = describe_error(error)
        group: ProcessGroupGloo | None = None
        works: list[dist.Work] = []
        for attempt in range(1, s.max_count + 1):
            group = None  # the failed group's last reference: its links close now
            works.clear()
            gc.collect()
            wait_s = s.hold_s if attempt == 1 else s.interval_s
            logger.warning(
                "rank %d: gradient all-reduce of step %d failed (%s); op retry %d/%d (%s) in "
                "%.2f s",
                rank,
                step,
                last,
                attempt,
                s.max_count,
                s.level,
                wait_s,
            )
            self._wait(wait_s, attempt, step)
            try:
                store, name = self._meet(step, attempt)
                error_here: Exception | None = None
                try:
                    group = self.group(self._generation(), f"{name}/pg")
                    self._regroup()  # the other groups the fault broke (checkpoints)
                    before_attempt()
                    for tensor, saved in zip(tensors, inputs, strict=True):
                        tensor.copy_(saved)
                    works.extend(torchapi.gloo_allreduce(group, t) for t in tensors)
                    error_here = wait_all(works)
                except OpRetryStopped:
                    raise
                except Exception as e:
                    error_here = e.with_traceback(None)
                if error_here is not None:
                    # This attempt's group goes before the others' word is awaited: its links
                    # close, so a peer still blocked in the all-reduce with this rank fails now
                    # rather than at the group's timeout.
                    group = None
                    gc.collect()
                agree(
                    store,
                    error_here,
                    2 * self.timeout_s,
                    partial(self._check, attempt, step),
                    self.poll_interval_s,
                )
            except OpRetryStopped:
                _drain(works)
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
                _drain(works)
                continue
            assert group is not None
            done = OpRetryDone(
                step=step,
                attempt=attempt,
                level=s.level,
                failed_at=failed_at,
                at=time.time(),
                error=first,
            )
            self.done += 1
            self._report(done)
            logger.warning(
                "rank %d: gradient all-reduce of step %d re-executed (op retry %d/%d, %s) "
                "%.3f s after it failed",
                rank,
                step,
                attempt,
                s.max_count,
                s.level,
                done.at - failed_at,
            )
            return group
        del group, works
        gc.collect()
        raise OpRetryExhausted(
            f"op retry exhausted: {s.max_count} re-execution(s) of the gradient all-reduce of "
            f"step {step} failed ({s.level}; last: {last}; first failure: {first})"
        )

    def _wait(self, wait_s: float, attempt: int, step: int) -> None:
        hold(wait_s, lambda: self._check(attempt, step), self.poll_interval_s)

    def _check(self, attempt: int, step: int) -> None:
        if self._interrupted():
            raise OpRetryStopped(
                f"op retry {attempt}/{self.settings.max_count} of step {step} stopped: a "
                "recovery command arrived (the manager is handling the fault)"
            )

    def _meet(self, step: int, attempt: int) -> tuple[torchapi.Store, str]:
        """Meet every rank in the generation's store; the attempt's store and name."""
        from unbroken.worker import torchapi

        generation = self._generation()
        if generation != self._rounds_generation:
            self._rounds_generation, self._rounds = generation, 0
        self._rounds += 1
        name = f"{self._rounds}/step-{step}"
        prefix = f"op-retry/{generation}/{name}/"
        store = torchapi.PrefixStore(prefix, torchapi.default_store())
        check = partial(self._check, attempt, step)
        meet(store, prefix, self.timeout_s, check, self.poll_interval_s)
        return store, name


def _wait_keys(
    store: torchapi.Store,
    keys: list[str],
    timeout_s: float,
    check: Callable[[], None],
    poll_interval_s: float,
    what: str,
) -> None:
    """Wait until every key is in ``store`` (``check`` raises to stop); TimeoutError naming
    the ranks whose key (the i-th is rank i's) did not come in ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not store.check(keys):
        check()
        if time.monotonic() >= deadline:
            missing = [r for r, key in enumerate(keys) if not store.check([key])]
            raise TimeoutError(f"rank(s) {missing} did not {what} within {timeout_s:.1f} s")
        time.sleep(poll_interval_s)


def meet(
    store: torchapi.Store,
    where: str,
    timeout_s: float,
    check: Callable[[], None],
    poll_interval_s: float,
    note: str = "1",
) -> list[bytes]:
    """An attempt's barrier: this rank's ``arrived/<rank>`` key (holding ``note``) in
    ``store``, then every rank's; their notes, in rank order."""
    import torch.distributed as dist

    rank, world_size = dist.get_rank(), dist.get_world_size()
    store.set(f"arrived/{rank}", note)
    keys = [f"arrived/{r}" for r in range(world_size)]
    _wait_keys(store, keys, timeout_s, check, poll_interval_s, f"reach {where}")
    return [bytes(store.get(key)) for key in keys]


def agree(
    store: torchapi.Store,
    error: Exception | None,
    timeout_s: float,
    check: Callable[[], None],
    poll_interval_s: float,
) -> None:
    """An attempt's end: this rank's outcome (``error``, None if its part succeeded) in
    ``store``, then every rank's. Returns when all succeeded; raises this rank's error, else an
    error naming the ranks whose part failed, else TimeoutError. So the ranks go to the next
    attempt together: a peer still blocked in this attempt (a rendezvous waiting for this rank,
    until the group timeout) is waited for, not left behind. ``timeout_s``: twice the group
    timeout covers a peer blocked that long."""
    import torch.distributed as dist

    rank, world_size = dist.get_rank(), dist.get_world_size()
    store.set(f"outcome/{rank}", "ok" if error is None else describe_error(error))
    keys = [f"outcome/{r}" for r in range(world_size)]
    _wait_keys(store, keys, timeout_s, check, poll_interval_s, "end the attempt")
    if error is not None:
        raise error
    failed = {
        r: text for r, key in enumerate(keys) if (text := bytes(store.get(key)).decode()) != "ok"
    }
    if failed:
        first = min(failed)
        raise RuntimeError(f"rank(s) {sorted(failed)} failed their part ({first}: {failed[first]})")


def hold(wait_s: float, check: Callable[[], None], poll_interval_s: float) -> None:
    """Wait ``wait_s`` (HoldTime or IntervalTime), calling ``check`` (which raises to stop)
    every ``poll_interval_s``."""
    deadline = time.monotonic() + wait_s
    while True:
        check()
        left = deadline - time.monotonic()
        if left <= 0:
            return
        time.sleep(min(poll_interval_s, left))


def wait_all(works: list[dist.Work]) -> Exception | None:
    """Wait for every work and forget them; the first error (None: all succeeded)."""
    error: Exception | None = None
    for work in works:
        try:
            work.wait()
        except Exception as e:
            # Without its traceback: the frames it holds would keep the work, and its group.
            error = error or e.with_traceback(None)
    works.clear()
    return error


def _drain(works: list[dist.Work]) -> None:
    error = wait_all(works)
    if error is not None:
        logger.debug("collective of a failed op retry: %s", error)
