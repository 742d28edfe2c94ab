"""The route map of one recovery (docs/recovery-route.md) names real code: every dotted name
in it resolves to a module of src/ and a class, function or method defined there. Read from the
source (ast), so the worker's and the agent's names resolve without importing torch."""

from __future__ import annotations

import re

import pytest
from tests.support.pysource import ROOT, resolve

pytestmark = pytest.mark.unit

ROUTE = ROOT / "docs" / "recovery-route.md"
DOTTED = re.compile(r"`(unbroken(?:\.\w+)+)`")


def test_every_name_on_the_route_map_resolves() -> None:
    names = sorted(set(DOTTED.findall(ROUTE.read_text())))
    assert len(names) > 30, "the route map names too little to follow"
    broken = {name: why for name in names if (why := resolve(name)) is not None}
    assert broken == {}


@pytest.mark.parametrize(
    "dotted",
    [
        "unbroken.manager.executor.Executor.no_such_method",
        "unbroken.manager.no_such_module.thing",
        "unbroken.worker.replica.repair.inside",
    ],
)
def test_a_name_that_is_not_in_the_code_is_found_out(dotted: str) -> None:
    assert resolve(dotted) is not None


def test_the_route_map_has_every_hop_of_a_recovery() -> None:
    text = ROUTE.read_text()
    for hop in ("step failure", "agent report", "detect", "decide", "rejoin", "regroup"):
        assert f"| {hop} |" in text
    for hop in ("repaired", "recorded"):
        assert f"| {hop} |" in text
