"""Carrying out link failover and switchback between network planes (the executor's part).

The decision is :func:`unbroken.policy.planes.decide_plane`'s; this module feeds it the pod
agents' plane reports, the clock and the operator's commands, and carries out its
:class:`~unbroken.policy.planes.SwitchPlane` through the executor's in-process rejoin:

1. a failover first has every pod's agent destroy its ranks' connections on the lost plane
   (``cut-plane``): a gradient all-reduce waiting on a link that is down fails at once on every
   host, and the step it belonged to is redone after the regroup, as ``retry`` redoes it;
2. every rank stops at a step boundary (``pause``); a failed collective of the pause is no
   fault (the job manager reads failures during a rejoin as part of it);
3. once every rank is stopped, each rejoins the next generation in its own process with the
   new plane's interface (``rejoin`` with ``plane``: the pod's agent maps the plane to this
   host's interface, the rank sets ``GLOO_SOCKET_IFNAME`` before it makes its new group);
4. the generation's first committed step ends the switch: :class:`~unbroken.ledger.
   PlaneFailover` or :class:`~unbroken.ledger.PlaneSwitchback` records the pause.

A switch waits while a recovery of the ladder or another rejoin is under way (the policy asks
again on the next tick), and is given up after :data:`SWITCH_TIMEOUT_S` without a commit.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from unbroken.ledger import Ledger, PlaneChanged, PlaneFailover, PlaneSubHealthy, PlaneSwitchback
from unbroken.manager.console import Console
from unbroken.manager.progress import RankView
from unbroken.policy.planes import (
    CollectiveFailed,
    CommWatch,
    PlaneCommand,
    PlaneConfig,
    PlaneDecision,
    PlaneEvent,
    PlaneReported,
    Planes,
    PlaneSwitched,
    PlaneTick,
    SwitchPlane,
    decide_plane,
    start_plane,
)

log = logging.getLogger(__name__)

#: A switch that has not committed a step this long after its pause is given up.
SWITCH_TIMEOUT_S = 60.0


@dataclass
class _Switch:
    to: str
    from_plane: str
    planned: bool
    reason: str
    paused_at: float
    generation: int | None = None
    restarted: bool = False  # carried out by processes started anew (a rescheduling)


class PlaneSwitcher:
    """The job's planes; ``begin`` pauses the ranks (the executor's rejoin), ``cut`` sends
    ``cut-plane`` to every pod, ``busy`` says whether a recovery or a rejoin is under way."""

    def __init__(
        self,
        config: PlaneConfig,
        ledger: Ledger,
        console: Console,
        *,
        busy: Callable[[], bool],
        cut: Callable[[str], None],
        begin: Callable[[float], None],
        ranks: Callable[[], Mapping[int, RankView]] = dict,
    ) -> None:
        self.config = config
        self.ledger = ledger
        self.console = console
        self._busy = busy
        self._cut = cut
        self._begin = begin
        self._ranks = ranks
        self.state = Planes()
        self.switch: _Switch | None = None
        self.comm = CommWatch()

    @property
    def active(self) -> str:
        return self.state.active

    def reported(self, node: str, plane: str, up: bool, at: float, names: tuple[str, ...]) -> None:
        """A pod's agent saw ``plane`` of ``node`` go down or come up."""
        if not self.state.names and names:
            self.state = Planes.declared(names)
            self.console.line(
                f"network planes {', '.join(names)}; collectives on {names[0]}"
                + ("; link failover on" if self.config.enabled else "")
            )
        old = self.state.health.get((node, plane))
        if old is None or old.up != up:
            self.ledger.record(PlaneChanged(node=node, plane=plane, up=up, changed_at=at))
        self._feed(PlaneReported(node=node, plane=plane, up=up, at=at), at)

    def tick(self, now: float) -> None:
        sw = self.switch
        if sw is not None and now - sw.paused_at > SWITCH_TIMEOUT_S:
            self.console.line(
                f"switch to plane {sw.to} given up: no step committed {SWITCH_TIMEOUT_S:.0f} s "
                "after the pause"
            )
            self.switch = None
            self._feed(PlaneSwitched(to=sw.to, ok=False), now)
            return
        if self.state.names:
            self.observe(self._ranks(), now)
            if self.switch is None:
                self._feed(PlaneTick(now=now), now)

    def observe(self, ranks: Mapping[int, RankView], now: float) -> None:
        """The ranks' newest committed step, as far as the active plane's speed goes: the
        median of what they waited on their gradients alone (P11: a slow plane is left)."""
        if not self.state.names or self.switch is not None:
            return
        live = [v for v in ranks.values() if v.alive and v.session and v.committed > 0]
        if not live:
            return
        step = max(v.committed for v in live)
        waits = sorted(v.comm_time_s for v in live if v.committed == step)
        if len(waits) < len(live):
            return  # not every rank has committed it yet
        median = waits[len(waits) // 2]
        slow = self.comm.observe(self.state.active, step, median, now)
        if slow is None:
            return
        self.ledger.record(
            PlaneSubHealthy(
                plane=slow.plane,
                comm_s=median,
                baseline_s=self.comm.baseline_s or 0.0,
                steps=self.comm.slow_steps,
            )
        )
        d = self._feed(slow, now)
        if d.command is None:
            self.console.line(d.reason)

    def command(self, to: str, now: float) -> PlaneDecision:
        """An operator's switch (``to`` empty: back to the preferred plane); the decision
        says whether it was refused and why."""
        return self._feed(PlaneCommand(to=to, at=now), now)

    def collective_failed(self, where: str, now: float) -> bool:
        """A collective of the job failed (a link fault, ``where``: the fault's ranks, pod and
        node): whether a failover away from the active plane began for it."""
        return self._feed(CollectiveFailed(where=where, at=now), now).command is not None

    def rejoin_plane(self, generation: int) -> str:
        """The plane a rejoin into ``generation`` puts the ranks on ("" when no switch is
        under way: they stay where they are); notes the generation the switch began."""
        sw = self.switch
        if sw is None or sw.generation is not None:
            return ""
        sw.generation = generation
        return sw.to

    def start_plane(self, generation: int) -> str:
        """The plane the agents of ``generation``, started anew (a rescheduled pod or job),
        put their ranks on ("" without planes). A switch under way is carried out by them (it
        ends when ``generation`` commits); otherwise the active plane, or, when it is down
        somewhere and another is healthy, that one, which becomes the active plane (P12)."""
        sw = self.switch
        if sw is not None and sw.generation in (None, generation):
            sw.generation, sw.restarted = generation, True
            return sw.to
        plane = start_plane(self.state)
        if plane != self.state.active:
            down = ", ".join(self.state.down_on(self.state.active)) or "a node"
            self.console.line(
                f"plane {self.state.active} is down on {down}: generation {generation} starts "
                f"on plane {plane}"
            )
            self.state = replace(self.state, active=plane)
        return plane

    def committed(self, generation: int, first_commit_at: float, step: int) -> None:
        """Generation ``generation`` committed its first step: a switch that began it is done."""
        sw = self.switch
        if sw is None or sw.generation != generation:
            return
        self.switch = None
        pause_s = first_commit_at - sw.paused_at
        back = bool(self.state.names) and sw.to == self.state.names[0]
        event = PlaneSwitchback if back else PlaneFailover
        self.ledger.record(
            event(
                from_plane=sw.from_plane,
                to=sw.to,
                planned=sw.planned,
                generation=generation,
                step=step,
                pause_s=pause_s,
                reason=sw.reason,
            ),
            at=first_commit_at,
        )
        how = "its processes started anew on it" if sw.restarted else "no process restarted"
        self.console.line(
            f"{'switchback' if back else 'failover'} to plane {sw.to} done: training stood "
            f"still {pause_s:.2f} s, {how}; step {step} committed by generation {generation}"
        )
        self._feed(PlaneSwitched(to=sw.to, ok=True), first_commit_at)

    def _feed(self, event: PlaneEvent, now: float) -> PlaneDecision:
        before = self.state
        d = decide_plane(before, event, self.config)
        if d.command is not None and self._busy():
            if isinstance(event, PlaneCommand):
                why = "a recovery or another pause of the ranks is under way; try again after it"
                return PlaneDecision(before, None, why, refused=True)
            # A recovery or another rejoin holds the ranks: the plane's health is kept, and a
            # later tick decides the switch again (policy rows P5, P6).
            self.state = replace(d.state, switching=None, pinned=before.pinned)
            return PlaneDecision(self.state, None, f"{d.reason}; waits for the recovery under way")
        self.state = d.state
        if d.command is not None:
            self._carry_out(d.command, before.active, now)
        elif d.reason and not isinstance(event, PlaneTick) and not d.refused:
            log.info("planes: %s", d.reason)
        return d

    def _carry_out(self, cmd: SwitchPlane, from_plane: str, now: float) -> None:
        self.console.line(f"decision: link-{'switch' if cmd.planned else 'failover'}: {cmd.reason}")
        if not cmd.planned:
            self._cut(from_plane)
        self.switch = _Switch(
            to=cmd.to,
            from_plane=from_plane,
            planned=cmd.planned,
            reason=cmd.reason,
            paused_at=now,
        )
        self._begin(now)


__all__ = ["SWITCH_TIMEOUT_S", "PlaneSwitcher"]
