"""Goodput at scale: a discrete-event model of a long job on 1k-100k devices.

Failures arrive as a Poisson process (a per-device rate from published fleet figures); each
fault kind goes to a rung of the recovery ladder (the seed's fault levels); each rung costs the
phases measured in real runs' ledgers (detection, decision, restart, state load, first step,
recomputed steps), scaled to the job's size by the stated rules. Two strategies:

* ``ckpt-restart``: every fault restarts the whole job from the newest checkpoint (torchrun's
  elastic restart, Unbroken's job-level rung);
* ``ladder``: Unbroken's rungs: online retry, recover-in-place, recover to a spare node; only a
  fault no replica can mend (silent data corruption: replicas diverge) goes to checkpoint restart.

For each strategy and size it prints ETTR (productive time over wall time) at the best
checkpoint interval found by a sweep (or at ``--interval-s``), Young/Daly's interval beside it,
and the lost time by cause. Deterministic for a seed; pure Python.

    .venv/bin/python bench/goodput_model.py                      # the shipped costs
    .venv/bin/python bench/goodput_model.py --from-runs RUN_DIR... # costs from run ledgers
    .venv/bin/python bench/goodput_model.py --node-failures-per-1000-days 6.5 \
        --restart-overhead-s 300 --ckpt-save-s 0 --interval-s 3600 --sizes 16000  # Kokolis et al.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DEFAULT_COSTS = HERE / "goodput_costs.json"

#: Rungs the model knows. ``loses_to_checkpoint``: the rung restarts from the newest checkpoint.
RUNGS = ("retry", "recover-in-place", "recover", "job-restart")
LOSES_TO_CHECKPOINT = {"job-restart"}
#: The part of the interrupted step lost on average (the fault strikes anywhere in the step).
IN_FLIGHT = 0.5
PHASES = ("detection", "decision", "restart", "state", "first_step")

#: Ledger strategy tokens (DecisionMade.strategy) -> rung of this model.
RUNG_OF_STRATEGY = {
    "retry": "retry",
    "recover-in-place": "recover-in-place",
    "recover": "recover",
    "job-rescheduling": "job-restart",
}

CAUSES = (
    "checkpoint_save",
    "detection",
    "decision",
    "restart",
    "state",
    "first_step",
    "recomputed_steps",
)


class CostsError(ValueError):
    """Bad costs input; the message names the file, the field and the problem."""


@dataclass(frozen=True)
class RungCost:
    """Phase costs of one rung at the measured size (seconds) and how they grow with size."""

    phases_s: dict[str, float]
    recomputed_steps: float  # steps trained again after the rung (median)
    # seconds added per doubling of the device count above the measured world, per phase
    per_doubling_s: dict[str, float] = field(default_factory=dict)
    # seconds added at any size, per phase (what the small runs cannot show: e.g. a scheduler)
    at_scale_s: dict[str, float] = field(default_factory=dict)

    def phase_s(self, phase: str, devices: int, measured_world: int) -> float:
        doublings = max(0.0, math.log2(devices / measured_world))
        return (
            self.phases_s.get(phase, 0.0)
            + self.per_doubling_s.get(phase, 0.0) * doublings
            + self.at_scale_s.get(phase, 0.0)
        )

    def total_s(self, devices: int, measured_world: int) -> float:
        return sum(self.phase_s(p, devices, measured_world) for p in PHASES)


@dataclass(frozen=True)
class Costs:
    measured_world: int
    step_time_s: float
    checkpoint_save_s: float  # blocking part of one checkpoint save at scale
    device_mttf_h: float  # mean time to an interrupting fault, per device
    fault_mix: dict[str, float]  # fault kind -> share of interruptions
    ladder_rung: dict[str, str]  # fault kind -> rung under the ladder
    rungs: dict[str, RungCost]


@dataclass
class Result:
    wall_s: float
    productive_s: float
    lost_s: dict[str, float]
    failures: int

    @property
    def ettr(self) -> float:
        return self.productive_s / self.wall_s if self.wall_s > 0 else 0.0


def simulate(
    costs: Costs,
    strategy: str,
    devices: int,
    interval_s: float,
    horizon_s: float,
    seed: int,
) -> Result:
    """One job of ``horizon_s`` wall seconds: compute, checkpoint every ``interval_s`` of work,
    faults as a Poisson process; a fault during a recovery restarts that recovery."""
    if interval_s <= 0:
        raise ValueError(f"checkpoint interval must be > 0, got {interval_s}")
    rng = random.Random(seed)
    rate = devices / (costs.device_mttf_h * 3600.0)  # faults per second
    kinds = list(costs.fault_mix)
    weights = [costs.fault_mix[k] for k in kinds]
    lost = dict.fromkeys(CAUSES, 0.0)
    t = 0.0
    since_ckpt = 0.0  # work done since the newest checkpoint
    failures = 0
    next_fail = rng.expovariate(rate) if rate > 0 else math.inf
    delta = costs.checkpoint_save_s
    while t < horizon_s:
        remaining = interval_s - since_ckpt
        if next_fail >= t + remaining + delta:  # the segment and its checkpoint complete
            t += remaining + delta
            lost["checkpoint_save"] += delta
            since_ckpt = 0.0
            continue
        if next_fail < t + remaining:  # a fault while computing
            since_ckpt += next_fail - t
        else:  # a fault while saving: the checkpoint is not committed
            since_ckpt = interval_s
            lost["checkpoint_save"] += next_fail - (t + remaining)
        t = next_fail
        # the fault and its recovery; a fault during a recovery starts that recovery again
        while True:
            failures += 1
            kind = rng.choices(kinds, weights)[0]
            rung = "job-restart" if strategy == "ckpt-restart" else costs.ladder_rung[kind]
            cost = costs.rungs[rung]
            if rung in LOSES_TO_CHECKPOINT:
                lost["recomputed_steps"] += since_ckpt
                since_ckpt = 0.0
            else:  # state from a replica: the rung's measured recomputed steps + the step in flight
                redo = min(since_ckpt, (cost.recomputed_steps + IN_FLIGHT) * costs.step_time_s)
                lost["recomputed_steps"] += redo
                since_ckpt -= redo
            next_fail = t + rng.expovariate(rate) if rate > 0 else math.inf
            interrupted = False
            for phase in PHASES:
                took = cost.phase_s(phase, devices, costs.measured_world)
                if next_fail < t + took:
                    lost[phase] += next_fail - t
                    t = next_fail
                    interrupted = True
                    break
                lost[phase] += took
                t += took
            if not interrupted:
                break
    wall = t  # the last span may end past the horizon: ETTR is over the wall time simulated
    productive = wall - sum(lost.values())
    return Result(wall, productive, lost, failures)


def mean_result(
    costs: Costs,
    strategy: str,
    devices: int,
    interval_s: float,
    horizon_s: float,
    seeds: Sequence[int],
) -> Result:
    runs = [simulate(costs, strategy, devices, interval_s, horizon_s, s) for s in seeds]
    wall = sum(r.wall_s for r in runs)
    lost = {c: sum(r.lost_s[c] for r in runs) for c in CAUSES}
    return Result(
        wall, sum(r.productive_s for r in runs), lost, sum(r.failures for r in runs) // len(runs)
    )


def ckpt_mtbf_s(costs: Costs, strategy: str, devices: int) -> float:
    """Mean time between faults that lose the work since the newest checkpoint."""
    rate = devices / (costs.device_mttf_h * 3600.0)
    if strategy != "ckpt-restart":
        share = sum(
            w for k, w in costs.fault_mix.items() if costs.ladder_rung[k] in LOSES_TO_CHECKPOINT
        ) / sum(costs.fault_mix.values())
        rate *= share
    return math.inf if rate <= 0 else 1.0 / rate


def young_daly_s(delta_s: float, mtbf_s: float) -> float:
    """Young's optimum checkpoint interval, sqrt(2 delta M)."""
    return math.sqrt(2.0 * delta_s * mtbf_s)


