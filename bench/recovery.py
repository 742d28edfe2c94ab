"""Recovery benchmark: one rank SIGKILLed mid-run, under Unbroken and under plain torchrun.

Every configuration trains the same job: ``examples/train_mlp.py`` (through ``bench/steplog.py``,
which adds a per-step progress log) on 2 "nodes" x 2 processes, DDP on gloo, ``--steps`` steps,
a checkpoint every ``--ckpt-every`` steps, a ``--step-sleep`` of extra compute per step. Rank 3
SIGKILLs itself right after committing step ``--kill-step``. Configurations:

=================  =========================================================================
unbroken-job       ``unbroken run bench/jobs/job-level.yaml`` (fault-scheduling force,
                   fault-retry-times 3): the whole job is rescheduled
unbroken-pod       ``bench/jobs/pod-level.yaml`` (+ pod-rescheduling on): the faulty pod only
unbroken-inpod     ``bench/jobs/in-pod.yaml`` (no fault-scheduling): the agents restart ranks
unbroken-rip       ``bench/jobs/recover-in-place.yaml`` (fault-scheduling grace,
                   recover-strategy recover-in-place): the dead rank alone gets a new process
                   (the agent's warm standby); the healthy ranks keep theirs, rejoin a new
                   rendezvous generation in process and redo the interrupted step
unbroken-recover   ``bench/jobs/recover.yaml`` (grace, pod-rescheduling on, recover-strategy
                   recover): the faulty pod is placed again, the other pod's ranks keep their
                   processes; which rung the policy took is read from the ledger
unbroken-retry     ``bench/jobs/retry.yaml`` (grace, recover-strategy retry), with a different
                   fault: a device memory error in rank 3 (``{kind: memory}``), the fault retry
                   is for (a SIGKILLed rank has no process to retry in); no process restarts
unbroken-dump      ``bench/jobs/dump.yaml`` (grace, pod-rescheduling on, recover-strategy
                   dump): a healthy replica writes the interrupted step's state as the job's
                   checkpoint (last words), then the faulty pod is rescheduled and every rank
                   resumes from it rather than from the newest periodic checkpoint
torchrun           two ``torchrun --max-restarts 3 --monitor-interval 1`` agents joined by a
                   c10d rendezvous on 127.0.0.1, torch's defaults
torchrun-nss       the same with ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` (the workaround for
                   restarted ranks reading dead ranks' addresses from the shared store)
=================  =========================================================================

plus one fault-free baseline per tool (its final digest and step time). Unbroken fires the kill
with its own chaos entry ``{kind: kill, rank: 3, at_step: K}``; under torchrun the step log's
``BENCH_KILL=3:K`` does the same at the same spot (torchrun has no such hook). The retry
configuration's ``{kind: memory, rank: 3, at_step: K}`` fires at the same spot too.

Measured per run, the same way for every tool, from the ranks' step logs and the launchers'
output lines (time-stamped on arrival here):

- *fault*: when rank 3 committed step K (it dies, or its memory is corrupted, microseconds
  later);
- *detection*: fault -> the launcher's first reaction (Unbroken: the ledger's ``FaultDetected``
  record; torchrun: the first agent line ``failed (exitcode ...)``, ``Worker group FAILED`` or
  ``Sending process ... closing signal``);
- *MTTR*: fault -> every one of the 4 ranks committed a step after the fault (a rank given a
  new process: that process's first step; a rank that kept its process: its first step past K);
- *steps recomputed*: K minus the step the new processes resumed from (with none: the step the
  surviving ones went back to and redid);
- *equal*: the final model digest equals the same tool's fault-free digest.

For Unbroken the ledger's own figures (``unbroken.ledger.incidents``: detection
``FaultDetected.at - occurred_at``, MTTR, recomputed steps, phases) are reported beside them,
with the policy's decision (``DecisionMade``), where a replacement pod was placed
(``PodPlaced``), and which ranks kept their process: the pid of each rank in the final status
snapshot against the one its generation-0 ``ProcessesStarted`` record gave, cross-checked with
the step logs (a process that started before the fault and committed steps after it).

A faulted run that has not recovered ``--recovery-timeout`` seconds after the fault is stopped
and counted as not recovered. Every process a run starts is killed by pid at its end.

    OMP_NUM_THREADS=1 .venv/bin/python bench/recovery.py [--repeats 3] [--steps 200]
        [--kill-step 110] [--ckpt-every 20] [--out results.json] [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.metadata
import itertools
import json
import os
import platform
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

import yaml

HERE = Path(__file__).resolve().parent
JOBS = HERE / "jobs"
STEPLOG = HERE / "steplog.py"
WORLD = 4
VICTIM = 3
SCRIPT_NAME = "steplog.py"  # the job YAMLs name the training script by this file name

# torchrun's agent reacting to a dead worker (elastic/multiprocessing/api.py, agent/server/api.py)
TORCHRUN_REACTION = re.compile(r"failed \(exitcode|Worker group (FAILED|UNHEALTHY)|closing signal")


@dataclass(frozen=True)
class Config:
    key: str
    label: str
    tool: str  # "unbroken" or "torchrun"
    job: str | None = None  # YAML under bench/jobs (unbroken)
    no_share_store: bool = False  # torchrun: TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1
    fault: str = "kill"  # the chaos kind fired in rank 3 after step K (Unbroken only)


CONFIGS: tuple[Config, ...] = (
    Config("unbroken-job", "Unbroken job-level rescheduling", "unbroken", "job-level.yaml"),
    Config("unbroken-pod", "Unbroken pod-level rescheduling", "unbroken", "pod-level.yaml"),
    Config("unbroken-inpod", "Unbroken in-pod restart", "unbroken", "in-pod.yaml"),
    Config("unbroken-rip", "Unbroken recover-in-place", "unbroken", "recover-in-place.yaml"),
    Config("unbroken-recover", "Unbroken recover", "unbroken", "recover.yaml"),
    Config(
        "unbroken-retry",
        "Unbroken retry (device memory error)",
        "unbroken",
        "retry.yaml",
        fault="memory",
    ),
    Config("unbroken-dump", "Unbroken dump, then pod-level", "unbroken", "dump.yaml"),
    Config("torchrun", "torchrun (defaults)", "torchrun"),
    Config(
        "torchrun-nss",
        "torchrun + TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1",
        "torchrun",
        no_share_store=True,
    ),
)
BASELINES: tuple[Config, ...] = (
    Config("unbroken", "Unbroken (job-level.yaml, no fault)", "unbroken", "job-level.yaml"),
    Config("torchrun", "torchrun (defaults, no fault)", "torchrun"),
)


@dataclass(frozen=True)
class Settings:
    repeats: int
    steps: int
    kill_step: int
    ckpt_every: int
    step_sleep_s: float
    recovery_timeout_s: float
    run_timeout_s: float

    @property
    def expected_recomputed(self) -> int:
        """Steps recomputed by a restart from the newest checkpoint (process-level: none)."""
        return self.kill_step - (self.kill_step // self.ckpt_every) * self.ckpt_every

    def script_args(self) -> list[str]:
        return [
            f"--steps={self.steps}",
            "--ckpt-dir=checkpoints",
            f"--ckpt-every={self.ckpt_every}",
            f"--step-sleep={self.step_sleep_s}",
            "--result=result.json",
        ]


@dataclass
class RunResult:
    config: str
    repeat: int
    faulted: bool
    run_dir: str
    exit_code: int | None = None
    finished: bool = False  # the launcher exited 0 and a result was written
    stopped: str = ""  # why the benchmark stopped the run early, if it did
    wall_s: float | None = None  # launch -> launcher exit
    digest: str | None = None
    equal: bool | None = None  # digest == the tool's fault-free digest
    step_ms: float | None = None  # median step time of rank 0 before any fault
    fault_at: float | None = None
    detect_s: float | None = None
    detect_line: str = ""
    recovered: bool = False
    mttr_s: float | None = None
    resumed_from: int | None = None
    recomputed: int | None = None
    restart_rounds: int = 0  # times the ranks were (re)started after the fault
    new_ranks: tuple[int, ...] = ()  # ranks given a new process after the fault (step logs)
    kept_ranks: tuple[int, ...] = ()  # ranks whose process trained on through it (step logs)
    redone: int = 0  # most steps one process ran, then redid instead of committing (step logs)
    began_s: float | None = None  # fault -> every new process running the script
    loop_s: float | None = None  # fault -> every new process in the training loop
    ledger: dict[str, Any] = field(default_factory=dict)
    load_avg: tuple[float, float] = (0.0, 0.0)  # 1-minute load average at start and end


# -- processes --------------------------------------------------------------------------------


def _proc_table() -> dict[int, tuple[int, int]]:
    """pid -> (ppid, start time in clock ticks), from /proc."""
    table: dict[int, tuple[int, int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        table[int(entry.name)] = (int(fields[1]), int(fields[19]))
    return table


class Tracker:
    """Remembers every descendant of the processes it is given, so that all of them can be
    killed by pid at the end, orphans included (torchrun starts workers in their own sessions).
    A pid is only signalled while its start time is still the remembered one."""

    def __init__(self) -> None:
        self.roots: list[int] = []
        self.seen: dict[int, int] = {}  # pid -> start time
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def add_root(self, pid: int) -> None:
        with self._lock:
            self.roots.append(pid)
        self.scan()

    def scan(self) -> None:
        table = _proc_table()
        children: dict[int, list[int]] = {}
        for pid, (ppid, _) in table.items():
            children.setdefault(ppid, []).append(pid)
        with self._lock:
            todo = list(self.roots)
            while todo:
                pid = todo.pop()
                if pid in table:
                    self.seen.setdefault(pid, table[pid][1])
                todo.extend(children.get(pid, ()))

    def _watch(self) -> None:
        while not self._stop.wait(0.2):
            self.scan()

    def alive(self) -> list[int]:
        table = _proc_table()
        with self._lock:
            return [p for p, st in self.seen.items() if table.get(p, (0, -1))[1] == st]

    def kill_all(self, deadline_s: float = 10.0) -> list[int]:
        """SIGKILL every remembered process still alive; the pids that were."""
        self.scan()
        self._stop.set()
        self._thread.join()
        victims = [p for p in self.alive() if p != os.getpid()]
        for pid in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        end = time.monotonic() + deadline_s
        while self.alive() and time.monotonic() < end:
            time.sleep(0.05)
        return victims


class Tapped:
    """A child process whose output lines are time-stamped on arrival and saved to a log."""

    def __init__(self, cmd: Sequence[str], log: Path, env: dict[str, str], cwd: Path) -> None:
        self.lines: list[tuple[float, str]] = []
        self._log: TextIO = open(log, "w")  # noqa: SIM115
        self.proc = subprocess.Popen(
            list(cmd),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=cwd,
            text=True,
            errors="replace",
            start_new_session=True,
        )
        self._thread = threading.Thread(target=self._pump, daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            now = time.time()
            self.lines.append((now, line.rstrip("\n")))
            self._log.write(f"{now:.6f} {line}")
        self._log.flush()

    def close(self) -> None:
        self._thread.join(timeout=5)
        self._log.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _base_env() -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("BENCH_KILL", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE")
        and not k.startswith(("UNBROKEN_", "TORCHELASTIC_"))
    }
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    return env


# -- step logs ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Incarnation:
    """One training process: its rank and its step log lines."""

    rank: int
    pid: int
    began_at: float  # the script ran (torch imported)
    started_at: float | None  # the training loop began (state restored); None: never
    start_step: int
    done: tuple[tuple[float, int], ...]  # (when, steps committed)
    killed_at: float | None
    redone: int = 0  # "done" lines dropped: the step's body ran, then the step was redone
    redo_from: int | None = None  # the lowest step this process went back to and redid


def committed_lines(
    lines: Iterable[tuple[float, int]],
) -> tuple[list[tuple[float, int]], int, int | None]:
    """The ``done`` lines of committed steps, how many were dropped, the lowest step redone.

    The step log writes ``done n`` when the body of step ``n - 1`` returns; the session commits
    the step right after, unless the step failed (a peer died inside its collectives, its own
    state is corrupt) and the rank recovered in process: then it yields the same step again
    and its ``done n`` repeats. A line followed by one with the same or a lower count was not
    committed; the later line's step was redone."""
    kept: list[tuple[float, int]] = []
    dropped = 0
    redo_from: int | None = None
    for when, n in lines:
        if kept and kept[-1][1] >= n:
            redo_from = n - 1 if redo_from is None else min(redo_from, n - 1)
        while kept and kept[-1][1] >= n:
            kept.pop()
            dropped += 1
        kept.append((when, n))
    return kept, dropped, redo_from


