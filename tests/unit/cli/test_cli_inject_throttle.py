"""``unbroken inject throttle``: what it needs, said before any run is looked for."""

from __future__ import annotations

import pytest

from unbroken.cli import main

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["throttle", "--node", "node-1"], "throttle needs one of --cpu or --clear"),
        (["throttle", "--node", "node-1", "--cpu", "0.2", "--clear"], "needs one of --cpu or"),
        (["throttle", "--rank", "1", "--cpu", "0.2"], "throttle needs --node"),
        (["kill", "--rank", "1", "--cpu", "0.2"], "--cpu is for throttle, not kill"),
    ],
)
def test_a_throttle_without_what_it_needs_is_refused(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["inject", *argv]) == 2
    assert message in capsys.readouterr().err
