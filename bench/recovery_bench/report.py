"""The tables the benchmark prints: per run, per configuration, against the targets."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable, Sequence

from recovery_bench.configs import BASELINES, CONFIGS, VICTIM, WORLD, Settings
from recovery_bench.runs import RunResult


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


#: The targets: retry's MTTR, and how many times faster than torchrun's restart (with the
#: store workaround: torch's defaults never recover) the process-level rungs are.
RETRY_MTTR_S = 0.5
FASTER_THAN_TORCHRUN = {"unbroken-rip": 10.0, "unbroken-recover": 5.0}


def _targets(results: Sequence[RunResult]) -> list[str]:
    out = ["targets"]
    retry = [r for r in results if r.faulted and r.config == "unbroken-retry"]
    retry_mttr = _median(r.mttr_s for r in retry)
    if retry_mttr is None:
        out.append(f"  retry MTTR < {RETRY_MTTR_S} s: not measured (--configs unbroken-retry)")
    else:
        slowest = max(r.mttr_s for r in retry if r.mttr_s is not None)
        verdict = "met" if retry_mttr < RETRY_MTTR_S else "NOT met"
        out.append(
            f"  retry MTTR < {RETRY_MTTR_S} s (device memory error; a SIGKILLed rank has no"
            f" process to retry in): median {retry_mttr:.2f} s, slowest {slowest:.2f} s"
            f" ({_count(retry, lambda r: r.recovered)} recovered), {verdict} at the median"
        )
    ref = [r for r in results if r.faulted and r.config == "torchrun-nss"]
    ref_mttr = _median(r.mttr_s for r in ref)
    ref_best = min((r.mttr_s for r in ref if r.mttr_s is not None), default=None)
    for key, factor in FASTER_THAN_TORCHRUN.items():
        label = next(c.label for c in CONFIGS if c.key == key)
        runs = [r for r in results if r.faulted and r.config == key]
        mttr = _median(r.mttr_s for r in runs)
        worst = max((r.mttr_s for r in runs if r.mttr_s is not None), default=None)
        if not runs:
            continue
        aim = f"{label} >= {factor:g}x faster than torchrun-nss"
        if mttr is None or ref_mttr is None or ref_best is None or worst is None:
            out.append(f"  {aim}: not measured")
            continue
        ratio = ref_mttr / mttr
        verdict = "met" if ratio >= factor else "NOT met"
        out.append(
            f"  {aim}: median MTTR {mttr:.2f} s vs {ref_mttr:.2f} s = {ratio:.1f}x, {verdict}"
            + ("" if all(r.recovered for r in runs) else " (not every run recovered)")
            + f"; its slowest run vs torchrun-nss's fastest: {worst:.2f} s vs {ref_best:.2f} s"
            f" = {ref_best / worst:.1f}x"
        )
    out.append(
        "  worker hooks' steady-state step overhead < 2%: bench/worker_overhead.py and"
        " bench/recovery_overhead.py"
    )
    return out


def markdown(results: Sequence[RunResult], s: Settings, load: tuple[float, float]) -> str:
    """The README's table: one row per faulted configuration, medians over the repeats, with
    the machine's load average before and after the whole benchmark."""
    rows = [
        "| configuration | MTTR | steps recomputed | final model |",
        "|---|---|---|---|",
    ]
    for c in CONFIGS:
        runs = [r for r in results if r.faulted and r.config == c.key]
        if not runs:
            continue
        label = c.label.replace(" (device memory error)", " (a device memory error instead)")
        if not any(r.recovered for r in runs):
            rows.append(f"| {label} | never recovers | - | - |")
            continue
        mttr = _median(r.mttr_s for r in runs)
        recomputed = _median(float(r.recomputed) for r in runs if r.recomputed is not None)
        equal = sum(1 for r in runs if r.equal)
        model = "bitwise equal" if equal == len(runs) else f"bitwise equal in {equal}/{len(runs)}"
        shown_mttr = f"{mttr:.2f} s" if mttr is not None else "-"
        shown_recomputed = f"{recomputed:g}" if recomputed is not None else "-"
        missing = len(runs) - sum(1 for r in runs if r.recovered)
        if missing:
            shown_mttr += f" ({missing} of {len(runs)} runs not recovered)"
        if c.fault == "node":
            label = f"{label}: scale-in"
        rows.append(f"| {label} | {shown_mttr} | {shown_recomputed} | {model} |")
        if c.fault == "node":
            rows.append(_scale_out_row(c.label, runs, model))
    rows.append("")
    rows.append(
        f"Medians of {s.repeats} alternating run(s) per configuration; {s.steps} steps, rank "
        f"{VICTIM} killed after step {s.kill_step}, checkpoint every {s.ckpt_every}; load "
        f"average {load[0]:.1f} before, {load[1]:.1f} after."
    )
    elastic = [r for r in results if r.faulted and r.elastic is not None]
    if elastic:
        rows.append("")
        rows.append(_elastic_sentence(elastic, s))
    return "\n".join(rows)


