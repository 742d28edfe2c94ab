"""Gang and single-pod placement, preferences, isolation and the unschedulable messages."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from unbroken.scheduler import Binding, Cluster, Placement, Pod, Unschedulable, place

pytestmark = pytest.mark.unit

MASTER = Pod("master-0", 2, "Master", 0)
WORKER = Pod("worker-0", 2, "Worker", 0)
PODS = (MASTER, WORKER)


def _cluster(n: int = 4, devices: int = 2) -> Cluster:
    return Cluster.of({f"node-{i}": devices for i in range(n)})


def _placed(result: Placement | Unschedulable) -> dict[str, str]:
    assert isinstance(result, Placement), result
    return result.nodes()


def test_gang_takes_nodes_in_cluster_order_with_whole_device_slots() -> None:
    result = place(_cluster(), PODS)
    assert isinstance(result, Placement)
    assert result.bindings == (
        Binding("master-0", "node-0", (0, 1)),
        Binding("worker-0", "node-1", (0, 1)),
    )
    assert result.node_of("worker-0") == "node-1"


def test_placement_is_deterministic() -> None:
    cluster = _cluster(6).isolate_device("node-1", 0, "code 80E01801")
    prefer = {"worker-0": "node-4"}
    assert len({place(cluster, PODS, prefer) for _ in range(5)}) == 1


def test_pods_go_back_to_their_previous_nodes_when_still_healthy() -> None:
    prefer = {"master-0": "node-2", "worker-0": "node-3"}
    assert _placed(place(_cluster(), PODS, prefer)) == prefer


def test_a_pod_whose_node_is_isolated_goes_to_the_spare() -> None:
    first = place(_cluster(3), PODS)
    assert isinstance(first, Placement)
    cluster = _cluster(3).bind(first.bindings).isolate_node("node-1", "agent heartbeats missed")
    prefer = {"master-0": "node-0", "worker-0": "node-1"}
    # Job level: both pods are placed again; the master keeps its node.
    assert _placed(place(cluster, PODS, prefer)) == {"master-0": "node-0", "worker-0": "node-2"}


def test_pod_level_places_only_the_faulty_pod_and_the_others_keep_their_nodes() -> None:
    first = place(_cluster(3), PODS)
    assert isinstance(first, Placement)
    cluster = _cluster(3).bind(first.bindings).isolate_device("node-1", 1, "code 80E01801")
    cluster = cluster.release("worker-0")
    result = place(cluster, [WORKER], {"worker-0": "node-1"})
    assert isinstance(result, Placement)
    assert result.bindings == (Binding("worker-0", "node-2", (0, 1)),)
    after = cluster.bind(result.bindings)
    assert after.node_of("master-0") == "node-0"
    assert after.node_of("worker-0") == "node-2"


def test_a_pod_keeps_its_devices_on_its_node_when_they_are_healthy() -> None:
    cluster = Cluster.of({"node-0": 4}).bind([Binding("worker-0", "node-0", (2, 3))])
    cluster = cluster.isolate_device("node-0", 0, "code 80E18005")
    result = place(cluster, [WORKER], {"worker-0": "node-0"})
    assert isinstance(result, Placement)
    assert result.bindings == (Binding("worker-0", "node-0", (2, 3)),)
    moved = place(cluster.isolate_device("node-0", 3, "code X"), [WORKER], {"worker-0": "node-0"})
    assert isinstance(moved, Placement)
    assert moved.bindings == (Binding("worker-0", "node-0", (1, 2)),)


def test_never_an_isolated_device() -> None:
    cluster = Cluster.of({"node-0": 3, "node-1": 2}).isolate_device("node-0", 1, "code A")
    result = place(cluster, [WORKER])
    assert isinstance(result, Placement)
    assert result.bindings == (Binding("worker-0", "node-0", (0, 2)),)


def test_a_returned_device_can_be_used_again() -> None:
    cluster = Cluster.of({"node-0": 2}).isolate_device("node-0", 0, "code A")
    assert isinstance(place(cluster, [WORKER]), Unschedulable)
    assert _placed(place(cluster.return_device("node-0", 0), [WORKER])) == {"worker-0": "node-0"}


def test_gang_is_all_or_nothing() -> None:
    cluster = _cluster(2).isolate_device("node-1", 0, "code 80E01801")
    result = place(cluster, PODS)
    assert result == Unschedulable(
        "worker-0",
        "pod worker-0 needs 2 healthy devices; node-0 goes to pod master-0, "
        "node-1 has 1 (device 0 isolated: code 80E01801)",
    )


def test_unschedulable_message_names_every_node() -> None:
    cluster = (
        Cluster.of({"node-0": 2, "node-1": 2, "node-2": 2, "node-3": 2})
        .bind([Binding("master-0", "node-0", (0, 1)), Binding("worker-1", "node-1", (0, 1))])
        .isolate_device("node-2", 0, "code 80E01801")
        .isolate_node("node-3", "")
    )
    result = place(cluster, [WORKER])
    assert isinstance(result, Unschedulable)
    assert result.pod == "worker-0"
    assert result.reason == (
        "pod worker-0 needs 2 healthy devices; node-0 runs pod master-0, "
        "node-1 runs pod worker-1, node-2 has 1 (device 0 isolated: code 80E01801), "
        "node-3 isolated"
    )


def test_unschedulable_messages_for_reasons_and_empty_clusters() -> None:
    cluster = Cluster.of({"node-0": 1}).isolate_node("node-0", "node lost")
    one = Pod("worker-0", 1)
    assert place(cluster, [one]) == Unschedulable(
        "worker-0", "pod worker-0 needs 1 healthy device; node-0 isolated: node lost"
    )
    assert place(Cluster.of({}), [Pod("launcher", 0)]) == Unschedulable(
        "launcher", "pod launcher needs a free node; the cluster has no nodes"
    )
    two_bad = (
        Cluster.of({"node-0": 3}).isolate_device("node-0", 0, "a").isolate_device("node-0", 2, "")
    )
    assert place(two_bad, [WORKER]) == Unschedulable(
        "worker-0",
        "pod worker-0 needs 2 healthy devices; node-0 has 1 (device 0 isolated: a; "
        "device 2 isolated)",
    )


def test_larger_pods_are_placed_first() -> None:
    cluster = Cluster.of({"small": 1, "big": 4})
    pods = [Pod("a", 1), Pod("b", 4)]
    assert _placed(place(cluster, pods)) == {"a": "small", "b": "big"}


def test_a_preference_that_would_block_the_gang_is_dropped() -> None:
    cluster = Cluster.of({"big": 4, "small": 1})
    pods = [Pod("a", 1), Pod("b", 4)]
    assert _placed(place(cluster, pods, {"a": "big"})) == {"a": "small", "b": "big"}


def test_preference_for_an_unknown_or_busy_node_is_ignored() -> None:
    cluster = _cluster(3).bind([Binding("other", "node-2", (0, 1))])
    assert _placed(place(cluster, [WORKER], {"worker-0": "node-9"})) == {"worker-0": "node-0"}
    assert _placed(place(cluster, [WORKER], {"worker-0": "node-2"})) == {"worker-0": "node-0"}


def test_repeated_pods_are_a_programming_error() -> None:
    with pytest.raises(ValueError, match="repeated: worker-0"):
        place(_cluster(), [WORKER, WORKER])
    assert place(_cluster(), []) == Placement(())


# -- invariants ----------------------------------------------------------------------------

_node_sizes = st.lists(st.integers(0, 3), min_size=0, max_size=5)
_pod_sizes = st.lists(st.integers(0, 3), min_size=1, max_size=4)


@st.composite
def _scenarios(draw: st.DrawFn) -> tuple[Cluster, list[Pod], dict[str, str]]:
    sizes = draw(_node_sizes)
    cluster = Cluster.of({f"n{i}": s for i, s in enumerate(sizes)})
    for i, s in enumerate(sizes):
        for d in range(s):
            if draw(st.booleans()) and draw(st.booleans()):
                cluster = cluster.isolate_device(f"n{i}", d, "bad")
        if draw(st.integers(0, 5)) == 0:
            cluster = cluster.isolate_node(f"n{i}", "lost")
    pods = [Pod(f"p{i}", need) for i, need in enumerate(draw(_pod_sizes))]
    names = [f"n{i}" for i in range(len(sizes))] + ["elsewhere"]
    prefer = {p.name: draw(st.sampled_from(names)) for p in pods if draw(st.booleans())}
    return cluster, pods, prefer


def _feasible(cluster: Cluster, pods: list[Pod], fixed: dict[str, str] | None = None) -> bool:
    """Brute force: can ``pods`` (minus those ``fixed`` to a node) take distinct free nodes?"""
    fixed = fixed or {}
    rest = [p for p in pods if p.name not in fixed]
    names = [
        n.name
        for n in cluster.nodes
        if n.name not in cluster.isolated_nodes and n.name not in fixed.values()
    ]
    for nodes in itertools.permutations(names, len(rest)):
        if all(
            len(cluster.healthy_devices(n)) >= p.devices_needed
            for n, p in zip(nodes, rest, strict=True)
        ):
            return True
    return False


def _honourable(cluster: Cluster, pods: list[Pod], prefer: dict[str, str]) -> dict[str, str]:
    """Preferences for a free node that fits, first pod first."""
    fixed: dict[str, str] = {}
    known = {n.name for n in cluster.nodes}
    for pod in pods:
        node = prefer.get(pod.name)
        if (
            node in known
            and node not in cluster.isolated_nodes
            and node not in fixed.values()
            and len(cluster.healthy_devices(node)) >= pod.devices_needed
        ):
            fixed[pod.name] = node
    return fixed


@given(_scenarios())
def test_placement_respects_isolation_and_finds_a_placement_when_one_exists(
    scenario: tuple[Cluster, list[Pod], dict[str, str]],
) -> None:
    cluster, pods, prefer = scenario
    result = place(cluster, pods, prefer)
    if isinstance(result, Unschedulable):
        assert not _feasible(cluster, pods)
        assert result.pod in {p.name for p in pods}
        return
    assert [b.pod for b in result.bindings] == [p.name for p in pods]
    assert len({b.node for b in result.bindings}) == len(pods)
    for pod, b in zip(pods, result.bindings, strict=True):
        assert b.node not in cluster.isolated_nodes
        assert len(b.devices) == pod.devices_needed == len(set(b.devices))
        assert all(not cluster.device_isolated(b.node, d) for d in b.devices)
    fixed = _honourable(cluster, pods, prefer)
    if _feasible(cluster, pods, fixed):
        assert {pod: result.node_of(pod) for pod in fixed} == fixed