def read_steplogs(log_dir: Path) -> list[Incarnation]:
    found = []
    for path in sorted(log_dir.glob("rank*-*.log")):
        m = re.fullmatch(r"rank(\d+)-(\d+)\.log", path.name)
        if m is None:
            continue
        marks: dict[str, tuple[float, int]] = {}
        done: list[tuple[float, int]] = []
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) != 3 or not parts[2].isdigit():
                continue  # a line cut short by the kill
            when, kind, value = float(parts[0]), parts[1], int(parts[2])
            if kind == "done":
                done.append((when, value))
            else:
                marks.setdefault(kind, (when, value))
        if "begin" not in marks:
            continue
        start = marks.get("start")
        committed, redone, redo_from = committed_lines(done)
        found.append(
            Incarnation(
                rank=int(m[1]),
                pid=int(m[2]),
                began_at=marks["begin"][0],
                started_at=start[0] if start else None,
                start_step=start[1] if start else 0,
                done=tuple(committed),
                killed_at=marks["kill"][0] if "kill" in marks else None,
                redone=redone,
                redo_from=redo_from,
            )
        )
    return found


def fault_time(incs: Iterable[Incarnation], kill_step: int) -> float | None:
    """When the victim committed the kill step (the kill itself follows within microseconds)."""
    times = []
    for inc in incs:
        if inc.rank != VICTIM:
            continue
        if inc.killed_at is not None:
            return inc.killed_at
        times += [t for t, n in inc.done if n == kill_step]
    return min(times) if times else None


