"""A run as one self-contained HTML page: the numbers a person reads, and inline SVG charts.

The page holds everything it shows (styles and SVG inline, no script, nothing fetched), so it
opens offline from a file and the control plane's dashboard serves the same page. Sections:
a summary (ETTR, MTTR per incident, fault kinds), committed step vs wall time with incidents
shaded, each incident's phase bar, goodput by cause, and per-rank step times when the ledger
has them (``StepProgress.rank_step_times_s``). Pure: records in, text out.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from html import escape

from unbroken.ledger.events import (
    FirstStepCommitted,
    JobFailed,
    JobSubmitted,
    JobSucceeded,
    StateLoaded,
    StepProgress,
)
from unbroken.ledger.goodput import CAUSE_LABELS, CAUSES, Goodput, goodput
from unbroken.ledger.status import JobStatus
from unbroken.ledger.store import Record
from unbroken.ledger.timeline import PHASES, IncidentTimeline, incidents
from unbroken.report.svg import PALETTE, Series, Span, line_chart, stacked_bar

_STYLE = """
body{font-family:system-ui,sans-serif;margin:24px;color:#222;max-width:960px}
h1{font-size:22px;margin-bottom:4px}h2{font-size:17px;margin-top:28px}
table{border-collapse:collapse;font-size:13px}td,th{padding:3px 10px;text-align:left}
th{border-bottom:1px solid #999}td.num{text-align:right;font-variant-numeric:tabular-nums}
.figures{display:flex;gap:28px;flex-wrap:wrap;margin:12px 0}
.figure{border:1px solid #ccc;border-radius:6px;padding:8px 14px}
.figure b{display:block;font-size:22px}.muted{color:#777;font-size:13px}
.key span{display:inline-block;margin-right:12px;font-size:12px}
.key i{display:inline-block;width:10px;height:10px;margin-right:4px}
"""


def _when(at: float) -> str:
    return datetime.datetime.fromtimestamp(at).strftime("%Y-%m-%d %H:%M:%S")


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


def render(
    records: Sequence[Record],
    status: JobStatus | None = None,
    *,
    now: float | None = None,
    refresh_s: float | None = None,
) -> str:
    """The page for a run's ``records``. ``now`` ends a live run's wall time; ``refresh_s``
    makes the browser reload the page that often (the live dashboard)."""
    recs = sorted(records, key=lambda r: r.id)
    gp = goodput(recs, now=now)
    found = incidents(recs)
    job = next((str(r.data.get("job", "")) for r in recs if r.kind == JobSubmitted.kind), "")
    job = job or (status.job if status else "run")
    refresh = (
        f'<meta http-equiv="refresh" content="{max(1, round(refresh_s))}">' if refresh_s else ""
    )
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        refresh,
        f"<title>unbroken: {escape(job)}</title><style>{_STYLE}</style></head><body>",
        f"<h1>{escape(job)}</h1>",
        _summary(recs, gp, found, status),
        "<h2>Committed step over wall time</h2>",
        _step_chart(recs, gp, found),
        "<h2>Incidents</h2>",
        _incidents(recs, found),
        "<h2>Goodput by cause</h2>",
        _goodput(gp),
        "<h2>Step time per rank</h2>",
        _rank_chart(recs, gp),
        "</body></html>",
    ]
    return "\n".join(p for p in parts if p)


def _outcome(recs: Sequence[Record], status: JobStatus | None) -> str:
    for r in recs:
        if r.kind == JobSucceeded.kind:
            return "succeeded"
        if r.kind == JobFailed.kind:
            return f"failed: {r.data.get('reason', '')}"
    if status is not None:
        return str(status.phase).lower() + (f" ({status.message})" if status.message else "")
    return "running"


def _summary(
    recs: Sequence[Record], gp: Goodput, found: Sequence[IncidentTimeline], status: JobStatus | None
) -> str:
    total = status.total_steps if status is not None else None
    step = max(gp.step, status.step if status is not None else 0)
    mttrs = [i.mttr_s for i in found if i.mttr_s is not None]
    kinds: dict[str, int] = {}
    for i in found:
        key = f"{i.source} {i.code}"
        kinds[key] = kinds.get(key, 0) + 1
    ettr = "-" if gp.ettr is None else f"{gp.ettr * 100:.1f}%"
    figures = [
        ("ETTR", ettr, "ettr"),
        ("productive", _s(gp.productive_s), "productive"),
        ("wall time", _s(gp.wall_s), "wall"),
        ("step", f"{step}" + (f"/{total}" if total else ""), "step"),
        ("incidents", str(len(found)), "incident-count"),
        ("mean MTTR", _s(sum(mttrs) / len(mttrs)) if mttrs else "-", "mean-mttr"),
    ]
    cells = "".join(
        f'<div class="figure" id="{ident}">{escape(name)}<b>{escape(value)}</b></div>'
        for name, value, ident in figures
    )
    fault_kinds = ", ".join(f"{escape(k)} × {n}" for k, n in kinds.items()) or "none"
    since = f"started {_when(gp.started_at)}, " if recs else ""
    return (
        f'<p class="muted">{since}{escape(_outcome(recs, status))}</p>'
        f'<div class="figures">{cells}</div><p>Fault kinds: {fault_kinds}</p>'
    )


_LOADED = StateLoaded.kind


def _step_points(recs: Sequence[Record], t0: float) -> tuple[tuple[float, float], ...]:
    pts: list[tuple[float, float]] = [(0.0, 0.0)]
    for r in recs:
        step = r.data.get("step")
        if not isinstance(step, int) or isinstance(step, bool):
            continue
        # StateLoaded: training resumes from that step, so a rollback shows as a drop
        if r.kind in (StepProgress.kind, FirstStepCommitted.kind, JobSucceeded.kind, _LOADED):
            pts.append((r.at - t0, float(step)))
    pts.sort(key=lambda p: p[0])
    return tuple(pts)


def _step_chart(recs: Sequence[Record], gp: Goodput, found: Sequence[IncidentTimeline]) -> str:
    t0 = gp.started_at
    spans = [
        Span(
            start=i.fault_at - t0,
            end=(i.ended_at if i.ended_at is not None else gp.ended_at) - t0,
            label=str(n),
            title=f"incident {n}: {i.source} {i.code}, {i.strategy or 'no decision'}, "
            f"MTTR {_s(i.mttr_s)}",
        )
        for n, i in enumerate(found, start=1)
    ]
    series = Series("committed step", _step_points(recs, t0), step=True)
    return line_chart(
        [series],
        spans,
        css_class="steps",
        x_label="seconds since the job was submitted",
        y_label="committed step",
    )


def _phase_colors() -> dict[str, str]:
    return {name: PALETTE[i % len(PALETTE)] for i, name in enumerate(PHASES)}


def _key(colors: dict[str, str], labels: dict[str, str]) -> str:
    return (
        '<p class="key">'
        + "".join(
            f'<span><i style="background:{c}"></i>{escape(labels[n])}</span>'
            for n, c in colors.items()
        )
        + "</p>"
    )


def _incidents(recs: Sequence[Record], found: Sequence[IncidentTimeline]) -> str:
    if not found:
        return "<p>No incidents: the run met no fault.</p>"
    levels = {
        str(r.data.get("fault_id")): str(r.data.get("level", ""))
        for r in recs
        if r.kind == "FaultDetected"
    }
    colors = _phase_colors()
    longest = max((i.mttr_s or sum(p.duration_s or 0 for p in i.phases)) for i in found) or 1.0
    rows = []
    for n, i in enumerate(found, start=1):
        bar = stacked_bar(
            [(p.name, p.duration_s or 0.0, colors[p.name]) for p in i.phases],
            css_class="phases",
            scale_s=longest,
            width=300,
            height=16,
        )
        phases = ", ".join(
            f"{p.name} {p.duration_s:.2f} s" for p in i.phases if p.duration_s is not None
        )
        rows.append(
            f'<tr class="incident"><td class="num">{n}</td><td>{escape(i.source)} '
            f"{escape(i.code)}</td><td>{escape(levels.get(i.fault_id, ''))}</td>"
            f"<td>{escape(i.strategy or 'no decision')}</td><td>{escape(str(i.outcome))}</td>"
            f'<td class="num mttr">{_s(i.mttr_s)}</td><td class="num">'
            f"{'-' if i.steps_recomputed is None else i.steps_recomputed}</td>"
            f'<td>{bar}<div class="muted">{escape(phases)}</div></td></tr>'
        )
    return (
        _key(colors, {p: p.replace("_", " ") for p in PHASES})
        + "<table><tr><th>#</th><th>fault</th><th>level</th><th>strategy</th><th>outcome</th>"
        "<th>MTTR</th><th>recomputed steps</th><th>phases</th></tr>" + "".join(rows) + "</table>"
    )


def _goodput(gp: Goodput) -> str:
    # colours for the causes shown only, so that they differ from each other
    others = [c for c in PALETTE if c != "#009e73"]
    shown = [c for c in CAUSES if gp.badput_s[c] > 0]
    parts = [("productive", gp.productive_s, "#009e73")]
    parts += [(c, gp.badput_s[c], others[n % len(others)]) for n, c in enumerate(shown)]
    bar = stacked_bar(parts, css_class="goodput", scale_s=gp.wall_s or 1.0, height=28)
    rows = []
    for name, seconds, color in parts:
        share = seconds / gp.wall_s * 100 if gp.wall_s else 0.0
        label = "productive training" if name == "productive" else CAUSE_LABELS[name]
        rows.append(
            f'<tr class="cause"><td><i style="display:inline-block;width:10px;height:10px;'
            f'background:{color}"></i> {escape(label)}</td><td class="num">{seconds:.2f} s'
            f'</td><td class="num">{share:.1f}%</td></tr>'
        )
    return (
        bar
        + "<table><tr><th>where the time went</th><th>seconds</th><th>share</th></tr>"
        + "".join(rows)
        + f'<tr><th>wall time</th><th class="num">{gp.wall_s:.2f} s</th><th></th></tr></table>'
    )


def _rank_chart(recs: Sequence[Record], gp: Goodput) -> str:
    per_rank: dict[int, list[tuple[float, float]]] = {}
    for r in recs:
        if r.kind != StepProgress.kind:
            continue
        times = r.data.get("rank_step_times_s") or []
        for rank, t in enumerate(times):
            if isinstance(t, int | float) and t > 0:
                per_rank.setdefault(rank, []).append((r.at - gp.started_at, float(t) * 1000))
    if not per_rank:
        return "<p>No per-rank step times recorded in this run's ledger.</p>"
    series = [
        Series(f"rank {rank}", tuple(pts), color=PALETTE[rank % len(PALETTE)])
        for rank, pts in sorted(per_rank.items())
    ]
    return line_chart(
        series,
        css_class="rank-steps",
        x_label="seconds since the job was submitted",
        y_label="ms per step",
        height=240,
    )
