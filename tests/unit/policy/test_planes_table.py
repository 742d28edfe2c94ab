"""The link-failover table of ``unbroken.policy.planes``, row by row (ids as in its docstring)."""

from __future__ import annotations

import re

import pytest

import unbroken.policy.planes as planes_module
from unbroken.policy.planes import (
    CollectiveFailed,
    CommWatch,
    PlaneCommand,
    PlaneConfig,
    PlaneReported,
    Planes,
    PlaneSlow,
    PlaneSwitched,
    PlaneTick,
    SwitchPlane,
    decide_plane,
    start_plane,
)

pytestmark = pytest.mark.unit

ON = PlaneConfig(enabled=True, hold_s=5.0)
OFF = PlaneConfig(enabled=False, hold_s=5.0)


def _all_up(at: float = 0.0, names: tuple[str, ...] = ("a", "b")) -> Planes:
    """Two nodes, every plane up since ``at``, the first active."""
    state = Planes.declared(names)
    for node in ("n0", "n1"):
        for plane in names:
            state = decide_plane(state, PlaneReported(node, plane, True, at), ON).state
    return state


def _down(state: Planes, node: str, plane: str, at: float, config: PlaneConfig = ON) -> Planes:
    return decide_plane(state, PlaneReported(node, plane, False, at), config).state


def test_p1_a_report_of_a_plane_not_in_use_is_recorded_only() -> None:
    d = decide_plane(_all_up(), PlaneReported("n1", "b", False, 3.0), ON)
    assert d.command is None
    assert not d.state.healthy("b") and d.state.down_on("b") == ("n1",)
    again = decide_plane(d.state, PlaneReported("n1", "b", False, 4.0), ON)
    assert again.command is None and again.state == d.state  # same state again: nothing


def test_p2_the_active_plane_down_fails_over_to_the_first_healthy_plane() -> None:
    state = _all_up(names=("a", "b", "c"))
    state = _down(state, "n0", "b", 1.0)  # b is down on n0: c is the healthy one
    d = decide_plane(state, PlaneReported("n1", "a", False, 2.0), ON)
    assert d.command == SwitchPlane(to="c", planned=False, reason=d.reason)
    assert d.reason == "plane a down on n1: failover to plane c"
    assert d.state.switching == "c" and d.state.active == "a"


@pytest.mark.parametrize(
    ("config", "b_up", "why"),
    [
        (OFF, True, "link failover is off for this job"),
        (ON, False, "no other plane is up on every node"),
    ],
)
def test_p3_no_failover_when_off_or_no_other_plane_is_healthy(
    config: PlaneConfig, b_up: bool, why: str
) -> None:
    state = _all_up() if b_up else _down(_all_up(), "n0", "b", 1.0)
    d = decide_plane(state, PlaneReported("n1", "a", False, 2.0), config)
    assert d.command is None and d.reason == f"plane a down on n1; {why}"


def test_p4_reports_during_a_switch_are_recorded_without_a_command() -> None:
    switching = decide_plane(_all_up(), PlaneReported("n1", "a", False, 2.0), ON).state
    d = decide_plane(switching, PlaneReported("n0", "a", False, 2.5), ON)
    assert d.command is None and d.state.down_on("a") == ("n0", "n1")


def test_p5_switchback_once_the_preferred_plane_held_up_for_the_hold_time() -> None:
    state = decide_plane(_all_up(), PlaneReported("n1", "a", False, 2.0), ON).state
    state = decide_plane(state, PlaneSwitched(to="b", ok=True), ON).state
    assert state.active == "b" and state.switching is None
    state = decide_plane(state, PlaneReported("n1", "a", True, 10.0), ON).state
    assert decide_plane(state, PlaneTick(now=14.9), ON).command is None  # held 4.9 s < 5 s
    d = decide_plane(state, PlaneTick(now=15.0), ON)
    assert d.command == SwitchPlane(to="a", planned=True, reason=d.reason)
    assert d.reason.startswith("plane a up on every node for 5.0 s (hold 5 s): switchback")
    back = decide_plane(d.state, PlaneSwitched(to="a", ok=True), ON).state
    assert back.active == "a" and decide_plane(back, PlaneTick(now=99.0), ON).command is None