@dataclass(frozen=True)
class Recovery:
    restart_rounds: int  # processes started per rank after the fault (the most of any rank)
    resumed_from: int | None  # the step the new processes started at, or the kept ones redid
    new_ranks: tuple[int, ...]  # ranks given a new process after the fault
    kept_ranks: tuple[int, ...]  # ranks whose process from before the fault trained on
    began_s: float | None  # fault -> every rank without a surviving process runs the script
    loop_s: float | None  # fault -> ... and is in its training loop (state restored)
    mttr_s: float | None  # fault -> every rank committed a step


def _every(ranks: Iterable[int], at: dict[int, float], fault_at: float) -> float | None:
    """fault -> the last of ``ranks`` to reach ``at``; None if one never did or none need to."""
    wanted = list(ranks)
    if not wanted or any(r not in at for r in wanted):
        return None
    return max(at[r] for r in wanted) - fault_at


def recovery(incs: Sequence[Incarnation], fault_at: float, kill_step: int) -> Recovery:
    """MTTR: fault -> every rank committed a step after the fault. A rank given a new process
    counts that process's first step (its old one's lines after the fault are ignored); a rank
    that kept its process counts that process's first committed step past the kill step."""
    after = [i for i in incs if i.began_at > fault_at]
    new = {i.rank for i in after}
    began: dict[int, float] = {}
    loop: dict[int, float] = {}
    first: dict[int, float] = {}
    for inc in after:
        began[inc.rank] = min(began.get(inc.rank, inc.began_at), inc.began_at)
        if inc.started_at is not None:
            loop[inc.rank] = min(loop.get(inc.rank, inc.started_at), inc.started_at)
    for inc in incs:
        restarted = inc.began_at > fault_at
        if inc.rank in new and not restarted:
            continue
        for when, n in inc.done:
            if when > fault_at and (restarted or n > kill_step):
                first[inc.rank] = min(first.get(inc.rank, when), when)
                break
    kept = sorted(r for r in first if r not in new)
    needed = [r for r in range(WORLD) if r not in kept]
    rounds = max((sum(1 for i in after if i.rank == r) for r in range(WORLD)), default=0)
    starts = [i.start_step for i in after if i.done]
    starts += [
        i.redo_from
        for i in incs
        if i.rank in kept and i.began_at <= fault_at and i.redo_from is not None
    ]
    resumed = min(starts, default=None)
    return Recovery(
        restart_rounds=rounds,
        resumed_from=resumed,
        new_ranks=tuple(sorted(new)),
        kept_ranks=tuple(kept),
        began_s=_every(needed, began, fault_at),
        loop_s=_every(needed, loop, fault_at),
        mttr_s=_every(range(WORLD), first, fault_at),
    )


