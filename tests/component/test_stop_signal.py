"""SIGTERM as a stop request (unbroken.worker.stop) in a real process whose main thread is
blocked where no Python handler runs: without ``needed`` it waits out its deadline; with
``needed`` saying the process has nothing left to do, it exits at once, with the stop's status."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from unbroken.worker.stop import STOP_EXIT_CODE

pytestmark = pytest.mark.component

SCRIPT = textwrap.dedent(
    """
    import os, sys, threading
    from pathlib import Path
    from unbroken.worker.stop import StopSignal

    flag = Path(sys.argv[1])
    needed = (lambda: not flag.exists()) if sys.argv[2] == "needed" else None
    stop = StopSignal(lambda: None, lambda: float(sys.argv[3]), needed)
    stop.install()
    print("ready", flush=True)
    threading.Event().wait()  # blocked in C: the Python handler never runs
    """
)


def _stop_after(tmp_path: Path, mode: str, deadline_s: float, taken: bool) -> tuple[int, float]:
    flag = tmp_path / "taken"
    proc = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, str(flag), mode, str(deadline_s)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        proc.send_signal(signal.SIGTERM)
        began = time.monotonic()
        if taken:
            time.sleep(0.5)
            flag.touch()  # another rank took the last words
        code = proc.wait(timeout=30)
        return code, time.monotonic() - began
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_blocked_process_with_nothing_left_to_do_exits_at_once(tmp_path: Path) -> None:
    code, took_s = _stop_after(tmp_path, "needed", deadline_s=20.0, taken=True)
    assert code == STOP_EXIT_CODE and took_s < 5.0


def test_a_blocked_process_still_needed_waits_for_its_deadline(tmp_path: Path) -> None:
    code, took_s = _stop_after(tmp_path, "needed", deadline_s=2.0, taken=False)
    assert code == STOP_EXIT_CODE and took_s >= 2.0
    code, took_s = _stop_after(tmp_path, "plain", deadline_s=2.0, taken=True)
    assert code == STOP_EXIT_CODE and took_s >= 2.0