def test_p6_a_tick_fails_over_when_the_active_plane_is_down_after_a_failed_switch() -> None:
    state = decide_plane(_all_up(), PlaneReported("n1", "a", False, 2.0), ON).state
    state = decide_plane(state, PlaneSwitched(to="b", ok=False), ON).state
    assert state.active == "a" and state.switching is None
    d = decide_plane(state, PlaneTick(now=3.0), ON)
    assert d.command == SwitchPlane(to="b", planned=False, reason=d.reason)


def test_p7_operator_commands_switch_pin_and_are_refused_with_the_reason() -> None:
    state = _all_up()
    d = decide_plane(state, PlaneCommand(to="b", at=1.0), ON)
    assert d.command is not None and d.command.to == "b" and d.command.planned
    assert d.state.pinned  # moved off the preferred plane: no automatic switchback
    on_b = decide_plane(d.state, PlaneSwitched(to="b", ok=True), ON).state
    assert decide_plane(on_b, PlaneTick(now=100.0), ON).command is None
    back = decide_plane(on_b, PlaneCommand(to="", at=101.0), ON)  # "": switchback
    assert back.command is not None and back.command.to == "a" and not back.state.pinned
    for cmd, why in [
        (PlaneCommand(to="z", at=1.0), "plane 'z' is not one of the job's (a, b)"),
        (PlaneCommand(to="a", at=1.0), "plane a is already active"),
    ]:
        r = decide_plane(state, cmd, ON)
        assert r.refused and r.command is None and r.reason == why
    r = decide_plane(_down(state, "n1", "b", 1.0), PlaneCommand(to="b", at=2.0), ON)
    assert r.refused and r.reason == "plane b is down on n1"
    r = decide_plane(d.state, PlaneCommand(to="a", at=2.0), ON)
    assert r.refused and r.reason == "a switch to plane b is under way"
    r = decide_plane(state, PlaneCommand(to="b", at=2.0), OFF)
    assert r.refused and r.reason.startswith("link failover is off for this job")


def test_p8_a_failed_switch_keeps_the_active_plane() -> None:
    state = decide_plane(_all_up(), PlaneCommand(to="b", at=1.0), ON).state
    d = decide_plane(state, PlaneSwitched(to="b", ok=False), ON)
    assert d.state.active == "a" and d.state.switching is None


def test_p9_no_planes_declared_nothing_happens() -> None:
    for event in (
        PlaneReported("n0", "a", False, 1.0),
        PlaneTick(now=1.0),
        PlaneCommand(to="", at=1.0),
    ):
        d = decide_plane(Planes(), event, ON)
        assert d.command is None and d.state == Planes() and d.refused
    assert d.reason.startswith("no network planes declared (unbroken launch --join")


def test_p10_a_collective_failed_with_every_carrier_up_fails_over_and_suspects_the_plane() -> None:
    d = decide_plane(_all_up(), CollectiveFailed("rank 2 on node-1", 5.0), ON)
    assert d.command == SwitchPlane(to="b", planned=False, reason=d.reason)
    assert d.reason == "a collective failed on plane a (rank 2 on node-1): failover to plane b"
    on_b = decide_plane(d.state, PlaneSwitched(to="b", ok=True), ON).state
    assert on_b.suspect == {"a"}
    # Carrier up on every node says nothing about the suspect plane: no switchback by itself.
    assert decide_plane(on_b, PlaneTick(now=100.0), ON).command is None
    # A second failure, on b: no healthy plane left; the ladder has it.
    again = decide_plane(on_b, CollectiveFailed("rank 0 on node-0", 6.0), ON)
    assert again.command is None and again.refused
    assert again.reason.endswith("no other plane is up on every node")
    # Plane a went down and came back on node-1: repaired, switched back after the hold.
    fixed = _down(on_b, "node-1", "a", 10.0)
    fixed = decide_plane(fixed, PlaneReported("node-1", "a", True, 11.0), ON).state
    assert fixed.suspect == frozenset()
    back = decide_plane(fixed, PlaneTick(now=16.0), ON)
    assert back.command is not None and back.command.to == "a"
    # Or an operator sends the job back at once, which clears the suspicion too.
    by_hand = decide_plane(on_b, PlaneCommand(to="", at=7.0), ON)
    assert by_hand.command is not None and by_hand.state.suspect == frozenset()
    # Failover off, or a switch under way: the ladder's, nothing here.
    assert decide_plane(_all_up(), CollectiveFailed("r", 5.0), OFF).command is None
    assert decide_plane(d.state, CollectiveFailed("r", 5.5), ON).command is None


