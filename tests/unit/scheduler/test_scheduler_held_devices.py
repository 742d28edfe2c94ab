"""ManuallySeparate devices: held out of the pool until an operator releases them."""

from __future__ import annotations

import pytest

from unbroken.scheduler import Cluster, Placement, Pod, Unschedulable, place

pytestmark = pytest.mark.unit

MANUAL = "fault level ManuallySeparate"


def _cluster() -> Cluster:
    return Cluster.of({"node-0": 2, "node-1": 2})


# (case, operations in order, device 1 of node-0 isolated after, held after)
CASES = [
    ("separate, healthy again: back", [("isolate", False), ("return", None)], False, False),
    ("manual, healthy again: still out", [("isolate", True), ("return", None)], True, True),
    ("manual, released: back", [("isolate", True), ("release", None)], False, False),
    (
        "separate, then escalated to manual: held",
        [("isolate", False), ("isolate", True), ("return", None)],
        True,
        True,
    ),
    (
        "released, then faulty again at a lower level: returns by itself",
        [("isolate", True), ("release", None), ("isolate", False), ("return", None)],
        False,
        False,
    ),
]


@pytest.mark.parametrize(
    ("ops", "isolated", "held"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_held_device_pool(ops: list[tuple[str, bool | None]], isolated: bool, held: bool) -> None:
    c = _cluster()
    for op, manual in ops:
        if op == "isolate":
            c = c.isolate_device("node-0", 1, MANUAL if manual else "code 80E3A201", bool(manual))
        elif op == "return":
            c = c.return_device("node-0", 1)
        else:
            c = c.release_device("node-0", 1)
    assert c.device_isolated("node-0", 1) is isolated
    assert c.device_held("node-0", 1) is held
    assert (1 in c.healthy_devices("node-0")) is not isolated


def test_a_held_device_takes_no_pod_until_released() -> None:
    c = _cluster().isolate_node("node-1", "node lost").isolate_device("node-0", 1, MANUAL, True)
    pod = [Pod("worker-0", 2)]
    assert isinstance(place(c.return_device("node-0", 1), pod), Unschedulable)
    placed = place(c.release_device("node-0", 1), pod)
    assert isinstance(placed, Placement)
    assert placed.bindings[0].devices == (0, 1)


def test_releasing_a_device_that_is_not_held_names_its_state() -> None:
    c = _cluster()
    with pytest.raises(ValueError, match=r"^device 0 of node-0 is not held .*: it is in the pool$"):
        c.release_device("node-0", 0)
    c = c.isolate_device("node-0", 0, "code 80E3A201")
    with pytest.raises(ValueError, match=r"isolated \(code 80E3A201\) and returns by itself"):
        c.release_device("node-0", 0)
    with pytest.raises(ValueError, match="there is no device 5"):
        c.release_device("node-0", 5)