def analytic_ettr(costs: Costs, strategy: str, devices: int, interval_s: float) -> float:
    """First-order closed form: 1 - delta/tau - (sum over faults of (lost work + MTTR)) rate;
    a fault that restarts from a checkpoint loses tau/2 of work on average."""
    rate = devices / (costs.device_mttf_h * 3600.0)
    total = sum(costs.fault_mix.values())
    per_fault = 0.0
    for kind, w in costs.fault_mix.items():
        rung = "job-restart" if strategy == "ckpt-restart" else costs.ladder_rung[kind]
        cost = costs.rungs[rung]
        redo = (
            interval_s / 2.0
            if rung in LOSES_TO_CHECKPOINT
            else (cost.recomputed_steps + IN_FLIGHT) * costs.step_time_s
        )
        per_fault += (w / total) * (redo + cost.total_s(devices, costs.measured_world))
    return 1.0 - costs.checkpoint_save_s / interval_s - rate * per_fault


def daly_ettr(interval_s: float, delta_s: float, restart_s: float, mtbf_s: float) -> float:
    """Daly's exact ETTR (2006) for checkpoint restart under exponential faults: solve time
    over expected wall time, tau / (M e^(R/M) (e^((tau + delta)/M) - 1)); faults may strike
    during a save or a restart (which starts it again)."""
    m = mtbf_s
    return interval_s / (m * math.exp(restart_s / m) * math.expm1((interval_s + delta_s) / m))


