"""``clear: true`` in a chaos schedule: a lost node back in the pool, a device healthy again."""

from __future__ import annotations

import pytest

from unbroken.chaos import ChaosError, InjectKind, parse_chaos

pytestmark = pytest.mark.unit

PODS, NODES = ("job-master-0", "job-worker-0"), ("node-0", "node-1")


def test_a_node_and_a_device_can_be_cleared() -> None:
    node, device = parse_chaos(
        {
            "faults": [
                {"kind": "node", "node": "node-1", "at_step": 20, "clear": True},
                {"kind": "device", "node": "node-0", "device": 1, "after_s": 5, "clear": True},
            ]
        },
        "c.yaml",
        4,
        PODS,
        NODES,
    )
    assert (node.kind, node.node, node.clear) == (InjectKind.NODE, "node-1", True)
    assert (device.kind, device.device, device.code, device.clear) == (
        InjectKind.DEVICE,
        1,
        None,
        True,
    )


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"kind": "kill", "rank": 1, "at_step": 3, "clear": True}, "clear: kind kill: clear is"),
        ({"kind": "node", "node": "node-1", "at_step": 3, "clear": "yes"}, "'yes' is not true"),
        (
            {"kind": "device", "node": "node-0", "device": 1, "code": "80E3A201", "at_step": 3}
            | {"clear": True},
            "give 'code' (a fault) or 'clear: true' (healthy), not both",
        ),
    ],
)
def test_a_bad_clear_names_the_entry(entry: dict[str, object], message: str) -> None:
    with pytest.raises(ChaosError) as err:
        parse_chaos({"faults": [entry]}, "c.yaml", 4, PODS, NODES)
    assert str(err.value).startswith("c.yaml: faults[0]") and message in str(err.value)
