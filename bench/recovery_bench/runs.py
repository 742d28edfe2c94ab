"""One run of one configuration: launch, watch, stop, measure."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from recovery_bench.configs import (
    JOBS,
    SCRIPT_NAME,
    STEPLOG,
    TORCHRUN_REACTION,
    VICTIM,
    Config,
    Settings,
)
from recovery_bench.procs import Tapped, Tracker, base_env, free_port
from recovery_bench.steplogs import (
    ElasticFigures,
    Incarnation,
    elastic_figures,
    fault_time,
    read_steplogs,
    recovery,
    shrunk_mttr,
    step_ms,
)

#: A SubHealth device code (the reference's list): what the hot-switch configuration injects.
SUB_HEALTH_CODE = "80E20207"


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
    elastic: ElasticFigures | None = None  # the elastic configuration's scale-in and scale-out


def render_job(config: Config, s: Settings, run_dir: Path) -> Path:
    """The config's job YAML with this run's training arguments and an absolute script path."""
    assert config.job is not None
    doc = yaml.safe_load((JOBS / config.job).read_text())
    for replica in doc["spec"]["replicaSpecs"].values():
        for container in replica["template"]["spec"]["containers"]:
            cmd = [str(c) for c in container["command"]]
            at = next(i for i, c in enumerate(cmd) if Path(c).name == SCRIPT_NAME)
            container["command"] = [
                *cmd[:at],
                str(STEPLOG),
                *s.script_args(),
                *config.script_args,
            ]
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
        fault: dict[str, Any] = {"kind": config.fault, "rank": VICTIM, "at_step": s.kill_step}
        faults = [fault]
        if config.fault == "subhealth":  # rank 3's device: device 1 of node-1
            fault = {"kind": "device", "node": "node-1", "device": 1, "code": SUB_HEALTH_CODE}
            faults = [{**fault, "at_step": s.kill_step}]
        if config.fault == "throttle":  # rank 3's node held to 5% of one CPU: a straggler
            faults = [{"kind": "throttle", "node": "node-1", "cpu": 0.05, "at_step": s.kill_step}]
        if config.fault == "node":  # rank 3's node is lost, then back (no spare node)
            lost = {"kind": "node", "node": "node-1", "at_step": s.kill_step}
            faults = [lost, {**lost, "at_step": s.clear_step, "clear": True}]
        if config.fault == "sdc":  # rank 3's device computes wrong; a stress test finds it
            sdc = {"kind": "sdc", "node": "node-1", "device": 1, "at_step": s.kill_step}
            faults = [sdc, {"kind": "stress-test", "at_step": s.kill_step}]
        chaos.write_text(yaml.safe_dump({"faults": faults}))
        cmd += ["--chaos", str(chaos)]
    if config.cluster is not None:
        cmd += ["--cluster", str(JOBS / config.cluster)]
    cmd.append("--quiet")
    tap = Tapped(cmd, run_dir / "unbroken-run.log", base_env(), run_dir)
    tracker.add_root(tap.proc.pid)
    return [tap]


def launch_torchrun(
    config: Config, s: Settings, run_dir: Path, faulted: bool, tracker: Tracker
) -> list[Tapped]:
    env = base_env()
    if config.no_share_store:
        env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    if faulted:
        env["BENCH_KILL"] = f"{VICTIM}:{s.kill_step}"
    port = free_port()
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
        PodHotSwitched,
        PodPlaced,
        ProcessesStarted,
        StressTestFinished,
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
    switched = [r for r in records if r.kind == PodHotSwitched.kind]
    if switched:
        out["switch_s"] = switched[0].data["switch_s"]
        out["prepare_s"] = switched[0].data["prepare_s"]
    injected = [r.at for r in records if r.kind == "FaultInjected" and r.data["fault"] == "node"]
    if injected:
        out["node_lost_at"] = injected[0]  # recorded right after the chaos SIGKILLs
    for kind in ("ScaledIn", "ScaledOut"):  # the elastic rung's changes of world size
        out[kind] = [
            {k: r.data[k] for k in ("from_world_size", "world_size", "step", "took_s")}
            | {"at": r.at}
            for r in records
            if r.kind == kind
        ]
    stressed = [r for r in records if r.kind == StressTestFinished.kind]
    if stressed:
        out["paused_s"] = stressed[0].data["paused_s"]
        out["stress_test_s"] = stressed[0].data["test_s"]
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


def _mttr(config: Config, incs: list[Incarnation], fault_at: float, kill_step: int) -> float | None:
    """Fault -> training goes on: every rank committed a step after the fault; for the elastic
    configuration, every rank of the smaller world (scaling out comes later, on its own)."""
    if config.fault == "node":
        return shrunk_mttr(incs, fault_at, kill_step)
    return recovery(incs, fault_at, kill_step).mttr_s


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
        if _mttr(config, incs, fault_at, s.kill_step) is None:
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
    if config.tool == "unbroken":
        res.ledger = _ledger_figures(run_dir)
    if faulted and config.fault == "node":
        # A lost node leaves no mark in its ranks' step logs: the chaos kill's own time.
        fault_at = res.ledger.get("node_lost_at")
    res.step_ms = step_ms(incs, fault_at)
    if fault_at is None:
        return res
    res.fault_at = fault_at
    rec = recovery(incs, fault_at, s.kill_step)
    res.restart_rounds = rec.restart_rounds
    res.new_ranks, res.kept_ranks = rec.new_ranks, rec.kept_ranks
    res.redone = max((i.redone for i in incs), default=0)
    res.began_s, res.loop_s = rec.began_s, rec.loop_s
    res.mttr_s = _mttr(config, incs, fault_at, s.kill_step)
    res.recovered = res.mttr_s is not None
    if config.fault == "node":
        res.elastic = elastic_figures(incs, fault_at, res.ledger)
    res.resumed_from = rec.resumed_from
    if rec.resumed_from is not None and res.recovered:
        # A hot switch resumes past the fault's step: training went on until the switch.
        res.recomputed = max(0, s.kill_step - rec.resumed_from)
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
