"""The control plane's parts import one way: the job manager uses the executor, the detector
and the rung steps; none of them imports the manager back."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    "module",
    [
        "unbroken.manager.executor",
        "unbroken.manager.engine",
        "unbroken.manager.pool",
        "unbroken.manager.inprocess",
        "unbroken.manager.scaling",
        "unbroken.manager.stress",
        "unbroken.manager.detector",
        "unbroken.manager.rungs",
    ],
)
def test_no_part_imports_the_job_manager(module: str) -> None:
    code = f"import json, sys, {module}\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=60
    )
    loaded = set(json.loads(out.stdout))
    assert "unbroken.manager.job" not in loaded
    assert "torch" not in loaded
