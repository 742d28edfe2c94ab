"""The recovery benchmark's elastic figures, from step logs and ledger records written by hand:
the scale-in (every rank of the smaller world past the fault's step), the step time at each
size, and the option that makes the benchmark's script train with virtual ranks."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[3] / "bench"
sys.path.insert(0, str(BENCH))

from recovery_bench.configs import CONFIGS, Settings, baselines_for  # noqa: E402
from recovery_bench.steplogs import Incarnation, elastic_figures, shrunk_mttr  # noqa: E402

pytestmark = pytest.mark.unit


def _inc(rank: int, began_at: float, done: list[tuple[float, int]]) -> Incarnation:
    return Incarnation(
        rank=rank,
        pid=1000 + rank,
        began_at=began_at,
        started_at=began_at,
        start_step=0,
        done=tuple(done),
        killed_at=None,
    )


def _steps(first: int, last: int, t0: float, every_s: float) -> list[tuple[float, int]]:
    return [(t0 + (n - first) * every_s, n) for n in range(first, last + 1)]


def test_scale_in_waits_for_every_rank_outside_the_lost_pod() -> None:
    # Rank 3 committed step 10 at t=1.0; its node died. Ranks 0 and 1 train on from t=4.0.
    ranks01 = [_inc(r, 0.0, [*_steps(1, 10, 0.1, 0.1), (4.0 + r, 11)]) for r in (0, 1)]
    lost = [_inc(r, 0.0, _steps(1, 10, 0.1, 0.1)) for r in (2, 3)]
    assert shrunk_mttr([*ranks01, *lost], fault_at=1.0, kill_step=10) == pytest.approx(4.0)
    # Rank 1 not yet past step 10: the job has not scaled in yet.
    only0 = [ranks01[0], _inc(1, 0.0, _steps(1, 10, 0.1, 0.1)), *lost]
    assert shrunk_mttr(only0, fault_at=1.0, kill_step=10) is None
    # A rank 0 started after the fault is not the one that trained on.
    restarted = [_inc(0, 2.0, [(5.0, 11)]), ranks01[1], *lost]
    assert shrunk_mttr(restarted, fault_at=1.0, kill_step=10) is None


def test_step_time_split_by_world_size() -> None:
    # Full size: 50 ms a step until the fault at t=1.0; scaled in from t=3.0: 80 ms a step
    # until the pause at t=3.8; full again from t=5.0: 50 ms a step.
    done = [
        *_steps(1, 20, 0.05, 0.05),
        *_steps(21, 31, 3.0, 0.08),
        *_steps(32, 40, 5.0, 0.05),
    ]
    ledger = {
        "ScaledIn": [{"world_size": 2, "from_world_size": 4, "step": 21, "took_s": 0.4, "at": 3.0}],
        "ScaledOut": [
            {"world_size": 4, "from_world_size": 2, "step": 32, "took_s": 1.2, "at": 5.0}
        ],
    }
    f = elastic_figures([_inc(0, 0.0, done)], fault_at=1.0, ledger=ledger)
    assert f.scaled_in and f.scaled_out
    assert (f.scale_in_s, f.scale_out_s, f.shrunk_size) == (0.4, 1.2, 2)
    assert f.shrunk_steps == 11
    assert f.shrunk_step_ms == pytest.approx(80.0)
    assert f.full_step_ms == pytest.approx(50.0)
    never_out = elastic_figures([_inc(0, 0.0, done)], 1.0, {"ScaledIn": ledger["ScaledIn"]})
    assert not never_out.scaled_out and never_out.scale_out_s is None
    assert never_out.shrunk_steps == len(done) - 20  # to the end of the run


def test_elastic_configuration_trains_with_virtual_ranks_and_has_its_own_baseline() -> None:
    import steplog

    elastic = next(c for c in CONFIGS if c.key == "unbroken-elastic")
    assert elastic.reference == "unbroken-vranks"
    assert steplog.example(["--steps=60", *elastic.script_args]).name == "train_elastic.py"
    assert steplog.example(["--steps=60"]).name == "train_mlp.py"
    assert [b.key for b in baselines_for(["unbroken-recover"])] == ["unbroken", "torchrun"]
    assert "unbroken-vranks" in [b.key for b in baselines_for(["unbroken-elastic"])]
    s = Settings(1, 60, 35, 10, 0.03, 60.0, 300.0)
    assert s.kill_step < s.clear_step < s.steps
