"""Link failover between network planes: which plane the ranks' collectives use. Pure.

A host may reach its peers over two (or more) network planes, the seed's dual-plane parameter
network. Each host declares its planes in order of preference (``unbroken launch --join ...
--plane a=IFNAME --plane b=IFNAME``); the first is the one a job starts on (unless it is down
somewhere when processes start anew: P12). A plane carries the ranks' collectives only (gloo's
``GLOO_SOCKET_IFNAME``): the control channel and the rendezvous store stay on the address the
host joined by, so a plane going down never cuts a host off its control plane. The switch
itself is a regroup in every rank's own process (the executor's rejoin): no process restarts,
no step trained twice.

The job enables it with ``MS_ENABLE_TFT``'s ``TSP:1``, or for PyTorch with ``retry`` and
``HCCL_OP_RETRY_ENABLE`` on at ``L1`` (the seed's configuration). Planes are *healthy* when
they are up on every node that declared them; a node's plane is up while its interface has
carrier.

Decision table (row ids are the unit tests')
============================================

- P1  a plane report that changes nothing the job uses (another plane than the active one, or
  the same state again): its health is recorded; no command.
- P2  the active plane goes down on a node, failover enabled, no switch under way, another
  plane healthy: ``SwitchPlane(to=the first healthy plane in preference order,
  planned=False)``.
- P3  as P2 with failover off or no other plane healthy: no command; the failed collectives
  are faults for the recovery ladder as without planes (the reason says why).
- P4  any report while a switch is under way: recorded; no command (a plane lost meanwhile is
  seen once the switch is done, by the next report or tick: P5/P7).
- P5  ``PlaneTick``: the preferred plane is not active, has been healthy on every node for at
  least ``hold_s``, no switch is under way and no operator pinned the plane:
  ``SwitchPlane(to=preferred, planned=True)``: the automatic switchback, at a step boundary.
- P6  ``PlaneTick`` with the active plane down somewhere and another healthy (a switch that
  failed, or a loss reported during a switch): as P2.
- P7  ``PlaneCommand(to)``: an operator's switch. ``to`` empty means the preferred plane
  (switchback). Refused with the reason when link failover is off, the plane is unknown,
  already active, not healthy on every node, or a switch is under way. A switch away from
  the preferred plane pins the job there (no automatic switchback) until a switchback
  command.
- P8  ``PlaneSwitched(ok=True)``: the plane switched to is active. ``ok=False``: the switch is
  over, the active plane unchanged (the ladder had the faults).
- P9  no planes declared: every event, nothing (single-plane jobs are as before); an
  operator's command is refused, saying how planes are declared.
- P10 ``CollectiveFailed``: a collective of the job failed (a link fault) while every
  interface of the active plane has carrier (a fault further along the path: a switch, a
  cable's far end). With failover on, no switch under way and another plane healthy, the
  active plane becomes *suspect* and ``SwitchPlane(planned=False)`` moves the job off it: the
  fault is the plane's, not the ranks'. Otherwise no command (the ladder has the fault, as
  without planes). A suspect plane is not failed over to and not switched back to by itself
  (its carrier says nothing about it); a report of it coming up after going down, or an
  operator's command to it, clears the suspicion.
- P11 ``PlaneSlow``: the active plane is sub-healthy: the job's collectives on it have taken
  ``SLOW_FACTOR`` times their own time on it (:class:`CommWatch`, from the part of each step
  the ranks wait on their gradients alone) for ``SLOW_STEPS`` steps in a row, carrier up.
  With failover on, no switch under way and another plane healthy: the plane becomes suspect
  (as in P10) and ``SwitchPlane(planned=True)`` moves the job off it at a step boundary:
  nothing failed, no fault for the ladder. Otherwise no command (training goes on, slowly;
  the reason says why).
- P12 :func:`start_plane`: processes started anew (a rescheduled pod or job) start on the
  active plane while it is healthy; when it is down somewhere (or suspect) and another plane
  is healthy, on the first such plane in preference order, which becomes the active one (a
  plane down on a node would fail every new group that spans it); with none healthy, on the
  active plane.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

#: How long the preferred plane must stay up on every node before the automatic switchback.
SWITCHBACK_HOLD_S_DEFAULT = 5.0
#: A plane is slow (P11) when a step's exposed communication takes this many times its
#: baseline on that plane, and at least SLOW_MIN_EXTRA_S more (a fast network's jitter is not
#: sub-health), for SLOW_STEPS steps in a row. The baseline is the median of BASELINE_STEPS
#: steps after the first WARMUP_STEPS on the plane.
SLOW_FACTOR = 3.0
SLOW_MIN_EXTRA_S = 0.05
SLOW_STEPS = 3
BASELINE_STEPS = 5
WARMUP_STEPS = 2


@dataclass(frozen=True)
class PlaneHealth:
    up: bool
    since_at: float


@dataclass(frozen=True)
class Planes:
    """The job's planes in preference order, the active one, each node's plane health, and
    the planes a failed collective made suspect (P10)."""

    names: tuple[str, ...] = ()
    active: str = ""
    health: Mapping[tuple[str, str], PlaneHealth] = field(
        default_factory=lambda: MappingProxyType({})
    )
    switching: str | None = None  # the plane a switch under way goes to
    pinned: bool = False  # an operator moved the job off the preferred plane
    suspect: frozenset[str] = frozenset()

    @staticmethod
    def declared(names: tuple[str, ...]) -> Planes:
        return Planes(names=names, active=names[0] if names else "")

    def nodes(self) -> frozenset[str]:
        return frozenset(node for node, _ in self.health)

    def healthy(self, plane: str) -> bool:
        """Up on every node that reported its planes (and known to at least one), and not
        suspect."""
        nodes = self.nodes()
        return (
            bool(nodes)
            and plane not in self.suspect
            and all((h := self.health.get((n, plane))) is not None and h.up for n in nodes)
        )

    def healthy_since(self, plane: str) -> float | None:
        """Since when ``plane`` has been up on every node; None when it is not."""
        if not self.healthy(plane):
            return None
        return max(self.health[(n, plane)].since_at for n in self.nodes())

    def down_on(self, plane: str) -> tuple[str, ...]:
        return tuple(sorted(n for (n, p), h in self.health.items() if p == plane and not h.up))


@dataclass(frozen=True)
class SwitchPlane:
    """Every rank stops at a step boundary and regroups over ``to`` in its own process.
    ``planned``: a switchback or an operator's switch (nothing failed); else a failover."""

    to: str
    planned: bool
    reason: str


