"""Whether each pod's agent is still there: its heartbeats and its order stream.

A node is lost when its agent falls silent: for ``agent_timeout_s`` since its order stream
broke, or for the silence limit of the job's heartbeat interval at all
(:func:`unbroken.manager.service.silence_timeout_s`). In a large job (a heartbeat interval
above the floor) every agent is looked at once every :data:`AGENTS_SCAN_S` and, in between,
only those whose order stream broke (a scan of 10k pods every tick was a tenth of the
manager's CPU); a small job looks at all every tick. Many agents silent at once with their
streams open say more of the control plane (its host stalled, its own backlog) than of the
nodes: more than a tenth of a large job's pods silent in one check wait up to a second limit.
Nor does a stall of the manager itself count against the agents: when its loop did not run for
:data:`MANAGER_STALL_S` (its process stopped, its host paused), their silence counts from the
moment it runs again, while it reads the heartbeats that queued meanwhile; an agent whose order
stream broke is counted from the break, and lost no sooner than :data:`STALL_GRACE_S` after.

:class:`AgentWatch` returns the pods it finds lost; the loop ends them and tells the detector.
"""

from __future__ import annotations

import logging

from unbroken.manager.context import Context
from unbroken.manager.engine import Engine
from unbroken.manager.pods import PodProcess
from unbroken.manager.service import HEARTBEAT_FLOOR_S

log = logging.getLogger(__name__)

#: How often a large job's manager looks at every agent's silence (a node that hangs with its
#: order stream open is lost after three heartbeat intervals, 60 s at 10k nodes).
AGENTS_SCAN_S = 1.0
#: A gap between two checks this long means the manager itself did not run.
MANAGER_STALL_S = 1.0
#: After a stall of the manager, how long an agent whose order stream broke has at least, from
#: when the manager runs again, before its node is lost: the server reads meanwhile what its
#: sockets held (an agent that reconnected). Its silence still counts from the break: a break
#: is stamped by the server when it saw it, and what queued in the manager's inbox during the
#: stall is read before each check (counted from the wake-up instead, a node lost in a 1-2 s
#: stall of a 10k-node manager was found 4 s after it, not 2; bench/scale.py).
STALL_GRACE_S = 0.5