def test_p12_processes_started_anew_start_on_a_healthy_plane() -> None:
    state = _all_up(names=("a", "b", "c"))
    assert start_plane(state) == "a"  # the active plane, healthy
    state = _down(state, "n1", "a", 1.0)
    assert start_plane(state) == "b"  # a is down on n1: the first healthy plane
    state = _down(state, "n0", "b", 2.0)
    assert start_plane(state) == "c"
    state = _down(state, "n0", "c", 3.0)
    assert start_plane(state) == "a"  # none healthy: the active one
    suspect = decide_plane(_all_up(), CollectiveFailed("ranks 0-3", 1.0), ON).state
    assert "a" in suspect.suspect and start_plane(suspect) == "b"
    assert start_plane(Planes()) == ""  # no planes declared


def test_every_row_of_the_docstring_has_a_test() -> None:
    doc = planes_module.__doc__ or ""
    rows = sorted(set(re.findall(r"^- (P\d+) ", doc, flags=re.M)))
    tested = {name.split("_")[1].upper() for name in globals() if name.startswith("test_p")}
    assert rows and set(rows) == tested


def test_p11_a_slow_active_plane_is_left_at_a_step_boundary_and_held_suspect() -> None:
    slow = PlaneSlow("a", 6.0, "plane a slow: 6.0x", 10.0)
    d = decide_plane(_all_up(), slow, ON)
    assert d.command == SwitchPlane(to="b", planned=True, reason=d.reason)
    assert d.reason == "plane a slow: 6.0x (sub-health): switch to plane b"
    assert d.state.suspect == frozenset({"a"}) and d.state.switching == "b"
    back = decide_plane(
        decide_plane(d.state, PlaneSwitched("b", ok=True), ON).state, PlaneTick(100.0), ON
    )
    assert back.command is None, "switched back to a plane held slow"


@pytest.mark.parametrize(
    ("config", "b_up", "why"),
    [(OFF, True, "link failover is off"), (ON, False, "no other plane is healthy")],
)
def test_p11_a_slow_plane_with_nowhere_to_go_keeps_training(
    config: PlaneConfig, b_up: bool, why: str
) -> None:
    state = _all_up() if b_up else _down(_all_up(), "n0", "b", 1.0)
    d = decide_plane(state, PlaneSlow("a", 6.0, "plane a slow", 10.0), config)
    assert d.command is None and d.reason == f"plane a slow (sub-health); {why}: training goes on"


def _watch(values: list[float], plane: str = "a") -> list[PlaneSlow | None]:
    w = CommWatch()
    w.observe(plane, 0, 0.0, 0.0)
    return [w.observe(plane, step, v, float(step)) for step, v in enumerate(values, start=1)]


def test_comm_watch_finds_a_plane_slow_against_its_own_baseline_once() -> None:
    base = [0.5, 0.5, 0.010, 0.012, 0.011, 0.010, 0.013]  # warm-up, then the baseline
    out = _watch([*base, 0.2, 0.2, 0.2, 0.2, 0.2])
    found = [(i, o) for i, o in enumerate(out) if o is not None]
    assert len(found) == 1 and found[0][0] == len(base) + 2, found  # the third slow step
    slow = found[0][1]
    assert slow is not None and slow.plane == "a" and slow.ratio == pytest.approx(0.2 / 0.011)


@pytest.mark.parametrize(
    "tail",
    [
        [0.05, 0.05, 0.05, 0.05],  # under the 50 ms floor above a 11 ms baseline
        [0.2, 0.2, 0.011, 0.2, 0.2],  # never three slow steps in a row
    ],
)
def test_comm_watch_ignores_jitter_and_short_bursts(tail: list[float]) -> None:
    base = [0.5, 0.5, 0.010, 0.012, 0.011, 0.010, 0.013]
    assert all(o is None for o in _watch([*base, *tail]))


def test_comm_watch_starts_a_new_baseline_on_another_plane() -> None:
    w = CommWatch()
    for step, v in enumerate([0.01] * 8, start=1):
        w.observe("a", step, v, float(step))
    assert w.baseline_s == pytest.approx(0.01)
    assert w.observe("b", 9, 0.3, 9.0) is None and w.baseline_s is None and w.plane == "b"
