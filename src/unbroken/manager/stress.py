"""Online stress tests of a running job: pause, check every device and link, act, resume.

``unbroken stress-test`` (the control plane's ``StressTest`` call) asks for one. Then:

1. **Pause.** Every rank is asked to stop at its next step boundary (the ``pause`` every
   in-process rung uses); it leaves its training group and waits.
2. **Test.** Once every rank stands still, a fresh store is opened for the test and every
   pod is told to run it (``stress``, :class:`~unbroken.protocol.messages.StressRanks`). Each
   rank checks its device and its links in a group of its own (:mod:`unbroken.worker.stress`)
   and writes its result to that store.
3. **Judge.** The results, or their absence by :data:`TEST_TIMEOUT_S`, go to the pure
   :func:`unbroken.policy.stress.judge`; the verdict, with the seed's result codes, is recorded
   (:class:`~unbroken.ledger.StressTested`) and printed.
4. **Act.** A rank with a fault found (code 2) becomes a ``stress-test`` fault of its pod and
   goes to the recovery ladder like any other fault: of its device when the device computed
   wrong, of its node when every link of the rank is slow (``recover`` moves the pod to a spare
   node, isolating the device or the node; the healthy ranks stay in their processes, already
   stopped). Without one, every rank rejoins a new generation in its own process, keeping its
   state (the replicas' agreement is checked as after every rejoin) and training goes on from
   the step it stopped at: no step is lost or redone.
5. **Resumed.** The first step committed after the test ends the pause;
   :class:`~unbroken.ledger.StressTestFinished` records how long training stood still.

A test is refused while a recovery is under way, before every rank runs, or when a rank cannot
be repaired in process (its training group cannot be left and rebuilt). A fault that comes
during the test gives the test up: the ladder's recovery goes first. A rank that gives no
result in time is reported with code 3 and the job resumes without it being isolated (the
ladder acts on it when it fails for real).

The steps are :class:`StressRun` values advanced by pure functions (:func:`advance`); the
:class:`StressTester` shell sends the orders, reads the store and records.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol

from unbroken.faults import Fault, FaultKind, FaultLevel
from unbroken.ledger import (
    Ledger,
    StressLinkResult,
    StressRankResult,
    StressTested,
    StressTestFinished,
)
from unbroken.manager.console import Console
from unbroken.manager.context import Context
from unbroken.manager.engine import Engine
from unbroken.manager.generations import Generations
from unbroken.manager.inprocess import InProcess
from unbroken.manager.layout import JobLayout
from unbroken.manager.pool import Pool
from unbroken.manager.rungs import STOP_TIMEOUT_S, RankSeen, Wait
from unbroken.policy.stress import StressVerdict, judge
from unbroken.protocol.messages import PauseRanks, StressRanks
from unbroken.protocol.stress import (
    RankStressResult,
    StressCode,
    StressProtocolError,
    decode_result,
    result_key,
)

log = logging.getLogger(__name__)

#: How long the ranks get to run the test once asked.
TEST_TIMEOUT_S = 30.0


# ---- the test as a value, and its pure steps ----------------------------------------------
@dataclass(frozen=True)
class StressRun:
    """A stress test under way. ``phase``: ``pausing`` (ranks asked to stop), ``testing``
    (ranks asked to test), ``resuming`` (verdict given, waiting for the first commit of a
    generation after ``generation``)."""

    round: int
    requested_at: float
    generation: int
    step: int
    deadline_at: float
    phase: str = "pausing"
    stopped_at: float = 0.0
    tested_at: float = 0.0
    code: StressCode = StressCode.OK
    recovered: bool = False


@dataclass(frozen=True)
class StartTest:
    """Every rank stands still (or the stop deadline passed): run the test."""

    all_stopped: bool


@dataclass(frozen=True)
class Judge:
    """Every result is in (or the test's deadline passed): judge what there is."""


def advance(
    run: StressRun, ranks: Iterable[RankSeen], have_results: Callable[[], bool], now: float
) -> Wait | StartTest | Judge:
    """What a stress test does next."""
    match run.phase:
        case "pausing":
            seen = [v for v in ranks if v.alive]
            stopped = bool(seen) and all(v.stopping for v in seen)
            if stopped or now >= run.deadline_at:
                return StartTest(all_stopped=stopped)
            return Wait()
        case "testing":
            if now >= run.deadline_at or have_results():
                return Judge()
            return Wait()
        case _:
            return Wait()


def refusal(
    *, finished: bool, busy: str, ranks: Mapping[int, Any], world_size: int, recoverable: bool
) -> str:
    """Why a stress test cannot start now ("" when it can)."""
    if finished:
        return "the job has ended"
    if busy:
        return busy
    if len(ranks) < world_size or not all(v.alive for v in ranks.values()):
        return f"not every rank is running yet ({len(ranks)} of {world_size})"
    if not recoverable:
        return (
            "a rank cannot be repaired in process, so its training group cannot be left for "
            "the test and rebuilt after it"
        )
    return ""


# ---- the shell --------------------------------------------------------------------------
class StressHost(Protocol):
    """What the tester needs of the job manager and its executor."""

    @property
    def generation(self) -> int: ...

    @property
    def finished(self) -> bool: ...

    def busy(self) -> str:
        """What the job is doing that a stress test must not cross ("" when nothing)."""
        ...

    def ranks_seen(self) -> Mapping[int, RankSeen]: ...

    def recoverable(self) -> bool: ...

    def committed(self) -> int: ...

    def pod_agents(self) -> Mapping[str, int]:
        """Every running pod's agent pid."""
        ...

    def send(self, pod: str, pid: int, order: PauseRanks | StressRanks) -> None: ...

    def open_store(self) -> tuple[Any, int]:
        """A fresh store for the test (on loopback) and its port."""
        ...

    def where(self, rank: int) -> tuple[str, str, int | None]:
        """Pod, node and device of ``rank``."""
        ...

    def rejoin_in_place(self, now: float) -> None:
        """Every rank rejoins a new generation in its own process, keeping its state."""
        ...

    def fault_detected(self, fault: Fault, now: float) -> None: ...


class StressTester:
    def __init__(self, host: StressHost, job: JobLayout, ledger: Ledger, console: Console) -> None:
        self.h = host
        self.job = job
        self.ledger = ledger
        self.console = console
        self.run: StressRun | None = None
        self.rounds = 0
        self._store: Any = None
        self._port = 0

    @property
    def under_way(self) -> bool:
        """Whether a test holds the ranks (pausing or testing; not once it resumes)."""
        return self.run is not None and self.run.phase in ("pausing", "testing")

    def request(self, now: float) -> tuple[int, str]:
        """Start a test; returns its round and what was done. Raises ``ValueError`` with the
        reason when it cannot start."""
        if self.run is not None:
            raise ValueError(f"stress test {self.run.round} is still under way")
        why = refusal(
            finished=self.h.finished,
            busy=self.h.busy(),
            ranks=self.h.ranks_seen(),
            world_size=self.job.world_size,
            recoverable=self.h.recoverable(),
        )
        if why:
            raise ValueError(f"no stress test now: {why}")
        self.rounds += 1
        step = self.h.committed()
        self.run = StressRun(
            round=self.rounds,
            requested_at=now,
            generation=self.h.generation,
            step=step,
            deadline_at=now + STOP_TIMEOUT_S,
        )
        for pod, pid in self.h.pod_agents().items():
            self.h.send(pod, pid, PauseRanks())
        detail = (
            f"stress test {self.rounds}: every rank stops at its next step boundary, then "
            "checks its device and its links"
        )
        self.console.line(detail)
        return self.rounds, detail

    def poll(self, now: float) -> None:
        run = self.run
        if run is None or run.phase == "resuming":
            return
        busy = self.h.busy()
        if busy:
            self.console.line(f"stress test {run.round} given up: {busy}")
            self.run = None
            self._drop_store()
            return
        match advance(run, self.h.ranks_seen().values(), self._have_results, now):
            case Wait():
                return
            case StartTest(all_stopped=all_stopped):
                self._start_test(run, all_stopped, now)
            case Judge():
                self._judge(run, now)

    def _start_test(self, run: StressRun, all_stopped: bool, now: float) -> None:
        if not all_stopped:
            self.console.line(f"stress test {run.round}: not every rank stopped in time")
        self._store, self._port = self.h.open_store()
        for pod, pid in self.h.pod_agents().items():
            self.h.send(pod, pid, StressRanks(round=run.round, master_port=self._port))
        seen = [v.committed for v in self.h.ranks_seen().values() if v.alive]
        self.run = replace(
            run,
            phase="testing",
            step=max(seen, default=run.step),
            stopped_at=now,
            deadline_at=now + TEST_TIMEOUT_S,
        )

    def _drop_store(self) -> None:
        store, self._store = self._store, None
        close = getattr(store, "close", None)  # a keeper's; torch's store ends unreferenced
        if callable(close):
            close()

    def _have_results(self) -> bool:
        run = self.run
        if run is None or self._store is None:
            return False
        keys = [result_key(run.round, r) for r in range(self.job.world_size)]
        return bool(self._store.check(keys))

    def _results(self, run: StressRun) -> dict[int, RankStressResult]:
        out: dict[int, RankStressResult] = {}
        for rank in range(self.job.world_size):
            key = result_key(run.round, rank)
            try:
                if not self._store.check([key]):
                    continue
                res = decode_result(bytes(self._store.get(key)))
            except (RuntimeError, StressProtocolError) as e:
                log.error(
                    "stress test %d: the result of rank %d is unreadable: %s", run.round, rank, e
                )
                continue
            if res.rank == rank:
                out[rank] = res
        return out

    def _judge(self, run: StressRun, now: float) -> None:
        results = self._results(run)
        self._drop_store()
        verdict = judge(results, self.job.world_size)
        stop_s = run.stopped_at - run.requested_at
        test_s = now - run.stopped_at
        self.ledger.record(self._event(run, verdict, results, stop_s, test_s), at=now)
        self._print(run, verdict, results, stop_s, test_s)
        self.run = replace(
            run,
            phase="resuming",
            tested_at=now,
            code=verdict.code,
            recovered=bool(verdict.faulty),
        )
        if not verdict.faulty:
            self.h.rejoin_in_place(now)
            return
        by_pod: dict[str, list[int]] = {}
        for r in verdict.faulty:
            by_pod.setdefault(self.h.where(r.rank)[0], []).append(r.rank)
        for pod, ranks in by_pod.items():
            # A device that computes wrong is isolated; a rank whose every link is slow takes
            # its node out (the seed's code 2: isolate the node), named by no device.
            bad_device = [
                r.rank for r in verdict.faulty if r.rank in ranks and r.device is StressCode.FAULT
            ]
            _, node, device = self.h.where(bad_device[0] if bad_device else ranks[0])
            if not bad_device:
                device = None
            reasons = "; ".join(
                f"rank {r.rank}: {r.reason}" for r in verdict.faulty if r.rank in ranks
            )
            self.h.fault_detected(
                Fault(
                    kind=FaultKind.STRESS_TEST,
                    level=FaultLevel.SEPARATE_NPU,
                    code=f"stress-{StressCode.FAULT.value}",
                    at=now,
                    node=node,
                    pod=pod,
                    ranks=tuple(ranks),
                    device=device,
                    detail=f"stress test {run.round} found a fault (code 2): {reasons}",
                    step=run.step,
                ),
                now,
            )

    def _event(
        self,
        run: StressRun,
        verdict: StressVerdict,
        results: Mapping[int, RankStressResult],
        stop_s: float,
        test_s: float,
    ) -> StressTested:
        rows = []
        for v in verdict.ranks:
            pod, node, device = self.h.where(v.rank)
            res = results.get(v.rank)
            rows.append(
                StressRankResult(
                    rank=v.rank,
                    pod=pod,
                    node=node,
                    device=device,
                    device_code=int(v.device),
                    link_code=int(v.link),
                    checksum=res.checksum if res is not None else "",
                    reason=v.reason,
                )
            )
        return StressTested(
            round=run.round,
            step=run.step,
            code=int(verdict.code),
            ranks=tuple(rows),
            links=tuple(
                StressLinkResult(a=x.a, b=x.b, gbps=x.gbps, code=int(x.code), reason=x.reason)
                for x in verdict.links
            ),
            median_gbps=verdict.median_gbps,
            faulty=tuple(r.rank for r in verdict.faulty),
            stop_s=stop_s,
            test_s=test_s,
        )

    def _print(
        self,
        run: StressRun,
        verdict: StressVerdict,
        results: Mapping[int, RankStressResult],
        stop_s: float,
        test_s: float,
    ) -> None:
        c = self.console
        c.line(
            f"stress test {run.round} at step {run.step}: code {int(verdict.code)} "
            f"({verdict.code.meaning}); ranks stopped in {stop_s:.2f} s, tested in {test_s:.2f} s"
        )
        for v in verdict.ranks:
            _pod, node, device = self.h.where(v.rank)
            res = results.get(v.rank)
            where = f"{node} device {device}" if device is not None else node
            c.line(
                f"  rank {v.rank} ({where}): aic {int(v.device)}, p2p {int(v.link)}"
                + (f", checksum {res.checksum}" if res is not None else "")
                + (f": {v.reason}" if v.reason else "")
            )
        for x in verdict.links:
            c.line(
                f"  link {x.a}-{x.b}: {x.gbps:.2f} GB/s, code {int(x.code)}"
                + (f": {x.reason}" if x.reason else "")
            )
        c.line(f"  median link {verdict.median_gbps:.2f} GB/s")

    def resumed(self, generation: int, first_commit_at: float, step: int) -> None:
        """Generation ``generation`` committed ``step``, its first: the pause is over when the
        generation began after the test's."""
        run = self.run
        if run is None or run.phase != "resuming" or generation <= run.generation:
            return
        self.run = None
        paused_s = first_commit_at - run.requested_at
        stop_s = run.stopped_at - run.requested_at
        test_s = run.tested_at - run.stopped_at
        resume_s = first_commit_at - run.tested_at
        self.ledger.record(
            StressTestFinished(
                round=run.round,
                generation=generation,
                step=step,
                code=int(run.code),
                paused_s=paused_s,
                stop_s=stop_s,
                test_s=test_s,
                resume_s=resume_s,
                recovered=run.recovered,
            ),
            at=first_commit_at,
        )
        self.console.line(
            f"stress test {run.round} done: training stood still {paused_s:.2f} s (stop "
            f"{stop_s:.2f} s, test {test_s:.2f} s, "
            + ("recovery" if run.recovered else "rejoin")
            + f" {resume_s:.2f} s); step {step} committed by generation {generation}"
        )


class ManagerStressHost:
    """:class:`StressHost` over the job manager's parts; faults found go to ``report`` (the
    manager's loop, which records and decides them)."""

    def __init__(
        self,
        ctx: Context,
        generations: Generations,
        engine: Engine,
        pool: Pool,
        inprocess: InProcess,
        busy: Callable[[], str],
        finished: Callable[[], bool],
        rejoin: Callable[[float], None],
        report: Callable[[Fault, float], None],
    ) -> None:
        self.ctx = ctx
        self.gens = generations
        self.engine = engine
        self.pool = pool
        self.inprocess = inprocess
        self._busy = busy
        self._finished = finished
        self._rejoin = rejoin
        self._report = report

    @property
    def generation(self) -> int:
        return self.gens.current

    @property
    def finished(self) -> bool:
        return self._finished()

    def busy(self) -> str:
        return self._busy()

    def ranks_seen(self) -> Mapping[int, RankSeen]:
        return self.inprocess.seen()

    def recoverable(self) -> bool:
        return self.inprocess.recoverable()

    def committed(self) -> int:
        return self.gens.committed()

    def pod_agents(self) -> Mapping[str, int]:
        return {p.pod: p.pid for p in self.engine.running()}

    def send(self, pod: str, pid: int, order: PauseRanks | StressRanks) -> None:
        self.ctx.commands.send(pod, pid, order)

    def open_store(self) -> tuple[Any, int]:
        store = self.engine.host_store(0)
        return store, int(store.port)

    def where(self, rank: int) -> tuple[str, str, int | None]:
        job = self.ctx.job
        pod = job.pod_of_rank(rank) or ""
        binding = self.pool.binding(pod)
        if not pod or binding is None:
            return pod, "", None
        local = rank - min(job.ranks_of(pod))
        devices = binding.devices
        return pod, binding.node, devices[local] if local < len(devices) else None

    def rejoin_in_place(self, now: float) -> None:
        """Every rank, stopped at a step boundary, rejoins a new generation in its own
        process with its own state."""
        self._rejoin(now)

    def fault_detected(self, fault: Fault, now: float) -> None:
        self._report(fault, now)
