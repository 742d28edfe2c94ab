"""Where runs live: ``runs/<job>-<timestamp>/`` under the current directory by default.

A run directory holds the ledger (``ledger.db``), the control plane's address and secret while
the run is alive (``control.json``, mode 0600), rank and agent logs (``pods/``), checkpoints
(``checkpoints/``) and the simulated device health (``devices/``).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

RUNS = Path("runs")


class RunDirError(ValueError):
    pass


def new_run_dir(job: str, given: Path | None) -> Path:
    path = given or RUNS / f"{job}-{time.strftime('%Y%m%d-%H%M%S')}"
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise RunDirError(
            f"cannot use run directory {path}: {exc.strerror or exc} "
            "(choose another with --run-dir)"
        ) from None
    return path.resolve()


def find_run(given: Path | None) -> Path:
    """The run directory named, or the newest under ./runs."""
    if given is not None:
        if not (given / "ledger.db").exists():
            raise RunDirError(f"{given} is not a run directory (no ledger.db in it)")
        return given
    candidates = sorted(
        (p for p in RUNS.glob("*") if (p / "ledger.db").exists()),
        key=lambda p: (p / "ledger.db").stat().st_mtime,
    )
    if not candidates:
        raise RunDirError("no run found under ./runs; name one: unbroken status RUN_DIR")
    return candidates[-1]


def control_of(run: Path) -> dict[str, Any]:
    path = run / "control.json"
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise RunDirError(f"run {run} is not running (no control.json)") from None
    except (OSError, ValueError) as exc:
        raise RunDirError(f"{path}: unreadable: {exc}") from None
    if not isinstance(data, dict) or "address" not in data or "secret" not in data:
        raise RunDirError(f"{path}: not a control file of this version")
    return data