class AgentWatch:
    """The agents' silence, from their heartbeats and their order streams.

    Args:
        ctx: the job and the manager's options (``agent_timeout_s``, ...).
        engine: whose pods are watched.
        heartbeat_s: the agents' heartbeat interval.
        silence_s: the silence that loses a node whose agent's order stream is still open.
    """

    def __init__(self, ctx: Context, engine: Engine, heartbeat_s: float, silence_s: float) -> None:
        self.ctx = ctx
        self.engine = engine
        self.heartbeat_s = heartbeat_s
        self.silence_s = silence_s
        #: Agents (pod, pid) whose order stream ended while their pod ran, and when.
        self.streams_broken: dict[tuple[str, int], float] = {}
        self._next_full_at = 0.0
        #: An agent silent beyond :meth:`quiet_s` at the last full check of the agents.
        self._long_silent = False
        self._checked_at: float | None = None
        #: When the manager ran again after a stall of its own: silence counts from there.
        self._awake_at = 0.0

    @property
    def small(self) -> bool:
        """A small job (heartbeats at the floor interval): every check looks at every agent."""
        return self.heartbeat_s <= HEARTBEAT_FLOOR_S

    def stream_opened(self, pod: str, pid: int) -> None:
        self.streams_broken.pop((pod, pid), None)

    def stream_closed(self, pod: str, pid: int, at: float) -> None:
        self.streams_broken[(pod, pid)] = at

    def quiet_s(self) -> float:
        """An agent may be silent for a heartbeat interval: it looks lost after half as long
        again (or after 0.5 s once its order stream broke)."""
        return max(0.5, 1.5 * self.heartbeat_s)

    def _broken_stream_pods(self) -> list[PodProcess]:
        """The pods whose agent's order stream broke (and has not opened again)."""
        pods = self.engine.pods
        return [p for (name, pid) in self.streams_broken if (p := pods.get(name)) and p.pid == pid]

    def lost(self, now: float) -> list[tuple[PodProcess, str]]:
        """The pods whose agents are lost now, each marked lost, with why."""
        opt = self.ctx.options
        if self._checked_at is not None and now - self._checked_at > MANAGER_STALL_S:
            log.warning(
                "the manager did not run for %.1f s: the agents' silence counts from now",
                now - self._checked_at,
            )
            self._awake_at = now
        self._checked_at = now
        full = self.small or now >= self._next_full_at
        if full:
            self._next_full_at = now + AGENTS_SCAN_S
            pods = list(self.engine.pods.values())
            self._long_silent = False
        else:
            pods = self._broken_stream_pods()
        quiet_s = self.quiet_s()
        found: list[tuple[PodProcess, str]] = []
        silent_pods: list[tuple[PodProcess, str]] = []
        for pod in pods:
            if pod.finished or pod.stopped or pod.lost:
                continue
            if pod.hello_at is None:
                if now - pod.started_at > opt.agent_start_timeout_s:
                    found.append((pod, "its agent never reported"))
                continue
            heard_at = max(pod.last_heartbeat_at, self._awake_at)
            silent = now - heard_at
            if full and silent > quiet_s:
                self._long_silent = True
            broken_at = self.streams_broken.get((pod.pod, pod.pid))
            # Silent for agent_timeout_s since its order stream broke, or for silence_s (the
            # same for a small job) at all: the node is lost. Counted from the break, the nodes
            # of a rack that goes at once are lost in the same tick, one incident, not spread
            # over a heartbeat interval (bench/scale.py's rack burst). In a large job an agent
            # that said hello but has not yet started its ranks, its stream open, has until
            # agent_start_timeout_s: a thousand agents start at once and their first reports
            # queue behind each other (bench/scale.py: 1000 nodes lost at start).
            limit = self.silence_s
            if not pod.rank_pids and not self.small:
                limit = max(limit, opt.agent_start_timeout_s)
            woke = self._awake_at - opt.agent_timeout_s + STALL_GRACE_S
            quiet = None if broken_at is None else now - max(broken_at, pod.last_heartbeat_at, woke)
            over = silent > opt.agent_timeout_s and silent > limit
            broke = quiet is not None and quiet > opt.agent_timeout_s
            if over and (broke or self.small or silent > 2 * limit):
                found.append((pod, f"its agent missed heartbeats for {silent:.2f} s"))
            elif broke:
                found.append(
                    (pod, f"its agent's order stream broke {quiet:.2f} s ago, nothing since")
                )
            elif over and full:
                silent_pods.append((pod, f"its agent missed heartbeats for {silent:.2f} s"))
        storm = not self.small and len(silent_pods) > 0.1 * len(self.engine.pods)
        if storm:
            log.warning(
                "%d agents silent at once with their streams open: held as a control-plane "
                "stall until twice their silence limit",
                len(silent_pods),
            )
        else:
            found += silent_pods
        for pod, _ in found:
            pod.lost = True
        return found

    def any_silent(self, now: float) -> bool:
        """Whether an agent is silent now (the detector then holds a lost node a moment, so
        that a rack's nodes are one incident)."""
        if self.small:
            quiet_s = self.quiet_s()
            return any(
                not (p.finished or p.stopped or p.lost)
                and (s := now - max(p.last_heartbeat_at, self._awake_at)) > 0.5
                and (s > quiet_s or (p.pod, p.pid) in self.streams_broken)
                for p in self.engine.pods.values()
            )
        # the agents silent that long were counted by the last full check
        return self._long_silent or any(
            not (p.finished or p.stopped or p.lost)
            and now - max(p.last_heartbeat_at, self._awake_at) > 0.5
            for p in self._broken_stream_pods()
        )
