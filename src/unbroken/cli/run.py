"""``unbroken run JOB.yaml``: the control plane and a local cluster, training to the end.

Starts, in this process, the fault center, scheduler, operator and job manager with an SQLite
ledger under a run directory; creates the local cluster (the nodes the job needs plus one spare
unless ``--cluster`` says otherwise); places the pods; starts one agent process per pod; trains
to the end while printing what happens; prints a summary. Exit 0 when the job succeeded, 1 when
it failed or the input was wrong (with the reason), 2 for usage errors. SIGINT and SIGTERM stop
every process of the run, record the stop in the ledger (``JobStopped``; ``unbroken status``
says ``Stopped (stopped by SIGINT at step N)``), then exit with one line and the shell's code for
the signal: 130 for SIGINT, 143 for SIGTERM.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import signal
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from unbroken.chaos import ChaosError, ChaosFault, load_chaos
from unbroken.cli.rundir import RunDirError, claim_run_dir
from unbroken.devices import DeviceStateError
from unbroken.faults import CodeTable, CodeTableError
from unbroken.ledger import Ledger, LedgerError, RungsUnavailable, format_incidents, incidents
from unbroken.manager.console import Console
from unbroken.manager.layout import ClusterLayout, JobLayout, ManagerOptions, PodLayout
from unbroken.manager.snapshot import StopRequested
from unbroken.operator import plan as make_plan
from unbroken.spec import ClusterSpec, HotReset, JobSpec, SpecError, load_cluster, load_job


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("run", help="run a job on a local cluster, recovering from faults")
    p.add_argument("job", type=Path, help="the job YAML")
    p.add_argument("--cluster", type=Path, default=None, help="the cluster YAML")
    p.add_argument("--chaos", type=Path, default=None, help="faults to inject (YAML)")
    p.add_argument("--run-dir", type=Path, default=None, help="default: runs/<job>-<time>")
    p.add_argument("--codes", type=Path, default=None, help="override of the fault code table")
    p.add_argument("--agent-timeout", type=float, default=2.0, help="s before a node is lost")
    p.add_argument(
        "--hang-timeout",
        type=float,
        default=3.0,
        help="s of silence that is a hang before a rank's step time is known "
        "(after: 3 step times, at least 0.5 s)",
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        default=0,
        help="port of the metrics and dashboard endpoint on 127.0.0.1 (default: a free one)",
    )
    p.add_argument("--quiet", action="store_true", help="print only the summary")


def _fail(msg: str) -> int:
    print(f"unbroken run: {msg}", file=sys.stderr)
    return 1


def _script_path(job: JobSpec, script: str) -> Path:
    p = Path(script)
    candidates = [p] if p.is_absolute() else [job.source.parent.resolve() / p, Path.cwd() / p]
    for c in candidates:
        if c.is_file():
            return c.resolve()
    raise FileNotFoundError(
        f"training script {script!r} not found (looked in "
        + ", ".join(str(c.parent) for c in candidates)
        + ")"
    )


def _total_steps(args: tuple[str, ...]) -> int | None:
    for i, a in enumerate(args):
        if a == "--steps" and i + 1 < len(args) and args[i + 1].isdigit():
            return int(args[i + 1])
        if a.startswith("--steps=") and a[8:].isdigit():
            return int(a[8:])
    return None


def _literal_master_port(job: JobSpec) -> int | None:
    for replica in job.replica_specs:
        if replica.launcher is not None and replica.launcher.master_port is not None:
            return replica.launcher.master_port
    return None


def build_layout(job: JobSpec, cluster: ClusterSpec, run_dir: Path) -> JobLayout:
    the_plan = make_plan(job, cluster)
    # A MindSpore Scheduler pod has no node rank and runs no training process.
    training = [p for p in the_plan.pods if p.node_rank is not None]
    pods = tuple(
        PodLayout(name=p.name, node_rank=p.node_rank, nproc=p.launcher.nproc_per_node, env=p.env)
        for p in training
        if p.node_rank is not None
    )
    if not pods:
        raise ValueError(f"{job.source}: the job has no training pods")
    first = training[0]
    if first.script is None:
        raise ValueError(f"{job.source}: no training script found in the container command")
    script = _script_path(job, first.script)
    return JobLayout(
        job_id=job.name,
        pods=pods,
        script=str(script),
        script_args=tuple(first.script_args),
        fault_handling=job.fault_handling,
        workdir=run_dir,
        # Only a port written literally in the YAML binds the first store; an operator default
        # (29500) would make concurrent runs collide, so those take any free port.
        master_port=_literal_master_port(job),
        total_steps=_total_steps(tuple(first.script_args)),
        min_pods=job.min_nodes,
        framework=job.framework,
    )


class InputError(Exception):
    """Bad input: ``str()`` is what the user sees; ``spec`` when it is the spec's own message
    (``file:line: field: problem`` lines), printed as it is."""

    def __init__(self, message: str, *, spec: bool = False) -> None:
        super().__init__(message)
        self.spec = spec


@dataclass(frozen=True)
class Inputs:
    """A job's input files, read and checked: nothing is started before this."""

    job: JobSpec
    cluster: ClusterSpec
    layout: JobLayout
    nodes: tuple[str, ...]
    chaos: tuple[ChaosFault, ...]


