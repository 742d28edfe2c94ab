"""The executor's side of link failover (``unbroken.manager.planes``): what it asks of the
executor and what it writes to a real ledger, with the executor's calls recorded."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

import pytest

from unbroken.ledger import Ledger
from unbroken.manager.console import Console
from unbroken.manager.planes import SWITCH_TIMEOUT_S, PlaneSwitcher
from unbroken.manager.progress import RankView
from unbroken.policy.planes import PlaneConfig

pytestmark = pytest.mark.unit


class Executor:
    """The calls the switcher makes, and whether a recovery holds the ranks."""

    def __init__(self) -> None:
        self.busy = False
        self.calls: list[tuple[str, object]] = []


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[Ledger]:
    led = Ledger(tmp_path / "ledger.db")
    yield led
    led.close()


def _switcher(ledger: Ledger, ex: Executor, enabled: bool = True) -> PlaneSwitcher:
    return PlaneSwitcher(
        PlaneConfig(enabled=enabled, hold_s=5.0),
        ledger,
        Console(out=io.StringIO()),
        busy=lambda: ex.busy,
        cut=lambda plane: ex.calls.append(("cut", plane)),
        begin=lambda now: ex.calls.append(("pause", now)),
    )


def _up(sw: PlaneSwitcher, at: float) -> None:
    for node in ("node-0", "node-1"):
        for plane in ("a", "b"):
            sw.reported(node, plane, True, at, ("a", "b"))


def _kinds(ledger: Ledger, kind: str) -> list[dict[str, object]]:
    return [r.data for r in ledger.events(kinds=[kind])]


def test_failover_then_switchback_are_carried_out_and_recorded(ledger: Ledger) -> None:
    ex = Executor()
    sw = _switcher(ledger, ex)
    _up(sw, 100.0)
    assert sw.active == "a" and ex.calls == []
    sw.reported("node-1", "a", False, 110.0, ("a", "b"))
    # The lost plane's connections are cut first, then the ranks pause.
    assert ex.calls == [("cut", "a"), ("pause", 110.0)]
    assert sw.rejoin_plane(3) == "b" and sw.rejoin_plane(4) == ""  # the next rejoin only
    sw.committed(3, 110.6, 41)
    assert sw.active == "b" and sw.switch is None
    [rec] = _kinds(ledger, "PlaneFailover")
    assert (rec["from_plane"], rec["to"], rec["planned"], rec["step"]) == ("a", "b", False, 41)
    assert rec["pause_s"] == pytest.approx(0.6)

    sw.reported("node-1", "a", True, 120.0, ("a", "b"))
    sw.tick(124.9)
    assert len(ex.calls) == 2  # held 4.9 s of 5
    sw.tick(125.0)
    assert ex.calls[2:] == [("pause", 125.0)]  # a switchback cuts nothing
    assert sw.rejoin_plane(5) == "a"
    sw.committed(5, 125.4, 60)
    [back] = _kinds(ledger, "PlaneSwitchback")
    assert (back["to"], back["planned"], back["generation"]) == ("a", True, 5)
    downs = [e for e in _kinds(ledger, "PlaneChanged") if not e["up"]]
    assert [(e["node"], e["plane"]) for e in downs] == [("node-1", "a")]


def test_a_loss_during_a_recovery_fails_over_once_it_is_over(ledger: Ledger) -> None:
    ex = Executor()
    sw = _switcher(ledger, ex)
    _up(sw, 100.0)
    ex.busy = True
    sw.reported("node-0", "a", False, 110.0, ("a", "b"))
    sw.tick(110.5)
    assert ex.calls == [] and sw.switch is None
    refused = sw.command("b", 110.6)
    assert refused.refused and "under way" in refused.reason
    ex.busy = False
    sw.tick(111.0)  # the plane's loss was kept: the failover happens now
    assert ex.calls == [("cut", "a"), ("pause", 111.0)]


def test_a_switch_that_commits_nothing_is_given_up(ledger: Ledger) -> None:
    ex = Executor()
    sw = _switcher(ledger, ex)
    _up(sw, 100.0)
    d = sw.command("b", 101.0)
    assert not d.refused and ex.calls == [("pause", 101.0)]
    sw.tick(101.0 + SWITCH_TIMEOUT_S + 1)
    assert sw.switch is None and sw.active == "a"
    assert not _kinds(ledger, "PlaneFailover")


def test_failover_off_records_the_loss_and_leaves_the_ranks_alone(ledger: Ledger) -> None:
    ex = Executor()
    sw = _switcher(ledger, ex, enabled=False)
    _up(sw, 100.0)
    sw.reported("node-1", "a", False, 110.0, ("a", "b"))
    sw.tick(200.0)
    assert ex.calls == [] and sw.active == "a"
    assert len(_kinds(ledger, "PlaneChanged")) == 5
    assert sw.command("b", 201.0).reason.startswith("link failover is off")


def test_a_slow_active_plane_is_recorded_and_left_at_a_step_boundary(ledger: Ledger) -> None:
    """The ranks' exposed communication grows tenfold on plane a: after three slow steps the
    plane is recorded sub-healthy and the ranks pause to regroup over b (nothing is cut:
    no collective failed)."""
    ex = Executor()
    views = {r: RankView(rank=r, pid=100 + r, generation=0, session=True) for r in range(4)}
    sw = PlaneSwitcher(
        PlaneConfig(enabled=True, hold_s=5.0),
        ledger,
        Console(out=io.StringIO()),
        busy=lambda: ex.busy,
        cut=lambda plane: ex.calls.append(("cut", plane)),
        begin=lambda now: ex.calls.append(("pause", now)),
        ranks=lambda: views,
    )
    _up(sw, 100.0)
    comm = [0.01] * 8 + [0.2] * 3
    for step, wait_s in enumerate(comm, start=1):
        for v in views.values():
            v.committed, v.comm_time_s = step, wait_s
        sw.tick(100.0 + step)
    (found,) = _kinds(ledger, "PlaneSubHealthy")
    assert found == {"plane": "a", "comm_s": 0.2, "baseline_s": 0.01, "steps": 3}, found
    assert ex.calls == [("pause", 111.0)], "a slow plane is not cut, only left"
    assert sw.switch is not None and sw.switch.to == "b" and sw.switch.planned
    assert sw.state.suspect == frozenset({"a"})


def test_a_switch_under_way_is_carried_out_by_a_generation_started_anew(ledger: Ledger) -> None:
    """The job is rescheduled while a failover waits for its ranks: the new generation's
    processes start on the plane switched to, and its first commit ends the switch."""
    ex = Executor()
    sw = _switcher(ledger, ex)
    _up(sw, 100.0)
    sw.reported("node-1", "a", False, 110.0, ("a", "b"))
    assert ex.calls == [("cut", "a"), ("pause", 110.0)]
    assert sw.start_plane(4) == "b" and sw.start_plane(4) == "b"  # every pod of generation 4
    assert sw.rejoin_plane(5) == ""  # the switch is generation 4's
    sw.committed(4, 112.0, 20)
    assert sw.active == "b" and sw.switch is None
    [rec] = _kinds(ledger, "PlaneFailover")
    assert (rec["to"], rec["generation"], rec["pause_s"]) == ("b", 4, pytest.approx(2.0))


def test_processes_started_anew_avoid_a_plane_down_somewhere(ledger: Ledger) -> None:
    """Plane a goes down on node-1 while a recovery holds the ranks (no switch can begin):
    the rescheduled generation starts on plane b, which becomes the active plane, and the
    automatic switchback brings the job back once a is up again."""
    ex = Executor()
    out = io.StringIO()
    sw = PlaneSwitcher(
        PlaneConfig(enabled=True, hold_s=5.0),
        ledger,
        Console(out=out),
        busy=lambda: ex.busy,
        cut=lambda plane: ex.calls.append(("cut", plane)),
        begin=lambda now: ex.calls.append(("pause", now)),
    )
    _up(sw, 100.0)
    assert sw.start_plane(1) == "a"  # healthy: the active plane
    ex.busy = True
    sw.reported("node-1", "a", False, 110.0, ("a", "b"))
    assert ex.calls == [] and sw.switch is None
    assert sw.start_plane(2) == "b" and sw.active == "b"
    assert "plane a is down on node-1: generation 2 starts on plane b" in out.getvalue()
    ex.busy = False
    sw.tick(111.0)
    assert ex.calls == []  # b is active and healthy: nothing to do
    sw.reported("node-1", "a", True, 120.0, ("a", "b"))
    sw.tick(125.0)
    assert ex.calls == [("pause", 125.0)] and sw.rejoin_plane(3) == "a"  # the switchback
