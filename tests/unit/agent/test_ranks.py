"""How a rank's exit is described: signals, tracebacks, and echoes of a peer's failure."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from unbroken.agent.ranks import RankExit, extract_traceback, is_peer_failure
from unbroken.protocol.kinds import StepFailure

pytestmark = pytest.mark.unit

GLOO_TB = """Traceback (most recent call last):
  File "train.py", line 9, in <module>
    loss.backward()
RuntimeError: [gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:1: Connection reset by peer.
"""
USER_TB = """Traceback (most recent call last):
  File "train.py", line 3, in <module>
    raise ValueError("bad batch")
ValueError: bad batch
"""


def _exit(code: int, tb: str = "") -> RankExit:
    return RankExit(
        rank=3, local_rank=1, pid=42, generation=0, returncode=code, at=1.0, traceback=tb
    )


def test_a_signal_is_named() -> None:
    ex = _exit(-9)
    assert ex.signal_name == "SIGKILL"
    assert ex.describe() == "killed by SIGKILL"
    assert not ex.peer_failure


def test_an_exception_names_its_last_line() -> None:
    ex = _exit(1, USER_TB)
    assert ex.describe() == "exited 1: ValueError: bad batch"
    assert not ex.peer_failure


def test_a_collective_error_is_an_echo_of_a_peer() -> None:
    assert _exit(1, GLOO_TB).peer_failure
    assert is_peer_failure(GLOO_TB)
    assert not is_peer_failure(USER_TB)


def test_what_the_rank_reported_wins_over_the_words_of_its_traceback() -> None:
    """A rank that used the worker API said why it ended (its exit report or the failure of its
    stopped step): that is taken as it is; the traceback's words only for one that said
    nothing."""
    gloo_but_own = replace(_exit(1, GLOO_TB), reported_failure=StepFailure.NONE)
    assert not gloo_but_own.peer_failure
    user_but_collective = replace(_exit(1, USER_TB), reported_failure=StepFailure.COLLECTIVE)
    assert user_but_collective.peer_failure
    killed = replace(_exit(-9), reported_failure=StepFailure.COLLECTIVE)
    assert not killed.peer_failure  # a signal ended it, whatever it was doing


def test_the_last_traceback_of_a_log_is_taken(tmp_path: Path) -> None:
    log = tmp_path / "rank.log"
    log.write_text("step 1\n" + USER_TB.replace("bad batch", "old") + "restarted\n" + USER_TB)
    assert extract_traceback(log) == USER_TB.strip()
    assert extract_traceback(tmp_path / "missing.log") == ""
