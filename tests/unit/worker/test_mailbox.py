"""The agent-to-rank mailbox: atomic posts, monotonic sequence numbers, each command once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from unbroken.worker.mailbox import (
    Dump,
    MailboxError,
    MailboxReader,
    MailboxWriter,
    Op,
    Pause,
    Rejoin,
    Stress,
    parse_command,
)

pytestmark = pytest.mark.unit

REJOIN: dict[str, Any] = {
    "op": "rejoin",
    "generation": 3,
    "master_addr": "127.0.0.1",
    "master_port": 29511,
    "rank": 2,
    "world_size": 4,
    "source": 0,
    "step": 110,
}


def test_a_posted_command_is_read_once_with_its_sequence_number(tmp_path: Path) -> None:
    path = tmp_path / "mb" / "rank2"
    writer = MailboxWriter(path)
    reader = MailboxReader(path)
    assert reader.poll() is None  # no file yet
    assert writer.post(REJOIN) == 1
    command = reader.poll()
    assert command == {**REJOIN, "seq": 1}
    assert reader.poll() is None
    assert reader.seen == 1
    assert parse_command(command) == Rejoin(
        seq=1,
        generation=3,
        master_addr="127.0.0.1",
        master_port=29511,
        rank=2,
        world_size=4,
        source=0,
        step=110,
    )


def test_the_newest_command_supersedes_unread_ones(tmp_path: Path) -> None:
    writer = MailboxWriter(tmp_path / "mb")
    reader = MailboxReader(tmp_path / "mb")
    assert writer.post({"op": "pause"}) == 1
    assert writer.post(REJOIN) == 2
    command = reader.poll()
    assert command is not None and command["op"] == "rejoin" and command["seq"] == 2
    assert writer.post({"op": "pause"}) == 3
    command = reader.poll()
    assert command is not None and parse_command(command) == Pause(seq=3)
    assert parse_command(command).op is Op.PAUSE


def test_a_dump_command_asks_for_last_words(tmp_path: Path) -> None:
    writer = MailboxWriter(tmp_path / "mb")
    reader = MailboxReader(tmp_path / "mb")
    writer.post({"op": "pause"})
    assert writer.post({"op": "dump"}) == 2
    command = reader.poll()
    assert command is not None and parse_command(command) == Dump(seq=2)
    assert parse_command(command).op is Op.DUMP


def test_a_stress_command_names_the_test_its_store_and_the_rank(tmp_path: Path) -> None:
    writer = MailboxWriter(tmp_path / "mb")
    reader = MailboxReader(tmp_path / "mb")
    body = {"op": "stress", "round": 3, "master_addr": "127.0.0.1", "master_port": 2950}
    writer.post({**body, "rank": 1, "world_size": 4})
    command = reader.poll()
    assert command is not None
    assert parse_command(command) == Stress(
        seq=1, round=3, master_addr="127.0.0.1", master_port=2950, rank=1, world_size=4
    )
    with pytest.raises(MailboxError, match=r"field rank=4 is not in 0\.\.3"):
        writer.post({**body, "rank": 4, "world_size": 4})


def test_a_reader_skips_a_command_older_than_itself_unless_told_not_to(tmp_path: Path) -> None:
    path = tmp_path / "mb"
    MailboxWriter(path).post(REJOIN)
    assert MailboxReader(path).poll() is None
    joiner = MailboxReader(path, skip_existing=False)
    command = joiner.poll()
    assert command is not None and command["seq"] == 1


def test_a_new_writer_continues_the_sequence(tmp_path: Path) -> None:
    path = tmp_path / "mb"
    MailboxWriter(path).post({"op": "pause"})
    again = MailboxWriter(path)
    assert again.seq == 1
    assert again.post(REJOIN) == 2
    reader = MailboxReader(path, skip_existing=False)
    command = reader.poll()
    assert command is not None and command["seq"] == 2


def test_posting_leaves_no_temporary_file_and_the_file_is_one_json_object(
    tmp_path: Path,
) -> None:
    writer = MailboxWriter(tmp_path / "mb")
    writer.post(REJOIN)
    assert sorted(os.listdir(tmp_path)) == ["mb"]
    assert json.loads((tmp_path / "mb").read_text())["seq"] == 1


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"op": "resume"}, "mailbox command op 'resume' is not one of pause, rejoin, dump, stress"),
        ({"rank": 4}, "mailbox command field rank=4 is not in 0..3"),
        ({"source": -1}, "mailbox command field source=-1 is not in 0..3"),
        ({"master_port": 70000}, "mailbox command field master_port=70000 is not in 1..65535"),
        ({"step": "110"}, "mailbox command field step='110' is not an integer"),
        ({"world_size": True}, "mailbox command field world_size=True is not an integer"),
        ({"master_addr": ""}, "mailbox command field master_addr='' is not a host name"),
        ({"generation": None}, "mailbox command field generation=None is not an integer"),
    ],
)
def test_a_bad_command_is_refused_and_the_mailbox_is_unchanged(
    tmp_path: Path, change: dict[str, Any], message: str
) -> None:
    path = tmp_path / "mb"
    writer = MailboxWriter(path)
    writer.post({"op": "pause"})
    with pytest.raises(MailboxError) as info:
        writer.post({**REJOIN, **change})
    assert str(info.value) == message
    assert writer.seq == 1
    assert json.loads(path.read_text()) == {"op": "pause", "seq": 1}


def test_a_missing_field_is_named() -> None:
    data = {k: v for k, v in REJOIN.items() if k != "source"}
    with pytest.raises(MailboxError, match="mailbox command 'rejoin' has no field 'source'"):
        parse_command({**data, "seq": 1})


def test_the_writer_assigns_the_sequence_number(tmp_path: Path) -> None:
    with pytest.raises(MailboxError, match="must not carry 'seq'"):
        MailboxWriter(tmp_path / "mb").post({"op": "pause", "seq": 7})


def test_a_file_that_is_not_a_command_is_an_error_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "mb"
    path.write_text("[1, 2]\n")
    with pytest.raises(MailboxError, match=f"mailbox {path} holds list, not a JSON object"):
        MailboxReader(path, skip_existing=False).poll()
    path.write_text('{"op": "pause"')
    with pytest.raises(MailboxError, match=f"mailbox {path} does not hold a JSON command"):
        MailboxReader(path, skip_existing=False).poll()
    path.write_text('{"op": "pause", "seq": 0}')
    with pytest.raises(MailboxError, match="holds a command with seq=0, not an integer >= 1"):
        MailboxWriter(path)


def test_an_unchanged_file_is_not_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "mb"
    MailboxWriter(path).post({"op": "pause"})
    reader = MailboxReader(path, skip_existing=False)
    assert reader.poll() is not None
    reads: list[Path] = []
    original = Path.read_text

    def counting_read(self: Path, *args: Any, **kwargs: Any) -> str:
        reads.append(self)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", counting_read)
    for _ in range(100):
        assert reader.poll() is None
    assert reads == []


def test_the_agent_side_imports_no_torch() -> None:
    code = (
        "import sys, unbroken.worker.mailbox\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'numpy')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=60
    )
    assert out.stdout.strip() == "[]"
