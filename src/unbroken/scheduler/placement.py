"""Placing pods on nodes: gang placement with a preference for where each pod was.

Rules (the local equivalent of Volcano's gang scheduling for these jobs):

- One pod per node; a pod takes ``devices_needed`` whole device slots of its node (the lowest
  healthy indexes, or the ones it already holds there when they are all still healthy).
- Never an isolated node, never an isolated device, never a node another pod is bound to.
  Pods being placed do not block each other's old nodes: placing a pod replaces its binding.
- All or nothing: either every pod given gets a node, or the answer is :class:`Unschedulable`.
  Job-level rescheduling passes all pods; pod-level passes the faulty ones, and the healthy
  pods, still bound, keep their nodes.
- A pod goes back to its preferred node (``prefer``: where it ran before) when that node can
  still take it; the others take free nodes in the cluster's order (spares are listed last),
  larger pods first. When honouring preferences would leave a pod without a node, placement is
  retried without them.
- A deprioritised node (it reported a sub-health fault the job ignores,
  :meth:`Cluster.deprioritise_node`) comes after every other node: it is not taken as a
  preference, and a pod goes there only when no other node can take it.
  :func:`passed_over` names the deprioritised nodes a placement could have used and did not.
- Deterministic: the same cluster, pods and preferences give the same placement.

Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from unbroken.scheduler.cluster import Binding, Cluster, Node


@dataclass(frozen=True)
class Pod:
    """A pod to place: ``replica_type`` is the job's replica (Master, Worker, ...)."""

    name: str
    devices_needed: int
    replica_type: str = "Worker"
    index: int = 0

    def __post_init__(self) -> None:
        if self.devices_needed < 0:
            raise ValueError(f"pod {self.name}: devices_needed must be >= 0")


@dataclass(frozen=True)
class Placement:
    """Where each pod goes, in the order the pods were given."""

    bindings: tuple[Binding, ...]

    def node_of(self, pod: str) -> str:
        for b in self.bindings:
            if b.pod == pod:
                return b.node
        raise KeyError(pod)

    def nodes(self) -> dict[str, str]:
        """pod name -> node name."""
        return {b.pod: b.node for b in self.bindings}


@dataclass(frozen=True)
class Unschedulable:
    """No placement exists now; ``reason`` says why, node by node, for the first pod left."""

    pod: str
    reason: str


def place(
    cluster: Cluster, pods: Sequence[Pod], prefer: Mapping[str, str] | None = None
) -> Placement | Unschedulable:
    """Place all of ``pods`` or none of them (see the module doc)."""
    names = [p.name for p in pods]
    repeated = sorted(n for n, k in Counter(names).items() if k > 1)  # not N^2
    if repeated:
        raise ValueError(f"pods must be placed once each; repeated: {', '.join(repeated)}")
    if not pods:
        return Placement(())
    wanted = dict(prefer or {})
    result = _attempt(cluster, pods, wanted)
    if isinstance(result, Unschedulable) and wanted:
        result = _attempt(cluster, pods, {})
    return result


