"""The model-size benchmark's arithmetic and log reading (bench/model_size.py), without runs."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[3] / "bench"
sys.path.insert(0, str(BENCH))

from model_size import SIZES, params_of, read_repairs, slope  # noqa: E402
from recovery_bench.configs import Settings  # noqa: E402

pytestmark = pytest.mark.unit


def test_the_sizes_are_the_parameter_counts_they_are_named_after() -> None:
    for name, (width, layers) in SIZES.items():
        named = float(name.removesuffix("M")) * 1e6
        assert abs(params_of(width, layers) - named) / named < 0.05, name


def test_the_model_arguments_reach_the_script() -> None:
    s = Settings(1, 20, 14, 10, 0.0, 60.0, 300.0, model_args=("--width=1024", "--layers=10"))
    assert s.script_args()[-2:] == ["--width=1024", "--layers=10"]


def test_a_line_through_points_and_none_through_one_size() -> None:
    a, b = slope([(1.0, 3.0), (2.0, 5.0), (3.0, 7.0)]) or (0.0, 0.0)
    assert (a, b) == pytest.approx((1.0, 2.0))
    assert slope([(1.0, 3.0), (1.0, 4.0)]) is None


def test_the_repairs_are_read_from_the_step_logs(tmp_path: Path) -> None:
    logs = tmp_path / "steplog"
    logs.mkdir()
    (logs / "rank3-77.log").write_text(
        "1.0 begin 0\n"
        "2.5 replica sent 88 tensors (115.1 MB) of step 14 to the repaired ranks\n"
        "2.6 replica rank 3 took 115.1 MB of step 14 from rank 0: transfer 0.373 s (309 MB/s) "
        "after 0.012 s of group setup, checked 0.011 s later\n"
        "2.7 start 14\n"
    )
    (found,) = read_repairs(tmp_path)
    assert (found.rank, found.mb, found.transfer_s, found.setup_s, found.check_s) == (
        3,
        115.1,
        0.373,
        0.012,
        0.011,
    )
    assert found.rate_mb_s == pytest.approx(115.1 / 0.373)