def read_inputs(job_path: Path, cluster_path: Path | None, chaos_path: Path | None) -> Inputs:
    """The job, its cluster, the layout of its pods and the chaos schedule, every check made
    (``unbroken run`` and ``unbroken serve``); warnings are printed. Raises
    :class:`InputError`."""
    try:
        job = load_job(job_path)
        cluster = load_cluster(cluster_path, job)
    except SpecError as exc:
        raise InputError(str(exc), spec=True) from None
    for w in (*job.warnings, *cluster.warnings):
        print(f"warning: {w}", file=sys.stderr)
    try:
        layout = build_layout(job, cluster, Path("."))
    except (ValueError, FileNotFoundError) as exc:
        raise InputError(str(exc)) from None
    nodes = tuple(f"node-{i}" for i in range(cluster.nodes))
    chaos: tuple[ChaosFault, ...] = ()
    if chaos_path is not None:
        try:
            chaos = load_chaos(chaos_path, layout.world_size, [p.name for p in layout.pods], nodes)
        except ChaosError as exc:
            raise InputError(str(exc)) from None
    return Inputs(job, cluster, layout, nodes, chaos)


def fail_input(prog: str, exc: InputError) -> int:
    print(str(exc) if exc.spec else f"unbroken {prog}: {exc}", file=sys.stderr)
    return 1


def run(args: argparse.Namespace, inputs: Inputs | None = None) -> int:
    """``inputs``: read already (else they are read here)."""
    # Everything is checked before the run directory is made: bad input leaves nothing behind.
    try:
        inputs = inputs or read_inputs(args.job, args.cluster, args.chaos)
    except InputError as exc:
        return fail_input("run", exc)
    if not 0 <= args.metrics_port <= 65535:
        return _fail(f"--metrics-port {args.metrics_port}: expected a port from 0 to 65535")
    try:
        CodeTable.load(args.codes)
    except CodeTableError as exc:
        return _fail(str(exc))
    try:
        lock = claim_run_dir(inputs.job.name, args.run_dir)
    except RunDirError as exc:
        return _fail(str(exc))
    with lock, _terminate_as_interrupt() as stopped_by:
        try:
            return _run_in(
                lock.path, args, inputs.layout, inputs.cluster, inputs.nodes, inputs.chaos
            )
        except KeyboardInterrupt as exc:
            _fail(f"{stopped_by(exc)}; every process of the run was stopped")
            return stopped_by.exit_code


@dataclass
class Interrupt:
    """Which signal stopped the run (``signal``: its name, "" until one came). Called with the
    interrupt, it says what the run recorded of the stop ("stopped by SIGINT at step 120")."""

    signal: str = ""

    def __call__(self, exc: BaseException | None = None) -> str:
        reason = exc.reason if isinstance(exc, StopRequested) else ""
        return reason or f"stopped by {self.signal or 'SIGINT'}"

    @property
    def exit_code(self) -> int:
        """The shell's exit status for a process ended by the signal: 128 + its number."""
        return 128 + signal.Signals[self.signal or "SIGINT"].value


