"""The job manager's straggler watch: heartbeats in, sub-health faults out.

Each tick the manager hands the ranks' views (their committed step and the compute time of
that step, see :class:`unbroken.manager.progress.RankView`) and where each rank runs; the
scores and the verdict are :mod:`unbroken.policy.straggler`'s. A node that becomes a straggler
is reported once, as a ``sub-health`` fault with code :data:`STRAGGLER_CODE` naming the node,
its pod and ranks: the job's ``subHealthyStrategy`` handles it as any sub-health fault (a hot
switch moves the pod, ``ignore`` places pods on the node last, ``graceExit`` reschedules). A
rank that moved to another node (its pod was switched or rescheduled) starts its window
afresh, so the old node's slow steps are not held against the new one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from unbroken.faults import Fault, FaultKind, FaultLevel
from unbroken.manager.pods import PodProcess
from unbroken.manager.progress import RankView
from unbroken.policy.straggler import StragglerKnobs, StragglerTracker

#: The code of a straggler fault (its kind is ``sub-health``).
STRAGGLER_CODE = "Straggler"


class StragglerWatch:
    """See the module docstring. No clock is read: :meth:`poll` takes ``now``."""

    def __init__(self, knobs: StragglerKnobs | None = None) -> None:
        self.tracker = StragglerTracker(knobs)
        self._node_of: dict[int, str] = {}
        self._reported: set[str] = set()

    def poll(
        self,
        now: float,
        ranks: Mapping[int, RankView],
        node_of: Mapping[int, str],
        pod_of: Mapping[int, str],
    ) -> list[Fault]:
        """The straggler faults new at ``now`` (a node already reported is not reported again
        until it was fast in between)."""
        for rank, node in node_of.items():
            if self._node_of.get(rank, node) != node:
                self.tracker.forget(rank)
        self._node_of = dict(node_of)
        for rank, view in ranks.items():
            if view.alive and rank in node_of:
                self.tracker.observe(rank, view.committed, view.compute_time_s)
        verdict = self.tracker.evaluate(now, node_of)
        self._reported &= set(verdict.slow_since)
        faults = []
        for node in verdict.stragglers:
            if node in self._reported:
                continue
            self._reported.add(node)
            on_node = tuple(sorted(r for r, n in node_of.items() if n == node))
            pods = sorted({pod_of[r] for r in on_node if r in pod_of})
            scores = ", ".join(
                f"rank {r} {verdict.relative[r]:.2f}" for r in on_node if r in verdict.relative
            )
            faults.append(
                Fault(
                    kind=FaultKind.SUB_HEALTH,
                    level=FaultLevel.SUB_HEALTH,
                    code=STRAGGLER_CODE,
                    at=verdict.slow_since[node],
                    node=node,
                    pod=pods[0] if len(pods) == 1 else None,
                    ranks=on_node,
                    detail=f"node {node} is a straggler: relative compute-time scores {scores} "
                    f"(threshold {self.tracker.knobs.threshold}) for "
                    f"{now - verdict.slow_since[node]:.1f} s",
                )
            )
        return faults

    def poll_pods(
        self, now: float, ranks: Mapping[int, RankView], pods: Iterable[PodProcess]
    ) -> list[Fault]:
        """:meth:`poll` over the ranks of ``pods`` (those running): a node whose ranks compute
        slower than their peers' is a sub-health fault."""
        node_of: dict[int, str] = {}
        pod_of: dict[int, str] = {}
        for pod in pods:
            for rank in pod.rank_pids:
                node_of[rank], pod_of[rank] = pod.node, pod.pod
        return self.poll(now, ranks, node_of, pod_of)
