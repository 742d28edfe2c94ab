"""Inline SVG charts drawn from plain numbers: a line chart with shaded spans, stacked bars.

No JavaScript and nothing fetched: the page that holds these renders offline. Every element a
reader (or a test) looks for carries a class: ``series``, ``span``, ``bar``, ``axis``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

#: Colours for series and bar segments, chosen to stay apart for colour-blind readers.
PALETTE: tuple[str, ...] = (
    "#0072b2",
    "#e69f00",
    "#009e73",
    "#d55e00",
    "#cc79a7",
    "#56b4e9",
    "#f0e442",
    "#999999",
    "#000000",
)


@dataclass(frozen=True)
class Series:
    name: str
    points: tuple[tuple[float, float], ...]  # (x, y), x increasing
    color: str = PALETTE[0]
    step: bool = False  # draw as a step function (committed steps)


@dataclass(frozen=True)
class Span:
    """A shaded x range with a label (an incident)."""

    start: float
    end: float
    label: str
    title: str = ""


def _fmt(v: float) -> str:
    return f"{v:.1f}"


def _ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """Round tick values (1, 2 or 5 times a power of ten apart) covering ``lo``..``hi``."""
    if hi <= lo:
        return [lo]
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step + 1e-9) + 1)]


def line_chart(
    series: Sequence[Series],
    spans: Sequence[Span] = (),
    *,
    css_class: str,
    x_label: str,
    y_label: str,
    width: int = 900,
    height: int = 300,
) -> str:
    """A chart of ``series`` over a shared x axis, ``spans`` shaded behind them."""
    left, right, top, bottom = 60, 20, 20, 45
    xs = [x for s in series for x, _ in s.points] + [v for sp in spans for v in (sp.start, sp.end)]
    ys = [y for s in series for _, y in s.points]
    x0, x1 = (min(xs), max(xs)) if xs else (0.0, 1.0)
    y0, y1 = 0.0, (max(ys) if ys else 1.0)
    if x1 <= x0:
        x1 = x0 + 1.0
    if y1 <= y0:
        y1 = y0 + 1.0
    pw, ph = width - left - right, height - top - bottom

    def px(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * pw

    def py(y: float) -> float:
        return top + ph - (y - y0) / (y1 - y0) * ph

    out = [
        f'<svg class="{escape(css_class)}" xmlns="http://www.w3.org/2000/svg" '
        f'width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img">'
    ]
    for sp in spans:
        a, b = px(sp.start), px(max(sp.end, sp.start))
        out.append(
            f'<g class="span"><rect x="{_fmt(a)}" y="{top}" width="{_fmt(max(b - a, 2.0))}" '
            f'height="{ph}" fill="#d55e00" fill-opacity="0.18"><title>{escape(sp.title)}'
            f'</title></rect><text x="{_fmt(a + 2)}" y="{top + 12}" font-size="11" '
            f'fill="#a33">{escape(sp.label)}</text></g>'
        )
    out.append(
        f'<g class="axis" stroke="#444" font-size="11" fill="#333">'
        f'<line x1="{left}" y1="{top + ph}" x2="{left + pw}" y2="{top + ph}"/>'
        f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + ph}"/>'
    )
    for t in _ticks(x0, x1):
        out.append(
            f'<text x="{_fmt(px(t))}" y="{top + ph + 15}" text-anchor="middle" '
            f'stroke="none">{t:g}</text>'
        )
    for t in _ticks(y0, y1, 4):
        out.append(
            f'<text x="{left - 5}" y="{_fmt(py(t) + 4)}" text-anchor="end" '
            f'stroke="none">{t:g}</text>'
        )
    out.append(
        f'<text x="{left + pw / 2}" y="{height - 5}" text-anchor="middle" stroke="none">'
        f"{escape(x_label)}</text>"
        f'<text x="12" y="{top + ph / 2}" text-anchor="middle" stroke="none" '
        f'transform="rotate(-90 12 {top + ph / 2})">{escape(y_label)}</text></g>'
    )
    for s in series:
        pts: list[tuple[float, float]] = []
        for i, (x, y) in enumerate(s.points):
            if s.step and i:
                pts.append((x, s.points[i - 1][1]))
            pts.append((x, y))
        path = " ".join(f"{_fmt(px(x))},{_fmt(py(y))}" for x, y in pts)
        out.append(
            f'<polyline class="series" data-name="{escape(s.name)}" points="{path}" '
            f'fill="none" stroke="{s.color}" stroke-width="2"><title>{escape(s.name)}</title>'
            "</polyline>"
        )
    if len(series) > 1:
        for i, s in enumerate(series):
            y = top + 14 * i + 10
            out.append(
                f'<g class="legend"><rect x="{left + pw - 110}" y="{y - 8}" width="10" '
                f'height="10" fill="{s.color}"/><text x="{left + pw - 95}" y="{y + 1}" '
                f'font-size="11">{escape(s.name)}</text></g>'
            )
    out.append("</svg>")
    return "".join(out)


def stacked_bar(
    parts: Sequence[tuple[str, float, str]],
    *,
    css_class: str,
    scale_s: float,
    width: int = 900,
    height: int = 22,
) -> str:
    """One horizontal bar of ``(name, seconds, colour)`` parts; ``scale_s`` is the full width."""
    out = [
        f'<svg class="{escape(css_class)}" xmlns="http://www.w3.org/2000/svg" '
        f'width="{width}" height="{height}" viewBox="0 0 {width} {height}">'
    ]
    x = 0.0
    for name, seconds, color in parts:
        if seconds <= 0:
            continue
        w = seconds / scale_s * width if scale_s > 0 else 0.0
        out.append(
            f'<rect class="bar" data-name="{escape(name)}" x="{_fmt(x)}" y="0" '
            f'width="{_fmt(max(w, 1.0))}" height="{height}" fill="{color}">'
            f"<title>{escape(name)}: {seconds:.3f} s</title></rect>"
        )
        x += w
    out.append("</svg>")
    return "".join(out)
