"""A benchmark's chart as a standalone SVG file (white ground, a key above the plot), drawn with
the report's own line chart (:func:`unbroken.report.svg.line_chart`)."""

from __future__ import annotations

from collections.abc import Sequence

from unbroken.report.svg import PALETTE, Series, line_chart


def series(named: Sequence[tuple[str, Sequence[tuple[float, float]]]]) -> list[Series]:
    """One :class:`Series` a name, coloured in turn."""
    return [
        Series(name, tuple(points), PALETTE[i % len(PALETTE)])
        for i, (name, points) in enumerate(named)
    ]


def standalone(
    lines: Sequence[Series],
    *,
    css_class: str,
    x_label: str,
    y_label: str,
    width: int = 720,
    height: int = 320,
    key_step: int = 220,
) -> str:
    chart = line_chart(
        lines, css_class=css_class, x_label=x_label, y_label=y_label, width=width, height=height
    )
    key = "".join(
        f'<text x="{80 + key_step * i}" y="14" font-size="12" fill="{s.color}">{s.name}</text>'
        for i, s in enumerate(lines)
    )
    inner = chart.removeprefix(chart[: chart.index(">") + 1]).removesuffix("</svg>")
    full = height + 20
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{full}" '
        f'viewBox="0 0 {width} {full}" font-family="sans-serif"><rect width="{width}" '
        f'height="{full}" fill="white"/>{key}<g transform="translate(0,20)">{inner}</g></svg>\n'
    )
