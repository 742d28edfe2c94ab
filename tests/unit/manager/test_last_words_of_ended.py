"""Last words a MindSpore rank writes while a restart stops it (unbroken.manager.progress): its
agent still reports the ended generation; each is recorded once, and said. A restart that knows
they are written waits for no rank blocked in a collective (unbroken.manager.generations)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from unbroken.ledger import Ledger
from unbroken.manager.console import Console
from unbroken.manager.generations import Generations
from unbroken.manager.progress import RankView, last_words_of_ended
from unbroken.protocol.heartbeat import HeartbeatRecord
from unbroken.protocol.messages import RankProgress

pytestmark = pytest.mark.unit

BEGAN = 1767225600.0  # the ended generation's start


def _row(
    rank: int, dumped_step: int = -1, dumped_at: float = 0.0, recoverable: int = 0
) -> RankProgress:
    record = HeartbeatRecord(
        pid=100 + rank,
        rank=rank,
        recoverable=recoverable,
        dumped_step=dumped_step,
        dumped_at=dumped_at,
    )
    return RankProgress(rank=rank, pid=100 + rank, alive=True, record=record)


def test_the_last_words_of_a_stopped_generation_are_recorded_once(tmp_path: Path) -> None:
    out = io.StringIO()
    console, heard = Console(out=out), set[tuple[int, float]]()
    rows = (
        _row(0, dumped_step=16, dumped_at=BEGAN + 30.0),  # wrote them as it stopped
        _row(1),  # left them to rank 0
        _row(2, dumped_step=10, dumped_at=BEGAN - 5.0),  # an earlier generation's
        _row(3, dumped_step=16, dumped_at=BEGAN + 31.0, recoverable=1),  # a torch rank's
        RankProgress(rank=4, pid=104, alive=False),  # no record
    )
    with Ledger(tmp_path / "ledger.db") as ledger:
        for _ in range(3):  # the agent reports every 50 ms while its ranks stop
            last_words_of_ended(rows, BEGAN, heard, ledger, console)
        saved = [r.data for r in ledger.events(kinds=["CheckpointSaved"])]
    assert [(d["step"], d["last_words"]) for d in saved] == [(16, True)]
    assert out.getvalue().count("last words: rank 0 saved step 16") == 1
    assert "rank 3" not in out.getvalue()


def test_a_restart_knows_whether_the_committed_steps_last_words_are_written() -> None:
    gens = Generations()
    gens.begin(BEGAN, rung=1, replica_step=None)
    gens.ranks = {r: RankView(rank=r, pid=100 + r, generation=1, committed=25) for r in range(3)}
    assert not gens.last_words_written()  # none written: a rank in a collective may yet
    gens.ranks[2].dumped_step, gens.ranks[2].dumped_at = 24, BEGAN + 5.0
    assert not gens.last_words_written()  # an older step's
    gens.ranks[2].dumped_step = 25
    assert gens.last_words_written()  # the failing rank wrote them: no one is waited for
    gens.begin(BEGAN + 9.0, rung=2, replica_step=None)  # a second pod's restart, at once
    assert gens.last_words_written()  # none of its ranks heard yet: as the generation before
    gens.begin(BEGAN + 99.0, rung=3, replica_step=None)
    gens.ranks = {0: RankView(rank=0, pid=300, generation=3, committed=25)}
    assert not gens.last_words_written()  # its ranks heard: their own say
    gens.begin(BEGAN + 200.0, rung=4, replica_step=None)
    gens.ranks = {0: RankView(rank=0, pid=400, generation=4, committed=25)}
    gens.ranks[0].dumped_step, gens.ranks[0].dumped_at = 25, BEGAN + 150.0
    assert not gens.last_words_written()  # an earlier generation's
