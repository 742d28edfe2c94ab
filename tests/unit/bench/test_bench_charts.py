"""The benchmarks' charts (bench/svgplot.py and each benchmark's ``--svg``), drawn from results
made up here: a well-formed SVG with every series named in its key, nothing of a run needed."""

from __future__ import annotations

import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[3] / "bench"
sys.path.insert(0, str(BENCH))

import overhead_size  # noqa: E402
import scale  # noqa: E402
from model_size import SizeResult, svg  # noqa: E402

pytestmark = pytest.mark.unit

NS = "{http://www.w3.org/2000/svg}"


def _keys(text: str) -> list[str]:
    root = ET.fromstring(text)
    assert root.tag == f"{NS}svg"
    return [t.text or "" for t in root.findall(f"{NS}text")]


def test_the_scale_chart_names_each_line_and_skips_what_was_not_measured() -> None:
    results = [
        scale.Result(n=n, mttr=[3.0 + i, 4.0 + i], orders_all=[0.4 * n / 1000])
        for i, n in enumerate((1000, 2000, 5000))
    ]
    text = scale.svg(results)
    assert _keys(text) == [
        "MTTR p50 (s)",
        "MTTR max (s)",
        "every agent has its orders (s)",
        "rejoin first to last (s)",
    ]
    drawn = dict(re.findall(r'<polyline class="series" data-name="([^"]+)" points="([^"]*)"', text))
    assert len(drawn["MTTR p50 (s)"].split()) == 3
    assert drawn["rejoin first to last (s)"] == ""  # never measured: no point for it


def test_the_overhead_chart_draws_each_part_as_a_share_of_the_plain_step() -> None:
    r = {
        "plain_s": [0.1, 0.1, 0.1],
        "session_s": 100e-6,
        "snapshot_s": 40e-6,
        "tape_s": 40e-6,
        "check_s": 0.01,
    }
    text = overhead_size.svg([(10_000_000, r), (50_000_000, r)], agree_every=100)
    assert _keys(text)[-1] == "the aim (1 %)"
    drawn = dict(re.findall(r'<polyline class="series" data-name="([^"]+)" points="([^"]*)"', text))
    assert len(drawn) == 4 and all(len(p.split()) == 2 for p in drawn.values())


def test_the_model_size_chart_still_draws_without_runs() -> None:
    text = svg([SizeResult(name="10M", params=10_000_000, loopback={})])
    assert len(_keys(text)) == 3
