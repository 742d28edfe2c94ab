"""A stopped rank's wait for the job manager's decision (MINDIO_WAIT_MINDX_TIME)."""

from __future__ import annotations

import pytest

from unbroken.worker.decisionwait import decision_wait_from_environ, undecided_too_long

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("raw", "expected"),
    [("", None), ("30", 30.0), ("1", 1.0), ("3600", 3600.0), ("60.5", 60.5)],
)
def test_the_value_from_the_environment(raw: str, expected: float | None) -> None:
    assert decision_wait_from_environ({"UNBROKEN_DECISION_WAIT_S": raw}) == expected


@pytest.mark.parametrize(
    ("raw", "error"),
    [
        ("soon", r"UNBROKEN_DECISION_WAIT_S='soon' is not a number of seconds"),
        ("0", r"UNBROKEN_DECISION_WAIT_S='0' is out of range: MINDIO_WAIT_MINDX_TIME is 1-3600 s"),
        ("3601", r"'3601' is out of range"),
        ("nan", r"'nan' is out of range"),
    ],
)
def test_a_bad_value_is_refused_with_its_name(raw: str, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        decision_wait_from_environ({"UNBROKEN_DECISION_WAIT_S": raw})


@pytest.mark.parametrize(
    ("waited_s", "decided", "wait_s", "gives_up"),
    [
        (29.9, False, 30.0, False),  # still within the decision wait
        (30.0, False, 30.0, True),  # nothing heard in time
        (300.0, True, 30.0, False),  # a decision heard: the rung's own timeout applies
        (300.0, False, None, False),  # unbounded (no control plane set it)
    ],
)
def test_when_a_rank_gives_up_for_want_of_a_decision(
    waited_s: float, decided: bool, wait_s: float | None, gives_up: bool
) -> None:
    reason = undecided_too_long(waited_s, decided, wait_s)
    assert (reason is not None) is gives_up
    if reason is not None:
        assert reason == (
            "no decision from the job manager within 30 s (MINDIO_WAIT_MINDX_TIME), giving up"
        )
