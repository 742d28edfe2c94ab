"""Deprioritised nodes (a sub-health fault the job ignores): placed on last, never preferred."""

from __future__ import annotations

import pytest

from unbroken.scheduler import Cluster, Placement, Pod, Unschedulable, passed_over, place

pytestmark = pytest.mark.unit

SUB = "sub-healthy: code 80E20207"


def _cluster(n: int = 4, devices: int = 2) -> Cluster:
    return Cluster.of({f"node-{i}": devices for i in range(n)})


def _pods(n: int, devices: int = 2) -> list[Pod]:
    return [Pod(f"worker-{i}", devices, "Worker", i) for i in range(n)]


# (case, nodes, devices per node, deprioritised, isolated nodes, pods, prefer, expected nodes)
CASES = [
    ("no deprioritised node: cluster order", 3, 2, (), (), 2, {}, ["node-0", "node-1"]),
    ("first node placed last", 3, 2, ("node-0",), (), 2, {}, ["node-1", "node-2"]),
    ("middle node placed last", 3, 2, ("node-1",), (), 2, {}, ["node-0", "node-2"]),
    (
        "taken only when nothing else fits",
        3,
        2,
        ("node-0",),
        (),
        3,
        {},
        ["node-1", "node-2", "node-0"],
    ),
    (
        "two placed last keep their order",
        3,
        2,
        ("node-1", "node-0"),
        (),
        3,
        {},
        ["node-2", "node-0", "node-1"],
    ),
    ("not taken as a preference", 3, 2, ("node-0",), (), 1, {"worker-0": "node-0"}, ["node-1"]),
    (
        "a preference elsewhere still holds",
        3,
        2,
        ("node-0",),
        (),
        1,
        {"worker-0": "node-2"},
        ["node-2"],
    ),
    (
        "the last free node even when preferred",
        2,
        2,
        ("node-0",),
        ("node-1",),
        1,
        {"worker-0": "node-0"},
        ["node-0"],
    ),
]


@pytest.mark.parametrize(
    ("nodes", "devices", "last", "isolated", "pods", "prefer", "expected"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_deprioritised_placement(
    nodes: int,
    devices: int,
    last: tuple[str, ...],
    isolated: tuple[str, ...],
    pods: int,
    prefer: dict[str, str],
    expected: list[str],
) -> None:
    cluster = _cluster(nodes, devices)
    for name in last:
        cluster = cluster.deprioritise_node(name, SUB)
    for name in isolated:
        cluster = cluster.isolate_node(name, "node lost")
    result = place(cluster, _pods(pods, devices), prefer)
    assert isinstance(result, Placement), result
    assert [b.node for b in result.bindings] == expected


def test_a_deprioritised_node_busy_with_another_pod_is_not_taken() -> None:
    first = place(_cluster(2), _pods(1))
    assert isinstance(first, Placement)
    cluster = _cluster(2).bind(first.bindings).deprioritise_node("node-0", SUB)
    result = place(cluster, [Pod("worker-1", 2, "Worker", 1)])
    assert isinstance(result, Placement)
    assert result.nodes() == {"worker-1": "node-1"}
    assert passed_over(cluster, result) == {}


def test_passed_over_names_the_free_deprioritised_node_and_its_reason() -> None:
    cluster = _cluster(3).deprioritise_node("node-0", SUB)
    result = place(cluster, _pods(1))
    assert isinstance(result, Placement)
    assert passed_over(cluster, result) == {"node-0": SUB}
    both = place(cluster, _pods(3))
    assert isinstance(both, Placement)
    assert passed_over(cluster, both) == {}


def test_unschedulable_reason_says_a_node_is_placed_last() -> None:
    cluster = _cluster(1, 1).deprioritise_node("node-0", SUB)
    result = place(cluster, _pods(1, devices=2))
    assert isinstance(result, Unschedulable)
    assert result.reason == (
        "pod worker-0 needs 2 healthy devices; "
        "node-0 (placed last: sub-healthy: code 80E20207) has 1"
    )


def test_deprioritising_keeps_the_first_reason_and_refuses_unknown_nodes() -> None:
    cluster = _cluster(2).deprioritise_node("node-1", SUB).deprioritise_node("node-1", "other")
    assert dict(cluster.deprioritised_nodes) == {"node-1": SUB}
    with pytest.raises(ValueError, match="no node 'node-9'"):
        cluster.deprioritise_node("node-9", SUB)
    with pytest.raises(TypeError):
        cluster.deprioritised_nodes["node-0"] = "x"  # type: ignore[index]