def step_ms(incs: Iterable[Incarnation], before: float | None) -> float | None:
    times = [
        t for inc in incs if inc.rank == 0 for t, _ in inc.done if before is None or t < before
    ]
    times.sort()
    gaps = [b - a for a, b in itertools.pairwise(times)]
    return statistics.median(gaps) * 1000 if gaps else None


# -- launching ----------------------------------------------------------------------------------


def render_job(config: Config, s: Settings, run_dir: Path) -> Path:
    """The config's job YAML with this run's training arguments and an absolute script path."""
    assert config.job is not None
    doc = yaml.safe_load((JOBS / config.job).read_text())
    for replica in doc["spec"]["replicaSpecs"].values():
        for container in replica["template"]["spec"]["containers"]:
            cmd = [str(c) for c in container["command"]]
            at = next(i for i, c in enumerate(cmd) if Path(c).name == SCRIPT_NAME)
            container["command"] = [*cmd[:at], str(STEPLOG), *s.script_args()]
    path = run_dir / "job.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def launch_unbroken(
    config: Config, s: Settings, run_dir: Path, faulted: bool, tracker: Tracker
) -> list[Tapped]:
    job = render_job(config, s, run_dir)
    cmd = [sys.executable, "-m", "unbroken", "run", str(job), "--run-dir", str(run_dir)]
    if faulted:
        chaos = run_dir / "chaos.yaml"
        fault = {"kind": config.fault, "rank": VICTIM, "at_step": s.kill_step}
        chaos.write_text(yaml.safe_dump({"faults": [fault]}))
        cmd += ["--chaos", str(chaos)]
    cmd.append("--quiet")
    tap = Tapped(cmd, run_dir / "unbroken-run.log", _base_env(), run_dir)
    tracker.add_root(tap.proc.pid)
    return [tap]


def launch_torchrun(
    config: Config, s: Settings, run_dir: Path, faulted: bool, tracker: Tracker
) -> list[Tapped]:
    env = _base_env()
    if config.no_share_store:
        env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    if faulted:
        env["BENCH_KILL"] = f"{VICTIM}:{s.kill_step}"
    port = _free_port()
    taps = []
    for node in range(2):
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes=2",
            "--nproc-per-node=2",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{port}",
            f"--rdzv-id=bench{port}",
            f"--rdzv-conf=is_host={int(node == 0)}",
            "--local-addr=127.0.0.1",
            "--max-restarts=3",
            "--monitor-interval=1",
            str(STEPLOG),
            *s.script_args(),
        ]
        tap = Tapped(cmd, run_dir / f"agent{node}.log", env, run_dir)
        tracker.add_root(tap.proc.pid)
        taps.append(tap)
    return taps