def kokolis_ettr(interval_s: float, write_s: float, restart_s: float, mtbf_s: float) -> float:
    """Kokolis et al.'s first-order expected ETTR (2024, "Revisiting Reliability in Large-Scale
    Machine Learning Research Clusters"), (1 - N r_f (u0 + dt/2)) / (1 + w/dt), with N r_f the
    job's fault rate (1 / ``mtbf_s``), u0 the restart, dt the interval and w the blocking write;
    no queue time. A published model to hold the simulation against, not part of it."""
    return (1.0 - (restart_s + interval_s / 2.0) / mtbf_s) / (1.0 + write_s / interval_s)


def best_interval(
    costs: Costs,
    strategy: str,
    devices: int,
    horizon_s: float,
    seeds: Sequence[int],
    grid: int = 25,
) -> tuple[float, Result]:
    """The sweep's best checkpoint interval: a geometric grid around Young/Daly's (0.1x-10x),
    the same seeds for every interval."""
    yd = young_daly_s(costs.checkpoint_save_s, ckpt_mtbf_s(costs, strategy, devices))
    yd = min(yd, horizon_s)
    best: tuple[float, Result] | None = None
    for i in range(grid):
        tau = yd * 10 ** (-1.0 + 2.0 * i / (grid - 1))
        r = mean_result(costs, strategy, devices, tau, horizon_s, seeds)
        if best is None or r.ettr > best[1].ettr:
            best = (tau, r)
    assert best is not None
    return best


# -- costs: the shipped file and run ledgers -------------------------------------------------