@contextlib.contextmanager
def _terminate_as_interrupt() -> Iterator[Interrupt]:
    """SIGTERM stops the run as SIGINT does: the manager stops every process of the run in
    order, and records the stop, before this process exits. Yields what tells which signal it
    was."""
    got = Interrupt()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        if got.signal:  # already stopping: let the stop finish
            return
        got.signal = signal.Signals(signum).name
        raise StopRequested(got.signal)

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield got
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _gpus(cluster: ClusterSpec) -> tuple[int, ...]:
    """The machine's GPUs the run places its device slots on (none on a machine without)."""
    import os

    from unbroken.devices.nvml import load_nvml, machine_gpus

    count = None
    if cluster.device_plugin.provider == "nvml":
        count = int(load_nvml().nvmlDeviceGetCount())
    try:
        gpus = machine_gpus(os.environ, count)
    except ValueError as exc:
        if count is not None:  # the nvml provider must know which GPU each slot runs on
            raise
        # GPUs named by UUID or MIG instance: every pod sees them as the user gave them.
        print(f"unbroken run: {exc}; every pod sees these GPUs as given", file=sys.stderr)
        return ()
    if count is not None and not gpus:
        raise ValueError("devicePlugin.provider nvml: NVML counts no GPU on this machine")
    if count is not None and any(g >= count for g in gpus):
        raise ValueError(f"CUDA_VISIBLE_DEVICES names a GPU NVML does not see ({count} GPU(s))")
    return gpus


def _run_in(
    run_dir: Path,
    args: argparse.Namespace,
    layout: JobLayout,
    cluster: ClusterSpec,
    nodes: tuple[str, ...],
    chaos: tuple[ChaosFault, ...],
) -> int:
    from unbroken.manager.job import JobManager, ManagerError

    layout = dataclasses.replace(layout, workdir=run_dir)
    try:
        gpus = _gpus(cluster)
    except (ValueError, DeviceStateError) as exc:
        return _fail(str(exc))
    cl = ClusterLayout(
        nodes=nodes,
        devices_per_node=cluster.devices_per_node,
        list_watch_period_s=cluster.list_watch_period_s,
        auto_stowing=cluster.auto_stowing,
        code_table=args.codes,
        offline_reset=cluster.hot_reset is HotReset.OFFLINE,
        device_provider=cluster.device_plugin.provider,
        reset_command=cluster.device_plugin.reset_command,
        gpus=gpus,
    )
    opts = ManagerOptions(
        agent_timeout_s=args.agent_timeout,
        hang_startup_s=args.hang_timeout,
        metrics_port=args.metrics_port,
    )
    console = Console(quiet=args.quiet)
    try:
        ledger = Ledger(run_dir / "ledger.db")
    except LedgerError as exc:
        return _fail(str(exc))
    console.line(f"run directory {run_dir}")
    try:
        manager = JobManager(layout, cl, run_dir, ledger, chaos, opts, console)
        outcome = manager.run()
    except (ManagerError, CodeTableError) as exc:
        return _fail(str(exc))
    records = ledger.events()
    ledger.close()
    found = incidents(records)
    lost = sum(i.mttr_s or 0.0 for i in found)
    # A job without an Unbroken session (a plain torchrun script) shows no step.
    unseen = any(r.kind == RungsUnavailable.kind for r in records)
    total = f"/{layout.total_steps}" if layout.total_steps else ""
    print(
        f"\njob {layout.job_id}: {'SUCCEEDED' if outcome.succeeded else 'FAILED'} "
        f"after {outcome.elapsed_s:.1f} s; "
        + ("steps not seen (no Unbroken session)" if unseen else f"step {outcome.step}{total}")
        + f"; {outcome.faults} fault(s), {outcome.recoveries} recovery(ies)"
        + ("" if unseen else f", {lost:.2f} s lost to recovery")
    )
    if found:
        print(format_incidents(found))
    if not outcome.succeeded:
        print(f"reason: {outcome.reason}", file=sys.stderr)
    print(f"ledger: {run_dir / 'ledger.db'} (unbroken events {run_dir})")
    return 0 if outcome.succeeded else 1
