"""A rank's last report: why its process is ending, written by the rank itself.

When an exception escapes a training script that uses :mod:`unbroken.worker`, the session's
exception hook writes this small JSON file next to the rank's heartbeat file
(:func:`exit_report_path`) before the interpreter prints the traceback and exits: the
exception's class, its message's first line, and a :class:`StepFailure` that says whether the
rank died of a collective (a peer gone, a link broken: an *echo* of another fault) or of
something of its own. The agent reads it when the process has exited and reports those facts as
data (:class:`unbroken.protocol.messages.RankExited`); nothing of the control plane reads the
failure's kind back out of a traceback's text. A script that does not use the worker API writes
no report; only then does the agent fall back to the traceback it finds in the rank's log.

Standard library only (the agent reads it without torch). The file is written whole under a
temporary name and renamed into place.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from unbroken.protocol.kinds import StepFailure
from unbroken.protocol.wire import integer, loads, optional_text, text

_SUFFIX = ".exit"
_MAX_BYTES = 16 * 1024

#: Phrases with which gloo/c10d word a collective that failed because of another rank or the
#: link to it. torch raises most of them as a plain ``RuntimeError`` (no ``DistError``
#: subclass), so the rank that caught one classifies it by them, once, where it happened.
COLLECTIVE_ERROR_MARKERS = (
    "Connection closed by peer",
    "Connection reset by peer",
    "Broken pipe",
    "Socket closed",
    "Connection refused",
    "connectFullMesh",
    "Timed out waiting",
    "Gloo",
    "ProcessGroupGloo",
    "DistBackendError",
    "DistNetworkError",
)


def is_collective_error_text(text: str) -> bool:
    """Whether an error's words (its last lines) are those of a failed collective."""
    last_lines = "\n".join(text.strip().splitlines()[-6:])
    return any(marker in last_lines for marker in COLLECTIVE_ERROR_MARKERS)


@dataclass(frozen=True)
class ExitReport:
    """Why the process ``pid`` is ending: ``exception`` is the class name (``ValueError``),
    ``failure`` :attr:`StepFailure.COLLECTIVE` when a collective failed under it."""

    pid: int
    exception: str
    message: str = ""
    failure: StepFailure = StepFailure.NONE
    device_code: str = ""  # the device error code the exception carried (``CUDA-710``)


def exit_report_path(heartbeat_path: Path | str) -> Path:
    """Where the rank whose heartbeat file is ``heartbeat_path`` writes its exit report."""
    path = Path(heartbeat_path)
    return path.with_name(path.name + _SUFFIX)


def write_exit_report(heartbeat_path: Path | str, report: ExitReport) -> None:
    """Write ``report`` atomically next to the heartbeat file. Raises ``OSError``."""
    path = exit_report_path(heartbeat_path)
    body = {
        "pid": report.pid,
        "exception": report.exception,
        "message": report.message[:2000],
        "failure": int(report.failure),
        "device_code": report.device_code,
    }
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(body))
    os.replace(tmp, path)


def read_exit_report(heartbeat_path: Path | str, pid: int) -> ExitReport | None:
    """The exit report of process ``pid`` next to the heartbeat file; None when there is none
    (the script does not use the worker API, or it exited without an exception), it is of
    another process (an earlier generation's), or it cannot be read as one."""
    what = "exit report"
    try:
        data = exit_report_path(heartbeat_path).read_bytes()[:_MAX_BYTES]
        body = loads(data, what)
        if body.get("pid") != pid:
            return None
        exception = text(body, "exception", what)
        if not exception:
            return None
        return ExitReport(
            pid=pid,
            exception=exception,
            message=optional_text(body, "message", what, _MAX_BYTES),
            failure=StepFailure(integer(body, "failure", what, 0, 1 << 16, default=0)),
            device_code=optional_text(body, "device_code", what, 32),
        )
    except (OSError, ValueError):  # ProtocolError, and a failure code StepFailure lacks
        return None


__all__ = [
    "COLLECTIVE_ERROR_MARKERS",
    "ExitReport",
    "exit_report_path",
    "is_collective_error_text",
    "read_exit_report",
    "write_exit_report",
]
