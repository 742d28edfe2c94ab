"""Throttle entries of the chaos file: a node held to a share of one CPU, and its release."""

from __future__ import annotations

import pytest

from unbroken.chaos import ChaosError, InjectKind, parse_chaos

pytestmark = pytest.mark.unit

NODES = ["node-0", "node-1"]


def test_a_throttle_and_its_release_are_read() -> None:
    on, off = parse_chaos(
        [
            {"kind": "throttle", "node": "node-1", "cpu": 0.2, "at_step": 10},
            {"kind": "throttle", "node": "node-1", "clear": True, "after_s": 30},
        ],
        "c.yaml",
        4,
        ["p0", "p1"],
        NODES,
    )
    assert (on.kind, on.node, on.cpu, on.clear) == (InjectKind.THROTTLE, "node-1", 0.2, False)
    assert (off.kind, off.cpu, off.clear) == (InjectKind.THROTTLE, None, True)


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"node": "node-1"}, "c.yaml: faults[0]: kind throttle: give 'cpu'"),
        ({"node": "node-1", "cpu": 0.2, "clear": True}, "kind throttle: give 'cpu'"),
        ({"node": "node-1", "cpu": 0}, "faults[0].cpu: 0 is not a share of one CPU (0.01-1.0)"),
        ({"node": "node-1", "cpu": True}, "faults[0].cpu: True is not a share of one CPU"),
        ({"cpu": 0.5}, "kind throttle: 'node' is required"),
        ({"node": "node-9", "cpu": 0.5}, "faults[0].node: 'node-9' does not exist"),
    ],
)
def test_each_problem_names_the_entry(entry: dict[str, object], message: str) -> None:
    with pytest.raises(ChaosError) as err:
        parse_chaos([{"kind": "throttle", "at_step": 5, **entry}], "c.yaml", 4, ["p0"], NODES)
    assert message in str(err.value), err.value


def test_cpu_is_for_throttle_entries_only() -> None:
    with pytest.raises(ChaosError, match="kind kill: cpu is for throttle entries"):
        parse_chaos([{"kind": "kill", "rank": 1, "at_step": 5, "cpu": 0.5}], "c", 4, [], NODES)
