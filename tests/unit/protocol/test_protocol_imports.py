"""The protocol is the one place both sides import: it must load with the standard library
alone, in a training process as in an agent."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.unit


def test_the_protocol_imports_only_the_standard_library() -> None:
    code = (
        "import json, sys\n"
        "import unbroken.protocol, unbroken.protocol.messages, unbroken.protocol.mailbox\n"
        "import unbroken.protocol.stress, unbroken.protocol.hosts\n"
        "import unbroken.protocol.wire, unbroken.protocol.calls\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=60
    )
    ours = {m for m in json.loads(out.stdout) if m.split(".")[0] == "unbroken"}
    assert ours <= {
        "unbroken",
        *(
            f"unbroken.protocol{s}"
            for s in (
                "",
                ".kinds",
                ".heartbeat",
                ".mailbox",
                ".messages",
                ".stress",
                ".hosts",
                ".wire",
                ".calls",
            )
        ),
    }
    heavy = {"torch", "grpc", "yaml"} & {m.split(".")[0] for m in json.loads(out.stdout)}
    assert heavy == set()
