"""The worker library, torch side included, never pulls in the control plane, the CLI, grpc
or yaml: training processes stay light."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.multiproc

_FORBIDDEN = (
    "grpc",
    "yaml",
    "unbroken.cli",
    "unbroken.rpc",
    "unbroken.spec",
    "unbroken.manager",
    "unbroken.agent",
    "unbroken.policy",
)
#: The pure knob parsers the worker reads HCCL_OP_RETRY_* with (no YAML behind them).
_ALLOWED = {"unbroken.spec", "unbroken.spec.knobs", "unbroken.spec.envknobs"}


def test_the_whole_worker_api_imports_only_torch_and_the_standard_library() -> None:
    code = (
        "import json, sys\n"
        "import unbroken.worker as ub\n"
        "ub.init, ub.Session, ub.TrainingStopped, ub.state_digest\n"
        "import unbroken.checkpoint as ck\n"
        "ck.Checkpointer, ck.Restored\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=120
    )
    loaded = set(json.loads(out.stdout))
    assert "torch" in loaded and "unbroken.worker.session" in loaded
    assert "unbroken.worker.opretry" in loaded and "unbroken.spec.envknobs" in loaded
    assert (
        sorted(
            m
            for m in loaded - _ALLOWED
            if m.split(".")[0] in _FORBIDDEN or m.startswith(_FORBIDDEN)
        )
        == []
    )
