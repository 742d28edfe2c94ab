"""Import contract: the heartbeat side of the worker library and the checkpoint finder are
light enough for the node agent and the CLI (no torch), and the worker never pulls in the
control plane."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.unit

_FORBIDDEN = ("torch", "grpc", "yaml", "unbroken.cli", "unbroken.rpc", "unbroken.spec")


def _modules_after(statement: str) -> set[str]:
    code = f"{statement}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=60
    )
    return set(json.loads(out.stdout))


@pytest.mark.parametrize(
    "statement",
    [
        "import unbroken.worker",
        "from unbroken.worker.heartbeat import HeartbeatReader, Phase",
        "from unbroken.worker import HeartbeatReader, HeartbeatWriter",
        "from unbroken.checkpoint import find_latest_good, verify",
    ],
)
def test_light_imports_stay_light(statement: str) -> None:
    loaded = _modules_after(statement)
    heavy = sorted(m for m in loaded if m.split(".")[0] in _FORBIDDEN or m.startswith(_FORBIDDEN))
    assert heavy == []