# ---- events ----------------------------------------------------------------------------
@dataclass(frozen=True)
class PlaneReported:
    node: str
    plane: str
    up: bool
    at: float


@dataclass(frozen=True)
class PlaneTick:
    now: float


@dataclass(frozen=True)
class PlaneCommand:
    to: str  # "": the preferred plane (switchback)
    at: float


@dataclass(frozen=True)
class CollectiveFailed:
    """A collective of the job failed (``where``: which rank, on which node) at ``at``."""

    where: str
    at: float


@dataclass(frozen=True)
class PlaneSwitched:
    to: str
    ok: bool


@dataclass(frozen=True)
class PlaneSlow:
    """The active ``plane`` is slow: its collectives take ``ratio`` times their baseline
    (``what`` says by how much, for the reason)."""

    plane: str
    ratio: float
    what: str
    at: float


PlaneEvent = PlaneReported | PlaneTick | PlaneCommand | PlaneSwitched | CollectiveFailed | PlaneSlow


@dataclass
class CommWatch:
    """The exposed communication of the job's steps on the active plane, against that plane's
    own baseline (P11). :meth:`observe` takes one value per committed step (the median of
    the ranks' ``comm_time_s``) and says when the plane has been slow for SLOW_STEPS steps."""

    plane: str = ""
    baseline_s: float | None = None
    samples: list[float] = field(default_factory=list)
    slow_steps: int = 0
    last_step: int = -1
    said: bool = False

    def observe(self, plane: str, step: int, comm_s: float, now: float) -> PlaneSlow | None:
        if plane != self.plane:  # a new plane: a new baseline
            self.plane, self.baseline_s, self.samples = plane, None, []
            self.slow_steps, self.said = 0, False
            self.last_step = step  # the step of the switch is not the plane's own
            return None
        if step <= self.last_step or comm_s <= 0.0:
            return None
        self.last_step = step
        if self.baseline_s is None:
            self.samples.append(comm_s)
            measured = self.samples[WARMUP_STEPS:]
            if len(measured) >= BASELINE_STEPS:
                self.baseline_s = sorted(measured)[len(measured) // 2]
            return None
        base = self.baseline_s
        if comm_s > max(SLOW_FACTOR * base, base + SLOW_MIN_EXTRA_S):
            self.slow_steps += 1
        else:
            self.slow_steps, self.said = 0, False
        if self.slow_steps < SLOW_STEPS or self.said:
            return None
        self.said = True
        ratio = comm_s / base if base > 0 else float("inf")
        what = (
            f"plane {plane} slow: the gradients' communication took {comm_s * 1000:.0f} ms "
            f"a step, {ratio:.1f}x its {base * 1000:.0f} ms on this plane, "
            f"{self.slow_steps} steps in a row"
        )
        return PlaneSlow(plane=plane, ratio=ratio, what=what, at=now)


@dataclass(frozen=True)
class PlaneDecision:
    state: Planes
    command: SwitchPlane | None
    reason: str
    refused: bool = False  # an operator's command that is not carried out


@dataclass(frozen=True)
class PlaneConfig:
    enabled: bool  # MS_ENABLE_TFT TSP:1
    hold_s: float = SWITCHBACK_HOLD_S_DEFAULT


def decide_plane(state: Planes, event: PlaneEvent, config: PlaneConfig) -> PlaneDecision:
    """The next plane state and the switch to make, if any (the table above)."""
    if not state.names:
        why = "no network planes declared (unbroken launch --join ... --plane NAME=IFNAME)"
        return PlaneDecision(state, None, why, refused=True)  # P9
    match event:
        case PlaneReported(node=node, plane=plane, up=up, at=at):
            return _reported(state, node, plane, up, at, config)
        case PlaneTick(now=now):
            return _tick(state, now, config)
        case PlaneCommand(to=to):
            return _command(state, to or state.names[0], config)
        case CollectiveFailed(where=where):
            return _collective_failed(state, where, config)
        case PlaneSlow(plane=plane, what=what):
            return _slow(state, plane, what, config)
        case PlaneSwitched(to=to, ok=ok):
            done = replace(state, switching=None)
            if not ok:
                return PlaneDecision(done, None, f"the switch to plane {to} did not complete")
            return PlaneDecision(replace(done, active=to), None, f"plane {to} active")  # P8


def _reported(
    state: Planes, node: str, plane: str, up: bool, at: float, config: PlaneConfig
) -> PlaneDecision:
    if plane not in state.names:
        return PlaneDecision(state, None, f"plane {plane} of {node} is not one of the job's")
    old = state.health.get((node, plane))
    if old is not None and old.up == up:
        return PlaneDecision(state, None, f"plane {plane} of {node} unchanged")  # P1
    health = dict(state.health)
    health[(node, plane)] = PlaneHealth(up=up, since_at=at)
    # A plane seen coming back after going down was repaired: no longer suspect (P10).
    suspect = state.suspect - {plane} if up and old is not None else state.suspect
    after = replace(state, health=MappingProxyType(health), suspect=suspect)
    word = "up" if up else "down"
    if after.switching is not None:  # P4
        return PlaneDecision(after, None, f"plane {plane} {word} on {node} during a switch")
    if up or plane != after.active:  # P1
        return PlaneDecision(after, None, f"plane {plane} {word} on {node}")
    return _failover(after, f"plane {plane} down on {node}", config)


def _failover(state: Planes, what: str, config: PlaneConfig) -> PlaneDecision:
    if not config.enabled:  # P3
        return PlaneDecision(state, None, f"{what}; link failover is off for this job")
    to = next((p for p in state.names if p != state.active and state.healthy(p)), None)
    if to is None:  # P3
        return PlaneDecision(state, None, f"{what}; no other plane is up on every node")
    return PlaneDecision(  # P2
        replace(state, switching=to),
        SwitchPlane(to=to, planned=False, reason=f"{what}: failover to plane {to}"),
        f"{what}: failover to plane {to}",
    )


def _collective_failed(state: Planes, where: str, config: PlaneConfig) -> PlaneDecision:
    what = f"a collective failed on plane {state.active} ({where})"
    if state.switching is not None:
        return PlaneDecision(state, None, f"{what} during a switch", refused=True)
    if not state.healthy(state.active) and state.nodes():
        # A plane down is P2's (a failover is decided or refused there): not a new suspicion.
        return PlaneDecision(state, None, f"{what}, a plane down", refused=True)
    d = _failover(state, what, config)
    if d.command is None:
        return replace(d, refused=True)
    return replace(d, state=replace(d.state, suspect=state.suspect | {state.active}))


def _slow(state: Planes, plane: str, what: str, config: PlaneConfig) -> PlaneDecision:
    if plane != state.active or state.switching is not None:
        return PlaneDecision(state, None, f"{what}; not the active plane, or a switch is under way")
    to = next((p for p in state.names if p != plane and state.healthy(p)), None)
    if not config.enabled or to is None:
        why = "link failover is off" if not config.enabled else "no other plane is healthy"
        return PlaneDecision(state, None, f"{what} (sub-health); {why}: training goes on")
    reason = f"{what} (sub-health): switch to plane {to}"
    return PlaneDecision(  # P11
        replace(state, switching=to, suspect=state.suspect | {plane}),
        SwitchPlane(to=to, planned=True, reason=reason),
        reason,
    )


def _tick(state: Planes, now: float, config: PlaneConfig) -> PlaneDecision:
    if state.switching is not None or not config.enabled:
        return PlaneDecision(state, None, "")
    if not state.healthy(state.active) and state.nodes():  # P6
        down = ", ".join(state.down_on(state.active))
        return _failover(state, f"plane {state.active} down on {down}", config)
    preferred = state.names[0]
    if state.active == preferred or state.pinned:
        return PlaneDecision(state, None, "")
    since = state.healthy_since(preferred)
    if since is None or now - since < config.hold_s:
        return PlaneDecision(state, None, "")
    reason = (
        f"plane {preferred} up on every node for {now - since:.1f} s "
        f"(hold {config.hold_s:g} s): switchback"
    )
    return PlaneDecision(  # P5
        replace(state, switching=preferred),
        SwitchPlane(to=preferred, planned=True, reason=reason),
        reason,
    )


def _command(state: Planes, to: str, config: PlaneConfig) -> PlaneDecision:
    why = ""
    if not config.enabled:
        why = (
            "link failover is off for this job (MS_ENABLE_TFT TSP:1 turns it on, or for "
            "PyTorch retry with HCCL_OP_RETRY_ENABLE on at L1)"
        )
    elif to not in state.names:
        why = f"plane {to!r} is not one of the job's ({', '.join(state.names)})"
    elif state.switching is not None:
        why = f"a switch to plane {state.switching} is under way"
    elif to == state.active:
        why = f"plane {to} is already active"
    elif not replace(state, suspect=frozenset()).healthy(to):  # an operator may clear suspicion
        down = ", ".join(state.down_on(to)) or "a node that has not reported it"
        why = f"plane {to} is down on {down}"
    if why:
        return PlaneDecision(state, None, why, refused=True)
    reason = f"operator command: switch to plane {to}"
    return PlaneDecision(  # P7
        replace(state, switching=to, pinned=to != state.names[0], suspect=state.suspect - {to}),
        SwitchPlane(to=to, planned=True, reason=reason),
        reason,
    )


def start_plane(state: Planes) -> str:
    """P12: the plane processes started anew put their collectives on ("" without planes)."""
    if not state.names or state.healthy(state.active):
        return state.active
    return next((p for p in state.names if state.healthy(p)), state.active)


__all__ = [
    "SWITCHBACK_HOLD_S_DEFAULT",
    "CollectiveFailed",
    "CommWatch",
    "PlaneCommand",
    "PlaneConfig",
    "PlaneDecision",
    "PlaneEvent",
    "PlaneHealth",
    "PlaneReported",
    "PlaneSlow",
    "PlaneSwitched",
    "PlaneTick",
    "Planes",
    "SwitchPlane",
    "decide_plane",
    "start_plane",
]