def _attempt(
    cluster: Cluster, pods: Sequence[Pod], prefer: Mapping[str, str]
) -> Placement | Unschedulable:
    placing = {p.name for p in pods}
    occupied = {b.node: b.pod for b in cluster.bindings.values() if b.pod not in placing}
    taken: dict[str, str] = {}  # node -> pod of this placement
    chosen: dict[str, Binding] = {}

    def fits(node: Node, pod: Pod) -> bool:
        return (
            node.name not in cluster.isolated_nodes
            and node.name not in occupied
            and node.name not in taken
            and len(cluster.healthy_devices(node.name)) >= pod.devices_needed
        )

    def take(node: Node, pod: Pod) -> None:
        taken[node.name] = pod.name
        chosen[pod.name] = Binding(pod.name, node.name, _devices(cluster, node, pod))

    by_name = {n.name: n for n in cluster.nodes}
    last = cluster.deprioritised_nodes
    for pod in pods:
        node = by_name.get(prefer.get(pod.name, ""))
        if node is not None and node.name not in last and fits(node, pod):
            take(node, pod)
    rest = [p for p in pods if p.name not in chosen]
    order = sorted(range(len(rest)), key=lambda i: (-rest[i].devices_needed, i))
    nodes = [n for n in cluster.nodes if n.name not in last]
    nodes += [n for n in cluster.nodes if n.name in last]
    # First fit, resumed where the last pod of the same size stopped: a node that did not fit
    # a size never will in this attempt (nodes are only taken), and scanning from the first
    # node for every pod made a job's placement N^2 (10k nodes: minutes; bench/scale.py).
    resume: dict[int, int] = {}
    for i in order:
        pod = rest[i]
        start = resume.get(pod.devices_needed, 0)
        at = next((k for k in range(start, len(nodes)) if fits(nodes[k], pod)), None)
        if at is None:
            return Unschedulable(pod.name, _why(cluster, pod, occupied, taken))
        resume[pod.devices_needed] = at + 1
        take(nodes[at], pod)
    return Placement(tuple(chosen[p.name] for p in pods))


def passed_over(cluster: Cluster, placement: Placement) -> dict[str, str]:
    """The deprioritised nodes that ``placement`` did not use although they were free and had
    the devices for one of its pods, with the reason each is placed last."""
    used = {b.node for b in placement.bindings}
    placing = {b.pod for b in placement.bindings}
    need = min((len(b.devices) for b in placement.bindings), default=0)
    out: dict[str, str] = {}
    for name, reason in cluster.deprioritised_nodes.items():
        bound = cluster.pod_on(name)
        if (
            name not in used
            and name not in cluster.isolated_nodes
            and (bound is None or bound in placing)
            and len(cluster.healthy_devices(name)) >= need
        ):
            out[name] = reason
    return out


def _devices(cluster: Cluster, node: Node, pod: Pod) -> tuple[int, ...]:
    healthy = cluster.healthy_devices(node.name)
    held = cluster.bindings.get(pod.name)
    if (
        held is not None
        and held.node == node.name
        and len(held.devices) == pod.devices_needed
        and all(d in healthy for d in held.devices)
    ):
        return held.devices
    return healthy[: pod.devices_needed]


def _why(cluster: Cluster, pod: Pod, occupied: Mapping[str, str], taken: Mapping[str, str]) -> str:
    need = pod.devices_needed
    if need == 0:
        head = f"pod {pod.name} needs a free node"
    else:
        head = f"pod {pod.name} needs {need} healthy device{'s' if need != 1 else ''}"
    if not cluster.nodes:
        return f"{head}; the cluster has no nodes"
    parts = []
    for node in cluster.nodes:
        parts.append(_node_state(cluster, node, occupied, taken))
    return f"{head}; {', '.join(parts)}"


def _node_state(
    cluster: Cluster, node: Node, occupied: Mapping[str, str], taken: Mapping[str, str]
) -> str:
    name = node.name
    if name in cluster.isolated_nodes:
        reason = cluster.isolated_nodes[name]
        return f"{name} isolated: {reason}" if reason else f"{name} isolated"
    if name in occupied:
        return f"{name} runs pod {occupied[name]}"
    if name in taken:
        return f"{name} goes to pod {taken[name]}"
    last = cluster.deprioritised_nodes.get(name)
    label = name if last is None else f"{name} (placed last: {last})"
    healthy = len(cluster.healthy_devices(name))
    isolated = [
        f"device {d} isolated: {cluster.isolated_devices[(name, d)]}"
        if cluster.isolated_devices[(name, d)]
        else f"device {d} isolated"
        for d in range(node.devices)
        if (name, d) in cluster.isolated_devices
    ]
    detail = f" ({'; '.join(isolated)})" if isolated else ""
    return f"{label} has {healthy}{detail}"
