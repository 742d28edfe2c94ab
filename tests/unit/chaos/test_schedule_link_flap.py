"""A link that flaps (``times``) and a device error a rank raises (``code: CUDA-<n>``): what the
chaos file takes and what it refuses, each problem naming the entry."""

from __future__ import annotations

import pytest

from unbroken.chaos import ChaosError, InjectKind, parse_chaos

pytestmark = pytest.mark.unit


def parse(*entries: dict[str, object]) -> tuple[object, ...]:
    return tuple(parse_chaos(list(entries), "c.yaml", 4, ["p0", "p1"], ["node-0", "node-1"]))


def test_a_flapping_link_and_a_device_error_are_read() -> None:
    flap, assert_ = parse(
        {"kind": "link", "rank": 2, "at_step": 20, "times": 2},
        {"kind": "exception", "rank": 1, "at_step": 5, "code": "CUDA-710"},
    )
    assert (flap.kind, flap.times, flap.in_rank) == (InjectKind.LINK, 2, True)  # type: ignore[attr-defined]
    assert flap.to_json()["times"] == 2  # type: ignore[attr-defined]
    assert (assert_.kind, assert_.code) == (InjectKind.EXCEPTION, "CUDA-710")  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"kind": "kill", "rank": 1, "at_step": 5, "times": 2}, "times is for link entries"),
        ({"kind": "link", "rank": 1, "at_step": 5, "times": 0}, "faults[0].times"),
        ({"kind": "link", "rank": 1, "at_step": 5, "times": 11}, "faults[0].times"),
        ({"kind": "exception", "rank": 1, "at_step": 5, "code": "710"}, "CUDA error code"),
        ({"kind": "kill", "rank": 1, "at_step": 5, "code": "CUDA-710"}, "code is for device"),
    ],
)
def test_each_problem_names_the_entry(entry: dict[str, object], message: str) -> None:
    with pytest.raises(ChaosError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse(entry)
