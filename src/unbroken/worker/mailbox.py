"""The rank's end of the command channel from its node agent.

The command format, the agent's writer and the rank's reader are in
:mod:`unbroken.protocol.mailbox`, imported by both sides; its names are re-exported here.
"""

from __future__ import annotations

from unbroken.protocol.mailbox import (
    MAILBOX,
    Command,
    Dump,
    MailboxError,
    MailboxReader,
    MailboxWriter,
    Op,
    Pause,
    Rejoin,
    Stress,
    encode_command,
    parse_command,
)

__all__ = [
    "MAILBOX",
    "Command",
    "Dump",
    "MailboxError",
    "MailboxReader",
    "MailboxWriter",
    "Op",
    "Pause",
    "Rejoin",
    "Stress",
    "encode_command",
    "parse_command",
]