def _ledger_figures(run_dir: Path) -> dict[str, Any]:
    """The ledger's view of a run: its first incident, the policy's decisions, where pods were
    placed after the fault, and which ranks kept their process (final status vs generation 0)."""
    from unbroken.ledger import (
        DecisionMade,
        FaultDetected,
        Ledger,
        LedgerError,
        PodPlaced,
        ProcessesStarted,
        incidents,
    )

    try:
        ledger = Ledger(run_dir / "ledger.db", create=False)
    except LedgerError as exc:
        return {"error": str(exc)}
    try:
        records = ledger.events()
        status = ledger.status()
    finally:
        ledger.close()
    found = incidents(records)
    detected = [r for r in records if r.kind == FaultDetected.kind]
    out: dict[str, Any] = {"incidents": len(found)}
    first_pids: dict[int, int] = {}
    for r in records:
        if r.kind == ProcessesStarted.kind and r.data["generation"] == 0:
            first_pids.update(zip(r.data["ranks"], r.data["pids"], strict=True))
    if detected:
        fault_id = detected[0].id
        out["fault_detected_at"] = detected[0].at
        later = [r for r in records if r.id > fault_id]
        out["decisions"] = [
            {k: r.data[k] for k in ("strategy", "commands", "reason")}
            for r in later
            if r.kind == DecisionMade.kind
        ]
        nodes_before = {
            r.data["node"] for r in records if r.kind == PodPlaced.kind and r.id < fault_id
        }
        out["placed"] = [
            {
                "pod": r.data["pod"],
                "node": r.data["node"],
                "spare": r.data["node"] not in nodes_before,
            }
            for r in later
            if r.kind == PodPlaced.kind
        ]
        out["started_ranks"] = sorted(
            {rank for r in later if r.kind == ProcessesStarted.kind for rank in r.data["ranks"]}
        )
    if status is not None and first_pids:
        final = {rank: pid for p in status.pods for rank, pid in zip(p.ranks, p.pids, strict=True)}
        out["kept_ranks"] = sorted(r for r, pid in first_pids.items() if final.get(r) == pid)
    if found:
        inc = found[0]
        out.update(
            strategy=inc.strategy,
            outcome=str(inc.outcome),
            detect_s=inc.detected_at - inc.fault_at,
            mttr_s=inc.mttr_s,
            recomputed=inc.steps_recomputed,
            phases_s={p.name: p.duration_s for p in inc.phases if p.duration_s is not None},
        )
    return out


def run_one(config: Config, s: Settings, run_dir: Path, faulted: bool, repeat: int) -> RunResult:
    run_dir.mkdir(parents=True)
    res = RunResult(config.key, repeat, faulted, str(run_dir))
    tracker = Tracker()
    t0 = time.time()
    load0 = os.getloadavg()[0]
    launch = launch_unbroken if config.tool == "unbroken" else launch_torchrun
    taps = launch(config, s, run_dir, faulted, tracker)
    deadline = time.monotonic() + s.run_timeout_s
    fault_at: float | None = None
    while any(t.proc.poll() is None for t in taps):
        time.sleep(0.25)
        if time.monotonic() > deadline:
            res.stopped = f"still running after {s.run_timeout_s:.0f} s"
            break
        if not faulted:
            continue
        incs = read_steplogs(run_dir / "steplog")
        fault_at = fault_at or fault_time(incs, s.kill_step)
        if fault_at is None or time.time() - fault_at < s.recovery_timeout_s:
            continue
        if recovery(incs, fault_at, s.kill_step).mttr_s is None:
            res.stopped = f"not recovered {s.recovery_timeout_s:.0f} s after the fault"
            break
    end = time.time()
    if res.stopped and config.tool == "unbroken":
        taps[0].proc.send_signal(signal.SIGINT)  # it stops every process of its run
        with contextlib.suppress(subprocess.TimeoutExpired):
            taps[0].proc.wait(timeout=20)
    leftovers = tracker.kill_all()
    for t in taps:
        t.proc.wait()
        t.close()
    if leftovers and not res.stopped:
        res.stopped = f"killed {len(leftovers)} leftover process(es)"
    res.load_avg = (load0, os.getloadavg()[0])
    codes = [t.proc.returncode for t in taps]
    res.exit_code = next((c for c in codes if c != 0), 0)
    res.wall_s = end - t0
    result = run_dir / "result.json"
    if result.exists():
        data = json.loads(result.read_text())
        if data.get("steps") == s.steps:
            res.digest = str(data["digest"])
    res.finished = res.exit_code == 0 and not res.stopped and res.digest is not None

    incs = read_steplogs(run_dir / "steplog")
    fault_at = fault_time(incs, s.kill_step) if faulted else None
    res.step_ms = step_ms(incs, fault_at)
    if config.tool == "unbroken":
        res.ledger = _ledger_figures(run_dir)
    if fault_at is None:
        return res
    res.fault_at = fault_at
    rec = recovery(incs, fault_at, s.kill_step)
    res.restart_rounds = rec.restart_rounds
    res.new_ranks, res.kept_ranks = rec.new_ranks, rec.kept_ranks
    res.redone = max((i.redone for i in incs), default=0)
    res.began_s, res.loop_s = rec.began_s, rec.loop_s
    res.mttr_s = rec.mttr_s
    res.recovered = rec.mttr_s is not None
    res.resumed_from = rec.resumed_from
    if rec.resumed_from is not None and res.recovered:
        res.recomputed = s.kill_step - rec.resumed_from
    if config.tool == "unbroken":
        detected_at = res.ledger.get("fault_detected_at")
        if detected_at is not None:
            res.detect_s = detected_at - fault_at
            res.detect_line = "FaultDetected"
    else:
        lines = sorted(line for t in taps for line in t.lines)
        for when, text in lines:
            if when >= fault_at and TORCHRUN_REACTION.search(text):
                res.detect_s = when - fault_at
                res.detect_line = text[-160:]
                break
    return res


# -- reporting ----------------------------------------------------------------------------------


def spread(values: Iterable[float | int | None], fmt: str = "{:.2f}") -> str:
    vals = [v for v in values if v is not None]
    if not vals:
        return "-"
    med = statistics.median(vals)
    lo, hi = min(vals), max(vals)
    if len(vals) == 1:
        return fmt.format(med)
    return f"{fmt.format(med)} ({fmt.format(lo)}-{fmt.format(hi)})"


