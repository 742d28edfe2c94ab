"""A decision's reason names the ranks it is about, all of a few, the first of many."""

from __future__ import annotations

import pytest

from unbroken.manager.feasible import some as _some

pytestmark = pytest.mark.unit


def test_a_few_ranks_are_all_named() -> None:
    assert _some([0, 1, 2, 3]) == "0, 1, 2, 3"


def test_many_ranks_are_named_by_the_first_and_counted() -> None:
    text = _some(list(range(8, 8 + 296)))
    assert text.startswith("8, 9, 10,") and text.endswith(", 23, ... (296 in all)")
    assert "24" not in text.split("...")[0]
