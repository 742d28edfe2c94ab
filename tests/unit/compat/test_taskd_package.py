"""The top-level ``taskd`` package: the seed's TaskD import lines work verbatim and give the very
functions of ``unbroken.compat.taskd``; the seed's ``manager.py`` runs unchanged; the module the
seed's Dockerfile puts into torchrun (``taskd.python.adaptor.patch``) imports neither torch nor
grpc, and only logs, at debug level and once, outside an Unbroken agent."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

import taskd
from taskd.python.adaptor import patch
from unbroken.compat import taskd as compat

pytestmark = pytest.mark.unit

SRC = Path(__file__).resolve().parents[3] / "src"
FUNCTIONS = ("init_taskd_manager", "start_taskd_manager", "init_taskd_worker", "start_taskd_worker")

#: The seed's import lines, as the seed writes them (manager.py, the worker snippet, the
#: Dockerfile's line in torchrun's run.py).
SEED_MANAGER_IMPORT = "from taskd.api import init_taskd_manager, start_taskd_manager\n"
SEED_WORKER_IMPORTS = (
    "from taskd.api.taskd_worker_api import init_taskd_worker\n"
    "from taskd.api.taskd_worker_api import start_taskd_worker\n"
)
SEED_WORKER_IMPORT = (
    "from taskd.api.taskd_worker_api import init_taskd_worker, start_taskd_worker\n"
)
SEED_PATCH_IMPORT = "import taskd.python.adaptor.patch\n"

#: The seed's manager.py, verbatim but for its ``XX`` placeholders.
SEED_MANAGER_PY = """\
from taskd.api import init_taskd_manager, start_taskd_manager
import os

job_id=os.getenv("MINDX_TASK_ID")
node_nums=2          # Total number of task nodes
proc_per_node=2     # Number of training processes per node

init_taskd_manager({"job_id":job_id, "node_nums": node_nums, "proc_per_node": proc_per_node})
start_taskd_manager()
"""


def run_python(code: str, **extra: str) -> subprocess.CompletedProcess[str]:
    """``python -c CODE`` in a fresh process of this checkout, outside any Unbroken run."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("UNBROKEN_", "TORCHELASTIC_")) and k not in ("MINDX_TASK_ID", "RANK")
    }
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SRC), env.get("PYTHONPATH")) if p)
    return subprocess.run(
        [sys.executable, "-c", code],
        env={**env, **extra},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(
    "source",
    [SEED_MANAGER_IMPORT, SEED_WORKER_IMPORTS, SEED_WORKER_IMPORT],
    ids=["manager", "worker-two-lines", "worker-one-line"],
)
def test_the_seeds_import_lines_work_verbatim(source: str) -> None:
    names: dict[str, object] = {}
    exec(compile(source, "<seed>", "exec"), names)
    imported = {k: v for k, v in names.items() if k != "__builtins__"}
    assert imported
    assert imported == {k: getattr(compat, k) for k in imported}


def test_the_api_modules_give_the_very_functions_of_the_compat_module() -> None:
    from taskd import api
    from taskd.api import taskd_manager_api, taskd_worker_api

    assert sorted(api.__all__) == sorted(FUNCTIONS)
    for name in FUNCTIONS:
        assert getattr(api, name) is getattr(compat, name)
    assert taskd_manager_api.init_taskd_manager is compat.init_taskd_manager
    assert taskd_manager_api.start_taskd_manager is compat.start_taskd_manager
    assert taskd_worker_api.init_taskd_worker is compat.init_taskd_worker
    assert taskd_worker_api.start_taskd_worker is compat.start_taskd_worker


def test_no_libtaskd_is_shipped() -> None:
    root = Path(taskd.__file__).parent
    assert not (root / "python" / "cython_api").exists()
    assert list(root.rglob("*.so")) == []


def test_the_seeds_manager_py_runs_unchanged() -> None:
    """Outside a run it says, on stderr and without a traceback, what to do instead."""
    done = run_python(SEED_MANAGER_PY, MINDX_TASK_ID="mlp")
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith("start_taskd_manager: job 'mlp': this process is not inside an Unbroken")


def test_the_patch_imports_neither_torch_nor_grpc() -> None:
    code = SEED_PATCH_IMPORT + "import sys\nprint(' '.join(sorted(sys.modules)))"
    done = run_python(code)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""  # nothing said: its one line is at debug level
    out = done.stdout.split()
    assert "taskd.python.adaptor.patch" in out
    assert [m for m in out if m.split(".")[0] in ("torch", "grpc")] == []


DEBUG_IMPORT = (
    "import logging\nlogging.basicConfig(level=logging.DEBUG, format='%(name)s %(levelname)s "
    "%(message)s')\n" + SEED_PATCH_IMPORT + SEED_PATCH_IMPORT  # imported twice: said once
)


def test_outside_an_unbroken_agent_the_patch_says_what_it_is_once_at_debug_level() -> None:
    done = run_python(DEBUG_IMPORT)
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == [f"taskd.python.adaptor.patch DEBUG {patch.WHAT}"]


@pytest.mark.parametrize("variable", ["UNBROKEN_JOB_ID", "UNBROKEN_GENERATION"])
def test_under_an_unbroken_agent_the_patch_says_nothing(variable: str) -> None:
    done = run_python(DEBUG_IMPORT, **{variable: "1"})
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""


def test_say_once_logs_at_debug_only_outside_an_agent(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger=patch.__name__)
    monkeypatch.setattr(patch, "_said", False)
    assert not patch.say_once({"UNBROKEN_JOB_ID": "mlp"})
    assert not patch.say_once({"UNBROKEN_GENERATION": "0"})
    assert patch.say_once({})
    assert not patch.say_once({})
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [(logging.DEBUG, patch.WHAT)]