def _scale_out_row(label: str, runs: Sequence[RunResult], model: str) -> str:
    """The elastic configuration's second row: the node back, the job whole again."""
    took = _median(r.elastic.scale_out_s for r in runs if r.elastic is not None)
    out = sum(1 for r in runs if r.elastic is not None and r.elastic.scaled_out)
    if took is None:
        return f"| {label}: scale-out (node back) | never scaled out | - | {model} |"
    shown = f"{took:.2f} s"
    if out < len(runs):
        shown += f" ({len(runs) - out} of {len(runs)} runs never scaled out)"
    return f"| {label}: scale-out (node back) | {shown} | 0 | {model} |"


def _elastic_sentence(runs: Sequence[RunResult], s: Settings) -> str:
    """How the elastic row was measured, and rank 0's step time at each size."""
    figures = [r.elastic for r in runs if r.elastic is not None]
    scale_in = _median(f.scale_in_s for f in figures)
    shrunk = _median(f.shrunk_step_ms for f in figures)
    full = _median(f.full_step_ms for f in figures)
    size = next((f.shrunk_size for f in figures if f.shrunk_size is not None), None)
    steps = _median(float(f.shrunk_steps) for f in figures)
    if steps is None:
        return "Elastic-training: no run scaled in."

    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v:.0f} ms"

    regroup = "-" if scale_in is None else f"{scale_in:.2f} s"
    return (
        f"Elastic-training: rank {VICTIM}'s node lost after step {s.kill_step} with no spare "
        f"node, back after step {s.clear_step}; {WORLD} virtual ranks, the digest compared "
        "with the same job's fault-free run. Scale-in: the fault -> every rank of the smaller "
        f"world committed a step (detection included; the regroup alone, ScaledIn.took_s: "
        f"{regroup}); scale-out: ScaledOut.took_s, the pause at a step boundary -> the first "
        f"step of the whole world. Median step of rank 0: {ms(shrunk)} scaled in to world size "
        f"{size if size is not None else '-'} ({steps:g} steps), {ms(full)} at full size."
    )


