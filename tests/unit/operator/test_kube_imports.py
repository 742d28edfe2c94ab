"""Import contract: kopf and the kubernetes client are loaded by the operator's Kubernetes modules
alone (unbroken.operator.kube, .volcano and the entry point, unbroken.operator.__main__), so the
core install (planner, policy, CLI, worker) works without the ``kube`` extra."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.unit

_KUBE = ("kopf", "kubernetes", "kmock")


def _modules_after(statement: str) -> set[str]:
    code = f"{statement}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=60
    )
    return set(json.loads(out.stdout))


@pytest.mark.parametrize(
    "statement",
    [
        "import unbroken.operator, unbroken.operator.reschedule, unbroken.policy",
        "import unbroken.operator.resource, unbroken.operator.controlplane",
        "import unbroken.cli",
        "import unbroken.worker",
    ],
)
def test_kube_libraries_stay_out(statement: str) -> None:
    loaded = _modules_after(statement)
    assert sorted(m for m in loaded if m.split(".")[0] in _KUBE) == []


@pytest.mark.parametrize(
    "module", ["unbroken.operator.kube", "unbroken.operator.volcano", "unbroken.operator.__main__"]
)
def test_the_operator_modules_do_load_them(module: str) -> None:
    """The check above can fail: the modules that need them do pull them in."""
    loaded = _modules_after(f"import {module}")
    assert {"kopf", "kubernetes"} <= loaded
