"""Hang detection: a rank is hung when neither its liveness tick nor its steps moved for three
of its own step times.

The step time is measured online, by the agent, from the commits it sees in the rank's
heartbeat record (:class:`StepClock`): the interval between commits, so everything a step
period holds (data loading, a checkpoint between steps) is in it. A fixed timeout is either
slow for a fast job or wrong for a slow one; three step times catch a hang within three steps
whatever the job.

Two conditions, both needed (:func:`hung`): the tick stopped (a SIGSTOPped or wedged
interpreter; a rank blocked in a gloo collective keeps ticking, since gloo releases the GIL)
and the progress stopped (no step started or committed). A healthy rank on two loaded cores
can starve its tick thread for a moment, but it keeps stepping.

Three step times hold for a *stopped* process (SIGSTOP, a frozen cgroup: the kernel says so).
A process that runs or sleeps with its tick stopped holds the GIL in a C call, and some of
those calls are bounded waits of a healthy rank: building a new process group after an op
retry (gloo connects to every peer with the GIL held), a peer that is slow to join. Such a
rank gets ``startup_s`` at least (:func:`timeout_for`), so only a wedge that outlasts it is
a hang.

Pure but for :func:`hang_timeout_s`, which reads the process state from ``/proc``; the agent
(:mod:`unbroken.agent.managed`) reads the heartbeat files and the clock.
"""

from __future__ import annotations

from dataclasses import dataclass

from unbroken.protocol.heartbeat import HeartbeatRecord, Phase

#: Weight of a new interval in the step time's moving average: a few steps to follow a job
#: whose pace changes, without one slow step (a checkpoint) swinging it.
EWMA_WEIGHT = 0.3


@dataclass(frozen=True)
class HangSettings:
    """``factor`` step times of silence are a hang: never less than ``floor_s`` for a stopped
    process, never less than ``startup_s`` for one that runs or sleeps holding the GIL, and
    ``startup_s`` before a rank's step time is known (no two commits seen yet: its start, the
    first step after a recovery).

    ``floor_s`` is there for jitter only: the worker ticks every 0.1 s and the agent reads
    every 0.02 s, and on a loaded two-core machine a runnable process can wait a few hundred
    milliseconds for a core. Half a second is five missed ticks, above that wait and below
    three steps of any job whose steps take more than about 0.17 s.
    """

    factor: float = 3.0
    floor_s: float = 0.5
    startup_s: float = 3.0

    def __post_init__(self) -> None:
        if self.factor <= 0 or self.floor_s <= 0 or self.startup_s <= 0:
            raise ValueError(f"hang settings must be > 0: {self}")


@dataclass(frozen=True)
class StepClock:
    """One rank process's step time as its agent measured it. A clock belongs to one process
    and one recovery of it: a new process or an in-process recovery starts a new clock (the
    time between the last commit before a fault and the first after is no step time)."""

    pid: int
    recoveries: int
    state_loaded_at: float
    committed: int
    committed_at: float
    step_s: float = 0.0  # 0.0: not known yet

    @staticmethod
    def of(record: HeartbeatRecord) -> StepClock:
        return StepClock(
            pid=record.pid,
            recoveries=record.recoveries,
            state_loaded_at=record.state_loaded_at,
            committed=record.committed,
            committed_at=record.committed_at,
        )

    def observe(self, record: HeartbeatRecord) -> StepClock:
        """The clock after reading ``record``."""
        if (
            record.pid != self.pid
            or record.recoveries != self.recoveries
            or record.state_loaded_at != self.state_loaded_at
        ):
            return StepClock.of(record)
        steps = record.committed - self.committed
        if steps <= 0 or record.committed_at <= self.committed_at:
            return self
        if self.committed_at <= 0.0:  # the first commit this clock sees: no interval yet
            return StepClock.of(record)
        sample = (record.committed_at - self.committed_at) / steps
        step_s = (
            sample
            if self.step_s == 0.0
            else (EWMA_WEIGHT * sample + (1 - EWMA_WEIGHT) * self.step_s)
        )
        return StepClock(
            pid=self.pid,
            recoveries=self.recoveries,
            state_loaded_at=self.state_loaded_at,
            committed=record.committed,
            committed_at=record.committed_at,
            step_s=step_s,
        )


def timeout_for(clock: StepClock | None, settings: HangSettings, *, stopped: bool) -> float:
    """How long a rank may stay silent (tick and progress) before it is hung; ``stopped``:
    its process is stopped (see the module docstring)."""
    if clock is None or clock.step_s <= 0.0:
        return settings.startup_s
    least = settings.floor_s if stopped else settings.startup_s
    return max(least, settings.factor * clock.step_s)


def process_stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped (``T``/``t`` in ``/proc/<pid>/stat``); False when
    that cannot be read (the process is gone, or no ``/proc``)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    # The command name (field 2) is in parentheses and may hold spaces: the state follows it.
    state = stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3]
    return state in (b"T", b"t")


def hang_timeout_s(clock: StepClock | None, settings: HangSettings) -> float:
    """:func:`timeout_for` the process of ``clock`` as it is now."""
    stopped = clock is not None and process_stopped(clock.pid)
    return timeout_for(clock, settings, stopped=stopped)


@dataclass(frozen=True)
class Silence:
    """A rank found hung: silent this long, past this timeout."""

    silent_s: float
    timeout_s: float


def hung(record: HeartbeatRecord, timeout_s: float, now: float) -> Silence | None:
    """Whether ``record``'s rank is hung at ``now``: its tick *and* its progress are older than
    ``timeout_s``. A stamp not yet written (0.0) counts from the process's start, never from
    the epoch: a record without them says nothing of a hang."""
    stale_s = now - (record.tick_at or record.started_at or now)
    progress_at = max(record.step_at, record.committed_at) or record.started_at or now
    if stale_s > timeout_s and now - progress_at > timeout_s:
        return Silence(silent_s=stale_s, timeout_s=timeout_s)
    return None


def blocked(record: HeartbeatRecord, now: float) -> bool:
    """Whether a rank asked to stop cannot act on it (blocked in a collective, or stopped): its
    tick is half a second old, or it made no progress for four of its steps (two seconds at
    least). A rank that saw its step fail and is stopping (writing last words) is acting."""
    if record.phase is Phase.STOPPING and record.failed_at >= record.step_at > 0:
        return False
    step_s = max(record.step_time_s, 0.05)
    progress_at = max(record.step_at, record.committed_at, record.state_loaded_at)
    return now - record.tick_at > 0.5 or now - progress_at > max(2.0, 4 * step_s)