def table(results: Sequence[RunResult], s: Settings) -> str:
    out = []
    out.append("fault-free baselines")
    w = max(len(b.label) for b in BASELINES) + 2
    head = f"  {'tool':<{w}}{'runs ok':>8}  {'digest':<18}{'step ms':<22}{'launch->exit s':<20}"
    out.append(head)
    for b in BASELINES:
        runs = [r for r in results if not r.faulted and r.config == b.key]
        if not runs:
            continue
        digests = sorted({r.digest for r in runs if r.digest})
        shown = ",".join(d[:16] for d in digests) or "-"
        out.append(
            f"  {b.label:<{w}}{_count(runs, lambda r: r.finished):>8}  {shown:<18}"
            f"{spread((r.step_ms for r in runs), '{:.1f}'):<22}"
            f"{spread((r.wall_s for r in runs), '{:.1f}'):<20}"
        )
    tools = ("unbroken", "torchrun")  # the same script; other baselines train another one
    refs = {r.digest for r in results if not r.faulted and r.digest and r.config in tools}
    if len(refs) > 1:
        out.append("  (Unbroken's and torchrun's fault-free digests of the same script differ)")
    elif refs:
        out.append("  (Unbroken's and torchrun's fault-free runs of the same script ended equal)")
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
    if any(c.fault == "memory" for c in faulted):
        out.append(
            f"  (Unbroken retry: not a SIGKILL; right after rank {VICTIM} commits step "
            f"{s.kill_step} one of its parameters is corrupted, a simulated uncorrectable device "
            "memory error that fails its next step; the process survives)"
        )
    if any(c.fault == "subhealth" for c in faulted):
        out.append(
            f"  (Unbroken hot switch: not a SIGKILL; right after step {s.kill_step} rank "
            f"{VICTIM}'s device turns sub-healthy, seen at the device plugin's next poll (every "
            "3 s); training goes on until the switch, so detection and MTTR include that poll)"
        )
        switches = [r for r in results if r.faulted and r.ledger.get("switch_s") is not None]
        stood = spread(r.ledger["switch_s"] for r in switches)
        out.append(
            "  hot switch, training stood still (PodHotSwitched.switch_s: the pause at a step "
            f"boundary -> the first step committed after it): {stood} s"
        )
    if any(c.fault == "sdc" for c in faulted):
        out.append(
            f"  (Unbroken stress test: not a SIGKILL; right after step {s.kill_step} rank "
            f"{VICTIM}'s device starts computing wrong, its health unchanged, and an online "
            "stress test is asked for; training goes on to the next step boundary, so MTTR "
            "counts from the fault's step, not from the pause)"
        )
        tests = [r for r in results if r.faulted and r.ledger.get("paused_s") is not None]
        stood = spread(r.ledger["paused_s"] for r in tests)
        out.append(
            "  stress test, training stood still (StressTestFinished.paused_s: the request -> "
            f"the first step committed after the test and the recovery it caused): {stood} s"
        )
    if any(c.fault == "node" for c in faulted):
        out += _elastic_lines(results, s)

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


def _elastic_lines(results: Sequence[RunResult], s: Settings) -> list[str]:
    runs = [r for r in results if r.faulted and r.elastic is not None]
    figures = [r.elastic for r in runs if r.elastic is not None]
    return [
        f"  (Unbroken elastic-training: not a SIGKILL; after step {s.kill_step} rank {VICTIM}'s "
        f"node is lost with no spare node, and back after step {s.clear_step}; MTTR is the "
        "scale-in: the fault -> every rank of the smaller world committed a step; digest "
        f"compared with the same job's fault-free run, {WORLD} virtual ranks)",
        f"  elastic: scaled in {_count(runs, lambda r: bool(r.elastic and r.elastic.scaled_in))}"
        f", regroup (ScaledIn.took_s) {spread(f.scale_in_s for f in figures)} s; scaled out "
        f"{_count(runs, lambda r: bool(r.elastic and r.elastic.scaled_out))}, "
        f"ScaledOut.took_s {spread(f.scale_out_s for f in figures)} s",
        f"  elastic: rank 0's median step {spread((f.shrunk_step_ms for f in figures), '{:.1f}')}"
        f" ms scaled in ({spread((f.shrunk_steps for f in figures), '{}')} steps), "
        f"{spread((f.full_step_ms for f in figures), '{:.1f}')} ms at full size",
    ]


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
        if r.ledger.get("switch_s") is not None:
            parts.append(f"switch {r.ledger['switch_s']:.2f} s (training stood still)")
        if r.ledger.get("paused_s") is not None:
            parts.append(f"stress test paused {r.ledger['paused_s']:.2f} s")
        if r.elastic is not None:
            e = r.elastic
            took = [f"{t:.2f} s" for t in (e.scale_in_s, e.scale_out_s) if t is not None]
            parts.append(
                f"scaled in {'yes' if e.scaled_in else 'no'}, out {'yes' if e.scaled_out else 'no'}"
                + (f" (took {' / '.join(took)})" if took else "")
            )
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
