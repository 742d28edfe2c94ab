"""The local cluster as data: nodes with device slots, what is isolated, which pod is where.

A :class:`Cluster` is a frozen value; every operation returns a new one, so the manager can
keep the current state in one variable and tests can compare states. Nodes keep the order they
were given in: placement tries them in that order, so list spare nodes last.

Isolation is the scheduler's only notion of health: an isolated device or node receives no new
pod. Isolating does not evict a pod already bound there; the recovery policy decides what
happens to it and the manager calls :meth:`Cluster.release`. A device returns to the pool with
:meth:`Cluster.return_device` when it is healthy again and the device plugin's ``autoStowing``
is on. A device isolated at level ``ManuallySeparate`` (``isolate_device(..., manual=True)``)
is *held*: it never returns on its own (``return_device`` leaves it out), only when an operator
releases it (:meth:`Cluster.release_device`).

A node that reported a sub-health fault the job ignores (``subHealthyStrategy: ignore``) is
*deprioritised* (:meth:`Cluster.deprioritise_node`): it still takes pods, but placement puts a
pod there only when no other node can take it, for the rest of the run.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from types import MappingProxyType
from typing import TypeVar

#: (node name, device index)
DeviceKey = tuple[str, int]


@dataclass(frozen=True)
class Node:
    """A node and its number of device slots (0 for a node without accelerators)."""

    name: str
    devices: int

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a node needs a name")
        if self.devices < 0:
            raise ValueError(f"node {self.name}: devices must be >= 0, got {self.devices}")


@dataclass(frozen=True)
class Binding:
    """A pod placed on a node, holding these device indexes."""

    pod: str
    node: str
    devices: tuple[int, ...]


K = TypeVar("K")
V = TypeVar("V")


def _frozen(mapping: Mapping[K, V]) -> Mapping[K, V]:
    return MappingProxyType(dict(mapping))


@dataclass(frozen=True)
class Cluster:
    """Nodes, isolations and deprioritised nodes (with the reason a user reads) and bindings
    (pod name -> binding)."""

    nodes: tuple[Node, ...]
    isolated_devices: Mapping[DeviceKey, str] = field(default_factory=dict)
    isolated_nodes: Mapping[str, str] = field(default_factory=dict)
    bindings: Mapping[str, Binding] = field(default_factory=dict)
    deprioritised_nodes: Mapping[str, str] = field(default_factory=dict)
    held_devices: frozenset[DeviceKey] = frozenset()

    def __post_init__(self) -> None:
        # Counted once (a Cluster is rebuilt on every bind and release: names.count per name
        # made each rebuild quadratic in the nodes, seconds a decision at 1k nodes).
        counts = Counter(n.name for n in self.nodes)
        duplicates = sorted(n for n, c in counts.items() if c > 1)
        if duplicates:
            raise ValueError(f"node names must be unique; repeated: {', '.join(duplicates)}")
        # Read-only views: a Cluster is a value.
        object.__setattr__(self, "isolated_devices", _frozen(self.isolated_devices))
        object.__setattr__(self, "isolated_nodes", _frozen(self.isolated_nodes))
        object.__setattr__(self, "bindings", _frozen(self.bindings))
        object.__setattr__(self, "deprioritised_nodes", _frozen(self.deprioritised_nodes))

    @classmethod
    def of(cls, nodes: Mapping[str, int] | Iterable[Node]) -> Cluster:
        """A healthy, empty cluster: ``Cluster.of({"node-0": 2, "node-1": 2})``."""
        if isinstance(nodes, Mapping):
            return cls(tuple(Node(name, count) for name, count in nodes.items()))
        return cls(tuple(nodes))

    # -- queries ---------------------------------------------------------------------------

    @cached_property
    def _node_index(self) -> dict[str, Node]:
        return {n.name: n for n in self.nodes}

    def node(self, name: str) -> Node:
        found = self._node_index.get(name)
        if found is not None:
            return found
        known = ", ".join(n.name for n in self.nodes) or "none"
        raise ValueError(f"no node {name!r} in the cluster (nodes: {known})")

    def device_isolated(self, node: str, device: int) -> bool:
        return (node, device) in self.isolated_devices

    def healthy_devices(self, node: str) -> tuple[int, ...]:
        """Device indexes of ``node`` that may receive a pod (none when the node is isolated)."""
        n = self.node(node)
        if n.name in self.isolated_nodes:
            return ()
        return tuple(d for d in range(n.devices) if (n.name, d) not in self.isolated_devices)

    def pod_on(self, node: str) -> str | None:
        """The pod bound to ``node``, if any (one pod per node)."""
        for b in self.bindings.values():
            if b.node == node:
                return b.pod
        return None

    def node_of(self, pod: str) -> str | None:
        b = self.bindings.get(pod)
        return None if b is None else b.node

    # -- operations ------------------------------------------------------------------------

    def device_held(self, node: str, device: int) -> bool:
        """Whether the device waits for an operator to release it (``ManuallySeparate``)."""
        return (node, device) in self.held_devices

    def isolate_device(self, node: str, device: int, reason: str, manual: bool = False) -> Cluster:
        """Take a device out of the pool; ``reason`` is shown to users ("code 80E01801").
        ``manual``: it is held until :meth:`release_device` (also when it was isolated
        already)."""
        self._check_device(node, device)
        key = (node, device)
        held = self.held_devices | {key} if manual else self.held_devices
        return replace(
            self, isolated_devices={**self.isolated_devices, key: reason}, held_devices=held
        )

    def return_device(self, node: str, device: int) -> Cluster:
        """Put an isolated device back into the pool: no change when it is not isolated, or
        when it is held (``ManuallySeparate``: only :meth:`release_device` returns it)."""
        self._check_device(node, device)
        key = (node, device)
        if key not in self.isolated_devices or key in self.held_devices:
            return self
        rest = {k: v for k, v in self.isolated_devices.items() if k != key}
        return replace(self, isolated_devices=rest)

    def release_device(self, node: str, device: int) -> Cluster:
        """An operator puts a held device back into the pool; a device that is not held is
        refused (:class:`ValueError` naming it and its state)."""
        self._check_device(node, device)
        key = (node, device)
        if key not in self.held_devices:
            state = (
                f"isolated ({self.isolated_devices[key]}) and returns by itself when healthy"
                if key in self.isolated_devices
                else "in the pool"
            )
            raise ValueError(
                f"device {device} of {node} is not held for release (ManuallySeparate): it is "
                f"{state}"
            )
        rest = {k: v for k, v in self.isolated_devices.items() if k != key}
        return replace(self, isolated_devices=rest, held_devices=self.held_devices - {key})

    def isolate_node(self, node: str, reason: str) -> Cluster:
        return self.isolate_nodes((node,), reason)

    def isolate_nodes(self, nodes: Iterable[str], reason: str) -> Cluster:
        """Take nodes out of the pool at once (one copy of the cluster, not one per node)."""
        names = list(nodes)
        for node in names:
            self.node(node)
        return replace(self, isolated_nodes={**self.isolated_nodes, **dict.fromkeys(names, reason)})

    def return_node(self, node: str) -> Cluster:
        self.node(node)
        if node not in self.isolated_nodes:
            return self
        return replace(
            self, isolated_nodes={k: v for k, v in self.isolated_nodes.items() if k != node}
        )

    def deprioritise_node(self, node: str, reason: str) -> Cluster:
        """Place pods on ``node`` only when no other node can take them (for the rest of the
        run); ``reason`` is shown to users ("sub-healthy: code 80E20207"). The first reason
        is kept."""
        self.node(node)
        if node in self.deprioritised_nodes:
            return self
        return replace(self, deprioritised_nodes={**self.deprioritised_nodes, node: reason})

    def bind(self, bindings: Iterable[Binding]) -> Cluster:
        """Record placed pods (replacing their previous bindings). The pods move together: a
        pod may take a node another pod of the same call leaves."""
        batch = list(bindings)
        moving = {b.pod for b in batch}
        updated = {k: v for k, v in self.bindings.items() if k not in moving}
        for b in batch:
            self._check_bindable(b, updated)
            updated[b.pod] = b
        return replace(self, bindings=updated)

    def release(self, pod: str) -> Cluster:
        """Forget where a pod was (its processes are gone); no change for an unbound pod."""
        return self.release_all((pod,))

    def release_all(self, pods: Iterable[str]) -> Cluster:
        """:meth:`release` of several pods at once (one copy of the cluster)."""
        gone = {p for p in pods if p in self.bindings}
        if not gone:
            return self
        return replace(self, bindings={k: v for k, v in self.bindings.items() if k not in gone})

    # -- checks ----------------------------------------------------------------------------

    def _check_device(self, node: str, device: int) -> None:
        n = self.node(node)
        if not 0 <= device < n.devices:
            raise ValueError(
                f"node {node} has devices 0-{n.devices - 1}; there is no device {device}"
                if n.devices
                else f"node {node} has no devices; there is no device {device}"
            )

    def _check_bindable(self, b: Binding, current: Mapping[str, Binding]) -> None:
        for d in b.devices:
            self._check_device(b.node, d)
        for other in current.values():
            if other.node == b.node and other.pod != b.pod:
                raise ValueError(f"node {b.node} already runs pod {other.pod}; cannot bind {b.pod}")