def _count(runs: Sequence[RunResult], pred: Callable[[RunResult], bool]) -> str:
    return f"{sum(1 for r in runs if pred(r))}/{len(runs)}"


def _phase_medians(runs: Sequence[RunResult]) -> str:
    per_phase: dict[str, list[float]] = {}
    for r in runs:
        for name, duration_s in r.ledger.get("phases_s", {}).items():
            per_phase.setdefault(name, []).append(duration_s)
    return " ".join(f"{n} {statistics.median(v):.2f}" for n, v in per_phase.items())


def _ranks(ranks: Iterable[int] | None) -> str:
    shown = list(ranks or ())
    return ",".join(map(str, shown)) if shown else "none"


def _variants(values: Iterable[str]) -> str:
    """Distinct values with how many runs had each: ``"a" (2), "b" (1)``, or ``"a"`` alone."""
    counts: dict[str, int] = {}
    for v in values:
        counts[v] = counts.get(v, 0) + 1
    if len(counts) == 1:
        return next(iter(counts))
    return "; ".join(f"{v} ({n})" for v, n in counts.items()) or "-"


def _decision(r: RunResult) -> str:
    found = r.ledger.get("decisions") or []
    return " -> ".join(f"{d['strategy']}: {', '.join(d['commands'])}" for d in found) or "-"


def _placement(r: RunResult) -> str:
    placed = r.ledger.get("placed") or []
    return ", ".join(
        f"{p['pod']} on {p['node']} ({'a spare node' if p['spare'] else 'a node the job had'})"
        for p in placed
    )


