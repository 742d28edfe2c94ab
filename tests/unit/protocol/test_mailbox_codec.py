"""The mailbox command codec: every typed command survives its wire form with every field,
and a typed command the agent sends writes the bytes its dict was written as before."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path
from typing import Any

import pytest

from unbroken.protocol.mailbox import (
    Command,
    Dump,
    MailboxError,
    MailboxWriter,
    Op,
    Pause,
    Rejoin,
    Stress,
    encode_command,
    parse_command,
)

pytestmark = pytest.mark.unit

#: One command of each type, every field set to a value of its own (none left at a default),
#: so a field the codec dropped or mixed up with another cannot come back equal.
COMMANDS: tuple[Command, ...] = (
    Pause(seq=7),
    Rejoin(
        seq=8,
        generation=3,
        master_addr="10.0.0.5",
        master_port=29511,
        rank=2,
        world_size=6,
        source=1,
        step=110,
        ifname="eth7",
    ),
    Dump(seq=9),
    Stress(seq=10, round=4, master_addr="10.0.0.6", master_port=29533, rank=3, world_size=5),
)

#: What the agent posted for each command before it posted typed ones (seq: the writer's).
LEGACY: dict[type[Command], dict[str, Any]] = {
    Pause: {"op": "pause"},
    Rejoin: {
        "op": "rejoin",
        "generation": 3,
        "master_addr": "10.0.0.5",
        "master_port": 29511,
        "rank": 2,
        "world_size": 6,
        "source": 1,
        "step": 110,
        "ifname": "eth7",
    },
    Dump: {"op": "dump"},
    Stress: {
        "op": "stress",
        "round": 4,
        "master_addr": "10.0.0.6",
        "master_port": 29533,
        "rank": 3,
        "world_size": 5,
    },
}


def _name(command: Command) -> str:
    return type(command).__name__


def test_every_command_type_and_op_is_covered() -> None:
    assert {type(c) for c in COMMANDS} == set(typing.get_args(Command)) == set(LEGACY)
    assert {c.op for c in COMMANDS} == set(Op)


@pytest.mark.parametrize("command", COMMANDS, ids=_name)
def test_no_field_is_left_at_its_default(command: Command) -> None:
    for f in dataclasses.fields(command):
        assert getattr(command, f.name) != f.default, f.name


@pytest.mark.parametrize("command", COMMANDS, ids=_name)
def test_a_command_survives_its_wire_form(command: Command) -> None:
    wire = encode_command(command)
    assert parse_command(wire) == command
    assert wire["op"] == command.op.value
    assert set(wire) == {"op"} | {f.name for f in dataclasses.fields(command)}
    for f in dataclasses.fields(command):
        assert wire[f.name] == getattr(command, f.name), f.name


@pytest.mark.parametrize("command", COMMANDS, ids=_name)
def test_without_any_one_field_the_wire_form_does_not_come_back(command: Command) -> None:
    wire = encode_command(command)
    for name in [f.name for f in dataclasses.fields(command)]:
        partial = {k: v for k, v in wire.items() if k != name}
        try:
            back = parse_command(partial)
        except MailboxError:
            continue
        assert back != command, name


@pytest.mark.parametrize("command", COMMANDS, ids=_name)
def test_a_sent_command_writes_the_bytes_its_dict_was_posted_as(
    tmp_path: Path, command: Command
) -> None:
    typed, legacy = MailboxWriter(tmp_path / "typed"), MailboxWriter(tmp_path / "legacy")
    for writer in (typed, legacy):  # numbered as the command is
        while writer.next_seq < command.seq:
            writer.post({"op": "pause"})
    assert typed.send(command) == command.seq
    assert legacy.post(LEGACY[type(command)]) == command.seq
    assert typed.path.read_bytes() == legacy.path.read_bytes()
    assert typed.seq == command.seq and typed.next_seq == command.seq + 1


def test_a_command_numbered_out_of_turn_is_refused_and_the_mailbox_kept(tmp_path: Path) -> None:
    writer = MailboxWriter(tmp_path / "mb")
    writer.send(Pause(seq=writer.next_seq))
    before = writer.path.read_bytes()
    for seq in (1, 3):
        with pytest.raises(MailboxError, match="seq"):
            writer.send(Dump(seq=seq))
    assert writer.path.read_bytes() == before and writer.seq == 1


def test_a_bad_typed_command_is_refused_and_the_mailbox_kept(tmp_path: Path) -> None:
    writer = MailboxWriter(tmp_path / "mb")
    writer.send(Pause(seq=writer.next_seq))
    before = writer.path.read_bytes()
    bad = Stress(seq=2, round=1, master_addr="h", master_port=29500, rank=4, world_size=4)
    with pytest.raises(MailboxError, match="rank"):
        writer.send(bad)
    assert writer.path.read_bytes() == before and writer.seq == 1
