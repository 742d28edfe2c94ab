"""The cluster value: isolation, return, binding and release, and the errors for bad names."""

from __future__ import annotations

import pytest

from unbroken.scheduler import Binding, Cluster, Node

pytestmark = pytest.mark.unit


def test_operations_return_new_values_and_leave_the_old_one_alone() -> None:
    base = Cluster.of({"node-0": 2, "node-1": 2})
    isolated = base.isolate_device("node-0", 1, "code 80E01801")
    assert base.healthy_devices("node-0") == (0, 1)
    assert isolated.healthy_devices("node-0") == (0,)
    assert isolated.device_isolated("node-0", 1)
    assert isolated.isolated_devices == {("node-0", 1): "code 80E01801"}
    assert isolated.return_device("node-0", 1) == base
    assert base.return_device("node-0", 1) is base


def test_node_isolation_hides_all_its_devices_until_returned() -> None:
    cluster = Cluster.of([Node("node-0", 4)]).isolate_node("node-0", "node lost")
    assert cluster.healthy_devices("node-0") == ()
    assert cluster.isolated_nodes == {"node-0": "node lost"}
    assert cluster.return_node("node-0").healthy_devices("node-0") == (0, 1, 2, 3)


def test_bind_and_release() -> None:
    cluster = Cluster.of({"node-0": 2, "node-1": 2}).bind([Binding("w-0", "node-0", (0, 1))])
    assert cluster.node_of("w-0") == "node-0"
    assert cluster.pod_on("node-0") == "w-0"
    assert cluster.pod_on("node-1") is None
    moved = cluster.bind([Binding("w-0", "node-1", (0,))])
    assert moved.node_of("w-0") == "node-1"
    assert moved.pod_on("node-0") is None
    assert cluster.release("w-0").bindings == {}
    assert cluster.release("nobody") is cluster
    with pytest.raises(ValueError, match="node node-0 already runs pod w-0; cannot bind w-1"):
        cluster.bind([Binding("w-1", "node-0", (0,))])


def test_pods_bound_together_may_take_each_others_nodes() -> None:
    cluster = Cluster.of({"node-0": 2, "node-1": 2, "node-2": 2}).bind(
        [Binding("w-0", "node-0", (0, 1)), Binding("w-1", "node-1", (0, 1))]
    )
    # w-1 takes the node w-0 leaves in the same call, whichever comes first.
    swapped = cluster.bind([Binding("w-1", "node-0", (0, 1)), Binding("w-0", "node-2", (0, 1))])
    assert swapped.node_of("w-1") == "node-0" and swapped.node_of("w-0") == "node-2"
    with pytest.raises(ValueError, match="node node-0 already runs pod w-0; cannot bind w-1"):
        cluster.bind([Binding("w-1", "node-0", (0, 1))])  # w-0 stays where it is
    with pytest.raises(ValueError, match="node node-2 already runs pod w-0; cannot bind w-1"):
        cluster.bind([Binding("w-0", "node-2", (0,)), Binding("w-1", "node-2", (1,))])


def test_the_value_cannot_be_mutated_in_place() -> None:
    cluster = Cluster.of({"node-0": 1})
    with pytest.raises(TypeError):
        cluster.isolated_nodes["node-0"] = "x"  # type: ignore[index]


def test_unknown_nodes_and_devices_are_named() -> None:
    cluster = Cluster.of({"node-0": 2, "node-1": 0})
    with pytest.raises(
        ValueError, match=r"no node 'node-9' in the cluster \(nodes: node-0, node-1"
    ):
        cluster.isolate_node("node-9", "x")
    with pytest.raises(ValueError, match="node node-0 has devices 0-1; there is no device 2"):
        cluster.isolate_device("node-0", 2, "x")
    with pytest.raises(ValueError, match="node node-1 has no devices; there is no device 0"):
        cluster.return_device("node-1", 0)
    with pytest.raises(ValueError, match="repeated: a"):
        Cluster((Node("a", 1), Node("a", 2)))
    with pytest.raises(ValueError, match="devices must be >= 0"):
        Node("b", -1)
