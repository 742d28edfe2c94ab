"""The scripted NVML of the tests (``tests/support/fakenvml/pynvml.py``): a fresh copy of the
module, and the state file every call of it reads (``FAKE_NVML_STATE``)."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from types import ModuleType
from typing import Any

FAKE_DIR = Path(__file__).parent / "fakenvml"


def load(name: str = "fake_pynvml") -> ModuleType:
    """A fresh copy of the scripted ``pynvml`` under ``name`` (its event sets are its own)."""
    spec = importlib.util.spec_from_file_location(name, FAKE_DIR / "pynvml.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_state(path: Path, **state: Any) -> None:
    """Replace the scripted GPUs' state whole (a reader never sees half a file)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state))
    os.replace(tmp, path)