def load_costs(path: Path) -> tuple[Costs, dict[str, Any]]:
    """The costs file (JSON) and its raw content (for provenance)."""
    try:
        raw = json.loads(path.read_text())
    except OSError as exc:
        raise CostsError(f"{path}: cannot read: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise CostsError(f"{path}: not JSON: {exc}") from None
    return costs_from_dict(raw, str(path)), raw


def _num(d: dict[str, Any], key: str, where: str, minimum: float = 0.0) -> float:
    value = d.get(key)
    if not isinstance(value, int | float) or isinstance(value, bool) or value < minimum:
        raise CostsError(f"{where}: field {key!r} must be a number >= {minimum}, got {value!r}")
    return float(value)


def _phases(d: Any, where: str) -> dict[str, float]:
    if d is None:
        return {}
    if not isinstance(d, dict):
        raise CostsError(f"{where}: must be a mapping of phase -> seconds")
    out = {}
    for k in d:
        if k not in PHASES:
            raise CostsError(f"{where}: unknown phase {k!r}; phases are {', '.join(PHASES)}")
        out[k] = _num(d, k, where)
    return out


def costs_from_dict(raw: dict[str, Any], where: str) -> Costs:
    rungs: dict[str, RungCost] = {}
    raw_rungs = raw.get("rungs")
    if not isinstance(raw_rungs, dict):
        raise CostsError(f"{where}: field 'rungs' must be a mapping of rung -> costs")
    for name in RUNGS:
        r = raw_rungs.get(name)
        if not isinstance(r, dict):
            raise CostsError(f"{where}: field 'rungs.{name}' is missing")
        w = f"{where}: rungs.{name}"
        rungs[name] = RungCost(
            phases_s=_phases(r.get("measured_s"), f"{w}.measured_s"),
            recomputed_steps=_num(r, "recomputed_steps", w),
            per_doubling_s=_phases(r.get("per_doubling_s"), f"{w}.per_doubling_s"),
            at_scale_s=_phases(r.get("at_scale_s"), f"{w}.at_scale_s"),
        )
    fr = raw.get("failures")
    if not isinstance(fr, dict):
        raise CostsError(f"{where}: field 'failures' must be a mapping")
    mix_raw = fr.get("mix")
    if not isinstance(mix_raw, dict) or not mix_raw:
        raise CostsError(f"{where}: field 'failures.mix' must map fault kind -> {{share, rung}}")
    mix, ladder = {}, {}
    for kind, v in mix_raw.items():
        w = f"{where}: failures.mix.{kind}"
        if not isinstance(v, dict):
            raise CostsError(f"{w}: must be {{share, rung}}")
        mix[kind] = _num(v, "share", w)
        rung = v.get("rung")
        if rung not in RUNGS:
            raise CostsError(f"{w}: field 'rung' must be one of {', '.join(RUNGS)}, got {rung!r}")
        ladder[kind] = str(rung)
    return Costs(
        measured_world=int(_num(raw, "measured_world", where, 1)),
        step_time_s=_num(raw, "step_time_s", where),
        checkpoint_save_s=_num(raw, "checkpoint_save_s", where),
        device_mttf_h=_num(fr, "device_mttf_h", f"{where}: failures", 1e-9),
        fault_mix=mix,
        ladder_rung=ladder,
        rungs=rungs,
    )


@dataclass
class RunCosts:
    """Phase costs read from run ledgers, per rung: the medians of the incidents found."""

    world: int | None = None
    phases: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    recomputed: dict[str, list[int]] = field(default_factory=dict)
    step_times: list[float] = field(default_factory=list)
    checkpoint_saves: list[float] = field(default_factory=list)
    ledgers: list[str] = field(default_factory=list)

    def medians(self) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for rung, phases in self.phases.items():
            out[rung] = {
                "measured_s": {p: round(statistics.median(v), 4) for p, v in phases.items() if v},
                "recomputed_steps": statistics.median(self.recomputed.get(rung) or [0]),
                "incidents": len(self.recomputed.get(rung) or []),
            }
        return out


# ledger phase (unbroken.ledger.timeline.PHASES) -> model phase
_MODEL_PHASE = {
    "detect": "detection",
    "decide": "decision",
    "last_words": "restart",
    "stop": "restart",
    "place": "restart",
    "processes": "restart",
    "communication": "restart",
    "state": "state",
    "first_step": "first_step",
}


def read_runs(dirs: Iterable[Path]) -> RunCosts:
    """Phase costs from the ledgers (``ledger.db``) under ``dirs``, through the ledger's reader
    API: recovered incidents per rung, step times, checkpoint save durations."""
    from unbroken.ledger import CheckpointSaved, JobSubmitted, Ledger, StepProgress, incidents
    from unbroken.ledger.timeline import IncidentOutcome

    out = RunCosts()
    for d in dirs:
        paths = [d] if d.is_file() else sorted(d.rglob("ledger.db"))
        if not paths:
            raise CostsError(f"{d}: no ledger.db found")
        for path in paths:
            with Ledger(path, create=False) as ledger:
                recs = ledger.events()
            out.ledgers.append(str(path))
            for r in recs:
                if r.kind == JobSubmitted.kind and isinstance(r.data.get("world_size"), int):
                    out.world = int(r.data["world_size"])
                elif r.kind == StepProgress.kind:
                    st = r.data.get("step_time_s")
                    if isinstance(st, int | float) and st > 0:
                        out.step_times.append(float(st))
                elif r.kind == CheckpointSaved.kind and not r.data.get("last_words"):
                    took = r.data.get("duration_s")
                    if isinstance(took, int | float) and took > 0:
                        out.checkpoint_saves.append(float(took))
            for inc in incidents(recs):
                rung = RUNG_OF_STRATEGY.get(inc.strategy or "")
                if rung is None or inc.outcome is not IncidentOutcome.RECOVERED:
                    continue
                sums = dict.fromkeys(PHASES, 0.0)
                for ph in inc.phases:
                    if ph.duration_s is not None:
                        sums[_MODEL_PHASE[ph.name]] += ph.duration_s
                slot = out.phases.setdefault(rung, {p: [] for p in PHASES})
                for p in PHASES:
                    slot[p].append(sums[p])
                out.recomputed.setdefault(rung, []).append(inc.steps_recomputed or 0)
    return out


def merge_runs(raw: dict[str, Any], runs: RunCosts) -> dict[str, Any]:
    """The costs file with its measured parts replaced by what the ledgers hold."""
    merged: dict[str, Any] = json.loads(json.dumps(raw))
    for rung, m in runs.medians().items():
        slot = merged["rungs"].setdefault(rung, {})
        slot["measured_s"] = m["measured_s"]
        slot["recomputed_steps"] = m["recomputed_steps"]
        slot["incidents"] = m["incidents"]
    merged["measured_from"] = sorted(Path(p).parent.name for p in runs.ledgers)
    if runs.world:
        merged["measured_world"] = runs.world
    if runs.step_times:
        merged["measured_step_time_s"] = round(statistics.median(runs.step_times), 4)
    if runs.checkpoint_saves:
        merged["measured_checkpoint_save_s"] = round(statistics.median(runs.checkpoint_saves), 4)
    return merged


# -- the report --------------------------------------------------------------------------------


Best = dict[tuple[int, str], tuple[float, Result]]


def sweep(costs: Costs, sizes: Sequence[int], horizon_s: float, seeds: Sequence[int]) -> Best:
    """The best checkpoint interval and its result per (size, strategy)."""
    return {
        (n, strategy): best_interval(costs, strategy, n, horizon_s, seeds)
        for n in sizes
        for strategy in ("ckpt-restart", "ladder")
    }


def at_interval(
    costs: Costs, sizes: Sequence[int], interval_s: float, horizon_s: float, seeds: Sequence[int]
) -> Best:
    """Every (size, strategy) at one given checkpoint interval: to match a published setting
    rather than look for the best interval."""
    return {
        (n, strategy): (interval_s, mean_result(costs, strategy, n, interval_s, horizon_s, seeds))
        for n in sizes
        for strategy in ("ckpt-restart", "ladder")
    }


def report(
    costs: Costs, best: Best, horizon_s: float, seeds: Sequence[int], swept: bool = True
) -> str:
    lines = []
    days = horizon_s / 86400
    lines.append(
        f"job of {days:g} days wall, {len(seeds)} seed(s);"
        f" device MTTF {costs.device_mttf_h:,.0f} h;"
        f" blocking checkpoint save {costs.checkpoint_save_s:g} s"
    )
    lines.append("")
    head = (
        f"| devices | strategy | job MTTF | faults | {'best ' if swept else ''}ckpt interval |"
        " Young/Daly | ETTR (sim) | closed form | lost: top causes |"
    )
    lines += [head, "|" + "---|" * 9]
    for (n, strategy), (tau, r) in best.items():
        yd = young_daly_s(costs.checkpoint_save_s, ckpt_mtbf_s(costs, strategy, n))
        mttf_h = costs.device_mttf_h / n
        lost_total = sum(r.lost_s.values()) or 1.0
        top = sorted(((v, c) for c, v in r.lost_s.items() if v > 0), reverse=True)[:3]
        causes = ", ".join(f"{c} {v / lost_total * 100:.0f}%" for v, c in top)
        if strategy == "ckpt-restart":
            restart = costs.rungs["job-restart"].total_s(n, costs.measured_world)
            closed = daly_ettr(tau, costs.checkpoint_save_s, restart, 1.0 / _rate(costs, n))
        else:
            closed = analytic_ettr(costs, strategy, n, tau)
        lines.append(
            f"| {n:,} | {strategy} | {mttf_h:.2f} h | {r.failures} | {_dur(tau)} |"
            f" {_dur(yd)} | {r.ettr * 100:.2f}% | {closed * 100:.2f}% | {causes} |"
        )
    return "\n".join(lines)


def breakdown(best: Best) -> str:
    """Lost time by cause, in % of wall time, at each strategy's best checkpoint interval."""
    lines = [
        "| devices | strategy | " + " | ".join(CAUSES) + " |",
        "|" + "---|" * (2 + len(CAUSES)),
    ]
    for (n, strategy), (_, r) in best.items():
        cells = " | ".join(f"{r.lost_s[c] / r.wall_s * 100:.2f}" for c in CAUSES)
        lines.append(f"| {n:,} | {strategy} | {cells} |")
    return "\n".join(lines)


def flat(costs: Costs, recovery_s: float, to_checkpoint: bool) -> Costs:
    """Every fault recovered in ``recovery_s`` whatever the size, from the newest checkpoint or
    from a replica (the in-flight step lost): what a published recovery time gives here."""
    rung = "job-restart" if to_checkpoint else "recover"
    cost = RungCost(phases_s={"restart": recovery_s}, recomputed_steps=0)
    rungs = {**costs.rungs, rung: cost}
    return Costs(
        costs.measured_world,
        costs.step_time_s,
        costs.checkpoint_save_s,
        costs.device_mttf_h,
        {"all": 1.0},
        {"all": rung},
        rungs,
    )


def anchors(costs: Costs, horizon_s: float, seeds: Sequence[int]) -> str:
    """The model where its inputs match published figures."""
    lines = [
        "| setting | published | model: ETTR (best checkpoint interval) |",
        "|---|---|---|",
    ]
    n = 16384
    for minutes in (2, 5, 10):
        c = flat(costs, minutes * 60.0, to_checkpoint=True)
        tau, r = best_interval(c, "ckpt-restart", n, horizon_s, seeds)
        lines.append(
            f"| Llama 3: 16,384 GPUs, 419 faults in 54 days, checkpoint restart in {minutes} min"
            f" | > 90 % effective training time | {r.ettr * 100:.1f}% ({_dur(tau)}) |"
        )
    n = 4800
    c = flat(costs, 150.0, to_checkpoint=False)
    _, r = best_interval(c, "ladder", n, horizon_s, seeds)
    _, ours = best_interval(costs, "ladder", n, horizon_s, seeds)  # not a size of the table
    _, ck = best_interval(costs, "ckpt-restart", n, horizon_s, seeds)
    lines.append(
        "| FlashRecovery: 4,800 devices, every fault recovered in 150 s, no rollback"
        f" (Llama 3's rate) | recovery ~150 s at 4,800 devices | {r.ettr * 100:.1f}%"
        f" (ladder here {ours.ettr * 100:.1f}%, checkpoint restart {ck.ettr * 100:.1f}%) |"
    )
    # ByteRobust (Wan et al., 2025): 97 % ETTR over a three-month job on 9,600 GPUs. Its fault
    # rate is not published with it, so Llama 3's is used: 97 % then means a loss per fault.
    n, days, published = 9600, 90.0, 0.97
    long = days * 86400.0
    faults = _rate(costs, n) * long
    per_fault_min = (1.0 - published) * long / faults / 60.0
    _, lad = best_interval(costs, "ladder", n, long, seeds)
    _, ck = best_interval(costs, "ckpt-restart", n, long, seeds)
    lines.append(
        f"| ByteRobust: 9,600 GPUs, a {days:g}-day job (Llama 3's rate: {faults:.0f} faults)"
        f" | 97 % ETTR, that is {per_fault_min:.1f} min lost per fault"
        f" | ladder {lad.ettr * 100:.1f}% ({_per_fault_min(lad, long):.1f} min per fault),"
        f" checkpoint restart {ck.ettr * 100:.1f}% ({_per_fault_min(ck, long):.1f} min) |"
    )
    return "\n".join(lines)


def kokolis_check(costs: Costs, best: Best, devices_per_node: int) -> str:
    """Checkpoint restart's simulated ETTR beside Kokolis et al.'s first-order E[ETTR] at the
    same inputs (their node failure rate, interval, restart overhead and write time)."""
    lines = [
        "| devices | nodes | job MTTF | ckpt interval | restart | ETTR (sim) |"
        " Daly exact | Kokolis et al. E[ETTR] |",
        "|" + "---|" * 8,
    ]
    for (n, strategy), (tau, r) in best.items():
        if strategy != "ckpt-restart":
            continue
        restart = costs.rungs["job-restart"].total_s(n, costs.measured_world)
        mtbf = 1.0 / _rate(costs, n)
        daly = daly_ettr(tau, costs.checkpoint_save_s, restart, mtbf)
        theirs = kokolis_ettr(tau, costs.checkpoint_save_s, restart, mtbf)
        lines.append(
            f"| {n:,} | {n / devices_per_node:,.0f} | {mtbf / 3600:.2f} h | {_dur(tau)} |"
            f" {_dur(restart)} | {r.ettr * 100:.1f}% | {daly * 100:.1f}% | {theirs * 100:.1f}% |"
        )
    return "\n".join(lines)


def _per_fault_min(r: Result, horizon_s: float) -> float:
    """Every minute not productive (checkpoint saves included), per fault."""
    return (1.0 - r.ettr) * horizon_s / r.failures / 60.0 if r.failures else 0.0


def _rate(costs: Costs, devices: int) -> float:
    return devices / (costs.device_mttf_h * 3600.0)


def _dur(s: float) -> str:
    if math.isinf(s):
        return "inf"
    if s >= 3600:
        return f"{s / 3600:.1f} h"
    if s >= 60:
        return f"{s / 60:.1f} min"
    return f"{s:.1f} s"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--costs", type=Path, default=DEFAULT_COSTS, help="costs file (JSON)")
    p.add_argument(
        "--from-runs", type=Path, nargs="+", metavar="DIR", help="read phase costs from ledgers"
    )
    p.add_argument("--sizes", default="1024,4096,16384,100000", help="device counts")
    p.add_argument("--days", type=float, default=30.0, help="wall time of the job")
    p.add_argument("--seeds", type=int, default=16, help="seeds averaged per point")
    p.add_argument("--seed", type=int, default=1, help="first seed")
    p.add_argument("--ckpt-save-s", type=float, help="blocking checkpoint save (costs file's)")
    p.add_argument("--step-time-s", type=float, help="step time at scale (costs file's)")
    restart = p.add_mutually_exclusive_group()
    restart.add_argument(
        "--job-restart-s", type=float, help="job restart's at-scale restart time (costs file's)"
    )
    restart.add_argument(
        "--restart-overhead-s",
        type=float,
        help="a whole-job restart from the checkpoint takes this long at any size: replaces the"
        " job restart's measured phases and their growth with size (Kokolis et al.'s u0)",
    )
    p.add_argument(
        "--node-failures-per-1000-days",
        type=float,
        metavar="R",
        help="failure rate per node, in Kokolis et al.'s unit: replaces the costs file's device"
        " MTTF with devices-per-node x 24,000 / R hours; prints their E[ETTR] beside the table",
    )
    p.add_argument(
        "--devices-per-node", type=int, default=8, help="devices a node (with the rate above)"
    )
    p.add_argument(
        "--interval-s",
        type=float,
        help="checkpoint every this many seconds of work instead of sweeping for the best",
    )
    p.add_argument(
        "--ladder-per-doubling-s",
        type=float,
        metavar="S",
        help="the in-process rungs' recovery grows S s per doubling of the devices (the costs"
        " file's assumed communication rebuild; bench/scale.py measures the control plane's)",
    )
    p.add_argument(
        "--state-gb",
        type=float,
        metavar="G",
        help="each rank's training state at scale (GB): the in-process rungs move it from a"
        " replica at --state-s-per-gb, on top of their measured state phase",
    )
    p.add_argument(
        "--state-s-per-gb",
        type=float,
        default=1.0,
        metavar="S",
        help="seconds per GB of a rank's state moved from a replica (bench/model_size.py's line)",
    )
    p.add_argument("--print-costs", action="store_true", help="print the costs used (JSON)")
    p.add_argument(
        "--write-costs", type=Path, metavar="PATH", help="write the costs used (JSON) and stop"
    )
    p.add_argument("--made-by", default="", help="the command that made the runs (--write-costs)")
    args = p.parse_args(argv)
    try:
        costs, raw = load_costs(args.costs)
        if args.from_runs:
            runs = read_runs(args.from_runs)
            raw = merge_runs(raw, runs)
            costs = costs_from_dict(raw, f"{args.costs} + ledgers")
            print(f"costs from {len(runs.ledgers)} ledger(s): {sorted(runs.phases)}")
        if args.ckpt_save_s is not None:
            raw["checkpoint_save_s"] = args.ckpt_save_s
        if args.step_time_s is not None:
            raw["step_time_s"] = args.step_time_s
        if args.job_restart_s is not None:
            raw["rungs"]["job-restart"].setdefault("at_scale_s", {})["restart"] = args.job_restart_s
        if args.restart_overhead_s is not None:
            slot = raw["rungs"]["job-restart"]
            slot["measured_s"] = {"restart": args.restart_overhead_s}
            slot.pop("per_doubling_s", None)
            slot.pop("at_scale_s", None)
        for rung in ("retry", "recover-in-place", "recover"):
            slot = raw["rungs"][rung]
            if args.ladder_per_doubling_s is not None:
                slot.setdefault("per_doubling_s", {})["restart"] = args.ladder_per_doubling_s
            if args.state_gb is not None:
                if args.state_gb < 0 or args.state_s_per_gb < 0:
                    raise ValueError("--state-gb and --state-s-per-gb must be >= 0")
                slot.setdefault("at_scale_s", {})["state"] = args.state_gb * args.state_s_per_gb
        rate = args.node_failures_per_1000_days
        if rate is not None:
            if rate <= 0 or args.devices_per_node < 1:
                raise ValueError("--node-failures-per-1000-days and --devices-per-node must be > 0")
            raw["failures"]["device_mttf_h"] = args.devices_per_node * 24_000.0 / rate
        if args.interval_s is not None and args.interval_s <= 0:
            raise ValueError(f"--interval-s must be > 0, got {args.interval_s:g}")
        costs = costs_from_dict(raw, f"{args.costs} with the command's options")
        if args.interval_s is None and costs.checkpoint_save_s <= 0:
            raise ValueError(
                "a checkpoint save of 0 s has no best interval (a shorter one is always better):"
                " give --interval-s"
            )
        sizes = [int(s) for s in args.sizes.split(",")]
    except (CostsError, ValueError) as exc:
        print(f"goodput_model: {exc}", file=sys.stderr)
        return 2
    if args.write_costs:
        if args.made_by:
            raw["made_by"] = args.made_by
        args.write_costs.write_text(json.dumps(raw, indent=2) + "\n")
        print(f"wrote {args.write_costs}")
        return 0
    if args.print_costs:
        print(json.dumps(raw, indent=2))
    seeds = list(range(args.seed, args.seed + args.seeds))
    horizon = args.days * 86400
    if args.interval_s is not None:
        best = at_interval(costs, sizes, args.interval_s, horizon, seeds)
    else:
        best = sweep(costs, sizes, horizon, seeds)
    print(report(costs, best, horizon, seeds, swept=args.interval_s is None))
    which = "the given" if args.interval_s is not None else "the best"
    print(f"\nlost time by cause, % of wall time, at {which} checkpoint interval\n")
    print(breakdown(best))
    if rate is not None:
        print("\ncheckpoint restart against Kokolis et al.'s E[ETTR] (2024), no queue time\n")
        print(kokolis_check(costs, best, args.devices_per_node))
        print("\npublished anchors: not printed (they hold the costs file's failure rate)")
        return 0
    print("\npublished anchors\n")
    print(anchors(costs, horizon, seeds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