def _median(values: Iterable[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def _targets(results: Sequence[RunResult]) -> list[str]:
    out = ["targets"]
    retry = [r for r in results if r.faulted and r.config == "unbroken-retry"]
    retry_mttr = _median(r.mttr_s for r in retry)
    if retry_mttr is None:
        out.append("  retry MTTR < 1 s: not measured (--configs unbroken-retry)")
    else:
        slowest = max(r.mttr_s for r in retry if r.mttr_s is not None)
        verdict = "met" if retry_mttr < 1.0 else "NOT met"
        out.append(
            f"  retry MTTR < 1 s (device memory error; a SIGKILLed rank has no process to"
            f" retry in): median {retry_mttr:.2f} s, slowest {slowest:.2f} s"
            f" ({_count(retry, lambda r: r.recovered)} recovered), {verdict} at the median"
        )
    ref = [r for r in results if r.faulted and r.config == "torchrun-nss"]
    ref_mttr = _median(r.mttr_s for r in ref)
    ref_best = min((r.mttr_s for r in ref if r.mttr_s is not None), default=None)
    for key in ("unbroken-rip", "unbroken-recover"):
        label = next(c.label for c in CONFIGS if c.key == key)
        runs = [r for r in results if r.faulted and r.config == key]
        mttr = _median(r.mttr_s for r in runs)
        worst = max((r.mttr_s for r in runs if r.mttr_s is not None), default=None)
        if not runs:
            continue
        if mttr is None or ref_mttr is None or ref_best is None or worst is None:
            out.append(f"  {label} >= 3x faster than torchrun-nss: not measured")
            continue
        ratio = ref_mttr / mttr
        verdict = "met" if ratio >= 3 else "NOT met"
        out.append(
            f"  {label} >= 3x faster than torchrun-nss: median MTTR {mttr:.2f} s vs"
            f" {ref_mttr:.2f} s = {ratio:.1f}x, {verdict}"
            + ("" if all(r.recovered for r in runs) else " (not every run recovered)")
            + f"; its slowest run vs torchrun-nss's fastest: {worst:.2f} s vs {ref_best:.2f} s"
            f" = {ref_best / worst:.1f}x"
        )
    out.append(
        "  worker hooks' steady-state step overhead < 2%: bench/worker_overhead.py and"
        " bench/recovery_overhead.py"
    )
    return out


def table(results: Sequence[RunResult], s: Settings) -> str:
    out = []
    out.append("fault-free baselines")
    head = f"  {'tool':<38}{'runs ok':>8}  {'digest':<18}{'step ms':<22}{'launch->exit s':<20}"
    out.append(head)
    for b in BASELINES:
        runs = [r for r in results if not r.faulted and r.config == b.key]
        if not runs:
            continue
        digests = sorted({r.digest for r in runs if r.digest})
        shown = ",".join(d[:16] for d in digests) or "-"
        out.append(
            f"  {b.label:<38}{_count(runs, lambda r: r.finished):>8}  {shown:<18}"
            f"{spread((r.step_ms for r in runs), '{:.1f}'):<22}"
            f"{spread((r.wall_s for r in runs), '{:.1f}'):<20}"
        )
    refs = {r.digest for r in results if not r.faulted and r.digest}
    if len(refs) > 1:
        out.append("  (the tools' fault-free digests differ)")
    elif refs:
        out.append("  (every fault-free run ended with the same digest)")
    out.append("")
    out.append(
        f"SIGKILL of rank {VICTIM} after step {s.kill_step} ({s.steps} steps, checkpoint every "
        f"{s.ckpt_every}: a restart from the newest checkpoint recomputes "
        f"{s.expected_recomputed} steps, process-level recovery none); "
        "median (min-max) over repeats"
    )
    out.append(
        f"  {'configuration':<48}{'recovered':>9}  {'detection s':<20}{'MTTR s':<22}"
        f"{'recomputed':<14}{'equal':<7}"
    )
    faulted = [c for c in CONFIGS if any(r.faulted and r.config == c.key for r in results)]
    for c in faulted:
        runs = [r for r in results if r.faulted and r.config == c.key]
        out.append(
            f"  {c.label:<48}{_count(runs, lambda r: r.recovered):>9}  "
            f"{spread(r.detect_s for r in runs):<20}{spread(r.mttr_s for r in runs):<22}"
            f"{spread((r.recomputed for r in runs), '{}'):<14}"
            f"{_count(runs, lambda r: bool(r.equal)):<7}"
        )
    if any(c.fault != "kill" for c in faulted):
        out.append(
            f"  (Unbroken retry: not a SIGKILL; right after rank {VICTIM} commits step "
            f"{s.kill_step} one of its parameters is corrupted, a simulated uncorrectable device "
            "memory error that fails its next step; the process survives)"
        )
    out.append("")
    out.append(
        "where the time went, observed (step logs): s from the fault until every rank that got a "
        "new process runs the script, is in its training loop (state restored), and until all 4 "
        "ranks are past a step after the fault (MTTR)"
    )
    out.append(
        f"  {'configuration':<48}{'new processes':<15}{'kept':<8}{'running the script':<20}"
        f"{'in the training loop':<22}{'MTTR':<22}"
    )
    for c in faulted:
        runs = [r for r in results if r.faulted and r.config == c.key]
        out.append(
            f"  {c.label:<48}{_variants(_ranks(r.new_ranks) for r in runs):<15}"
            f"{_variants(_ranks(r.kept_ranks) for r in runs):<8}"
            f"{spread(r.began_s for r in runs):<20}"
            f"{spread(r.loop_s for r in runs):<22}{spread(r.mttr_s for r in runs):<22}"
        )
    uruns = [r for r in results if r.faulted and r.ledger.get("incidents")]
    if uruns:
        in_ledger = [c for c in faulted if any(r.config == c.key for r in uruns)]
        out.append("")
        out.append("Unbroken's own ledger (unbroken.ledger.incidents), same runs")
        out.append(
            f"  {'configuration':<48}{'strategy':<18}{'detect s':<22}{'MTTR s':<22}"
            f"{'recomputed':<12}{'kept pid':<10}{'= step logs':<12}"
        )
        for c in in_ledger:
            runs = [r for r in uruns if r.config == c.key]
            strategies = ",".join(sorted({str(r.ledger.get("strategy")) for r in runs}))
            out.append(
                f"  {c.label:<48}{strategies:<18}"
                f"{spread((r.ledger.get('detect_s') for r in runs), '{:.3f}'):<22}"
                f"{spread(r.ledger.get('mttr_s') for r in runs):<22}"
                f"{spread((r.ledger.get('recomputed') for r in runs), '{}'):<12}"
                f"{_variants(_ranks(r.ledger.get('kept_ranks')) for r in runs):<10}"
                f"{_count(runs, lambda r: tuple(r.ledger.get('kept_ranks', ())) == r.kept_ranks)}"
            )
        out.append("  phases, median s:")
        for c in in_ledger:
            runs = [r for r in uruns if r.config == c.key]
            out.append(f"    {c.key:<18}{_phase_medians(runs)}")
        out.append("  decisions (DecisionMade), runs:")
        for c in in_ledger:
            runs = [r for r in uruns if r.config == c.key]
            out.append(f"    {c.key:<18}{_variants(_decision(r) for r in runs)}")
            placed = [p for p in (_placement(r) for r in runs) if p]
            if placed:
                out.append(f"    {'':<18}placed after the fault: {_variants(placed)}")
    if any(r.config in ("unbroken-rip", "unbroken-recover", "unbroken-retry") for r in results):
        out.append("")
        out += _targets(results)
    return "\n".join(out)


def run_line(r: RunResult) -> str:
    what = "fault" if r.faulted else "no fault"
    parts = [f"{r.config:<16} #{r.repeat} {what:<9}"]
    parts.append("finished" if r.finished else f"NOT FINISHED (exit {r.exit_code})")
    if r.faulted:
        parts.append(f"detect {r.detect_s:.2f} s" if r.detect_s is not None else "detect -")
        parts.append(f"MTTR {r.mttr_s:.2f} s" if r.mttr_s is not None else "not recovered")
        if r.recomputed is not None:
            parts.append(f"recomputed {r.recomputed}")
        if r.restart_rounds > 1:
            parts.append(f"{r.restart_rounds} restart rounds")
        if r.kept_ranks:
            redo = f", redid {r.redone} step(s)" if r.redone else ""
            parts.append(f"ranks {_ranks(r.kept_ranks)} kept their processes{redo}")
        if r.ledger.get("incidents"):
            parts.append(f"{r.ledger['incidents']} incident(s), {r.ledger.get('strategy')}")
    if r.step_ms is not None:
        parts.append(f"step {r.step_ms:.1f} ms")
    if r.equal is not None:
        parts.append("equal" if r.equal else "DIFFERENT digest")
    if r.wall_s is not None:
        parts.append(f"wall {r.wall_s:.1f} s")
    parts.append(f"load {r.load_avg[0]:.1f}->{r.load_avg[1]:.1f}")
    if r.stopped:
        parts.append(f"stopped: {r.stopped}")
    return "  " + ", ".join(parts)


# -- main -------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> tuple[argparse.Namespace, Settings]:
    p = argparse.ArgumentParser(
        description="Kill a rank mid-run under Unbroken and torchrun; compare recovery."
    )
    p.add_argument("--repeats", type=int, default=None, help="runs per configuration (3)")
    p.add_argument("--steps", type=int, default=None, help="training steps (200)")
    p.add_argument("--kill-step", type=int, default=None, help="rank 3 dies after it (110)")
    p.add_argument("--ckpt-every", type=int, default=None, help="checkpoint interval (20)")
    p.add_argument("--step-sleep", type=float, default=0.03, help="extra s of compute per step")
    p.add_argument("--quick", action="store_true", help="1 repeat, 60 steps, kill after 35")
    p.add_argument("--baseline-repeats", type=int, default=1, help="fault-free runs per tool")
    p.add_argument("--configs", default="", help="comma list of configuration keys (all)")
    p.add_argument("--recovery-timeout", type=float, default=60.0, help="s after the fault")
    p.add_argument("--run-timeout", type=float, default=300.0, help="s per run at most")
    p.add_argument("--out", type=Path, default=None, help="write the results here (JSON)")
    p.add_argument("--work-dir", type=Path, default=None, help="keep run directories here")
    a = p.parse_args(argv)
    quick = {"repeats": 1, "steps": 60, "kill_step": 35, "ckpt_every": 10}
    full = {"repeats": 3, "steps": 200, "kill_step": 110, "ckpt_every": 20}
    for k, v in (quick if a.quick else full).items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    s = Settings(
        repeats=a.repeats,
        steps=a.steps,
        kill_step=a.kill_step,
        ckpt_every=a.ckpt_every,
        step_sleep_s=a.step_sleep,
        recovery_timeout_s=a.recovery_timeout,
        run_timeout_s=a.run_timeout,
    )
    if not 0 < s.kill_step < s.steps:
        p.error(f"--kill-step must be between 1 and --steps - 1, got {s.kill_step}")
    if s.ckpt_every <= 0 or s.repeats <= 0:
        p.error("--ckpt-every and --repeats must be > 0")
    keys = [c.key for c in CONFIGS]
    chosen = [k for k in a.configs.split(",") if k] or keys
    unknown = [k for k in chosen if k not in keys]
    if unknown:
        p.error(f"unknown configuration(s) {', '.join(unknown)}; known: {', '.join(keys)}")
    a.configs = chosen
    return a, s


def main(argv: Sequence[str] | None = None) -> int:
    a, s = parse_args(argv)
    torch_version = importlib.metadata.version("torch")
    work = a.work_dir or Path(tempfile.mkdtemp(prefix="unbroken-recovery-"))
    work.mkdir(parents=True, exist_ok=True)
    started = datetime.datetime.now().astimezone()
    print(
        f"recovery benchmark {started:%Y-%m-%d %H:%M %Z}: torch {torch_version}, "
        f"python {platform.python_version()}, {os.cpu_count()} CPUs, "
        f"load {os.getloadavg()[0]:.1f}; steps {s.steps}, checkpoint every {s.ckpt_every}, "
        f"kill after step {s.kill_step}, step sleep {s.step_sleep_s} s, "
        f"{s.repeats} repeat(s)",
        flush=True,
    )
    plan: list[tuple[Config, bool, int]] = []
    for rep in range(max(s.repeats, a.baseline_repeats)):
        if rep < a.baseline_repeats:
            plan += [(b, False, rep) for b in BASELINES]
        if rep < s.repeats:
            plan += [(c, True, rep) for c in CONFIGS if c.key in a.configs]
    results: list[RunResult] = []
    try:
        for config, faulted, rep in plan:
            name = f"{config.key}-{'kill' if faulted else 'clean'}-{rep}"
            r = run_one(config, s, work / name, faulted, rep)
            results.append(r)
            print(run_line(r), flush=True)
    except KeyboardInterrupt:
        print("interrupted; the run in progress was stopped", file=sys.stderr)
    reference = {
        b.tool: next((r.digest for r in results if r.config == b.key and not r.faulted), None)
        for b in BASELINES
    }
    tool_of = {c.key: c.tool for c in CONFIGS}
    for r in results:
        ref = reference.get(tool_of.get(r.config, r.config))
        if r.digest is not None and ref is not None:
            r.equal = r.digest == ref
        elif r.faulted:
            r.equal = False if r.digest is None else None
    print()
    print(table(results, s))
    if a.out is not None:
        doc = {
            "started_at": started.isoformat(),
            "settings": asdict(s),
            "machine": {
                "cpus": os.cpu_count(),
                "torch": torch_version,
                "python": platform.python_version(),
            },
            "reference_digests": reference,
            "runs": [asdict(r) for r in results],
        }
        a.out.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"\nresults: {a.out}")
    if a.work_dir is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
