"""Run the ``unbroken`` CLI as a user does, and read what a run left behind, for the e2e tests.

Every command is a real subprocess (``python -m unbroken``) of this checkout: ``src/`` of the
repository is put first on ``PYTHONPATH``, so the tests exercise the code next to them whatever
an installed ``unbroken`` points at. Nothing here imports the package: what a run did is read
back through the CLI (``unbroken events --json``, ``unbroken status --json``) and from the files
the training script writes.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "e2e"
JOB = FIXTURES / "job.yaml"
TRAIN_SCRIPT = REPO / "examples" / "train_mlp.py"
RUN_TIMEOUT_S = 240.0  # one whole `unbroken run`, on two shared cores
#: The e2e jobs' stand-in for compute time per step: it decides how long a job trains, never
#: what it trains (the final model does not depend on it).
STEP_SLEEP = "--step-sleep=0.02"
#: For the tests that must act on a job while it still trains after an early step (a device
#: plugin's poll every 3 s, a command from another process): the job trains for longer.
SLOW_STEP_SLEEP = "--step-sleep=0.05"


@dataclass(frozen=True)
class Reference:
    """The fault-free run of the e2e job and its final model digest."""

    run_dir: Path
    digest: str


#: Where the runs of this test session share their node image (``UNBROKEN_SHARED_IMAGE``):
#: torch is imported once for all of them, not once per run (set by the session's fixture).
SHARED_IMAGE: Path | None = None


def cli_env() -> dict[str, str]:
    """This process's environment without any launcher's variables, with this checkout's
    package first on the path and one thread per torch process."""
    drop = (
        "UNBROKEN_",
        "TORCHELASTIC_",
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "MASTER_",
        "PYTEST_CURRENT_TEST",  # changes with every test: each run would get an image of its own
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    src = str(REPO / "src")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH", "")) if p)
    env.update({"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"})
    if SHARED_IMAGE is not None:
        env["UNBROKEN_SHARED_IMAGE"] = str(SHARED_IMAGE)
    return env


@dataclass(frozen=True)
class Result:
    argv: tuple[str, ...]
    rc: int
    stdout: str
    stderr: str

    def explain(self) -> str:
        return (
            f"$ unbroken {' '.join(self.argv)}\nexit {self.rc}\n--- stdout\n{self.stdout}"
            f"\n--- stderr\n{self.stderr}"
        )


def _stop(proc: subprocess.Popen[str]) -> tuple[str, str]:
    """Interrupt a command that ran past its time (``unbroken run`` then stops its processes),
    and kill it if it does not end."""
    proc.send_signal(signal.SIGINT)
    try:
        return proc.communicate(timeout=30.0)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.communicate()


def unbroken(*args: str | Path, cwd: Path | None = None, timeout_s: float = 60.0) -> Result:
    """Run ``unbroken ARGS`` to its end; a command that overruns fails the test."""
    argv = tuple(str(a) for a in args)
    proc = subprocess.Popen(
        [sys.executable, "-m", "unbroken", *argv],
        cwd=cwd,
        env=cli_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        out, err = _stop(proc)
        raise AssertionError(
            Result(argv, -1, out, err).explain()
            + f"\n(still running after {timeout_s:.0f} s)"
            + _log_tails(argv)
        ) from None
    return Result(argv, proc.returncode, out, err)


def _log_tails(argv: Sequence[str], lines: int = 6, width: int = 300) -> str:
    """The last lines of every log of the run directory in ``argv`` (``--run-dir D``): what
    each agent, rank and standby was doing when a command overran."""
    if "--run-dir" not in argv[:-1]:
        return ""
    run_dir = Path(argv[argv.index("--run-dir") + 1])
    parts = []
    for log in sorted(run_dir.rglob("*.log")):
        with contextlib.suppress(OSError):
            tail = log.read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"--- {log.relative_to(run_dir)}\n" + "\n".join(t[:width] for t in tail))
    return "\n" + "\n".join(parts) if parts else ""


def run_job(
    run_dir: Path,
    *extra: str | Path,
    job: Path = JOB,
    timeout_s: float = RUN_TIMEOUT_S,
) -> Result:
    """``unbroken run JOB --run-dir RUN_DIR --quiet EXTRA...`` to its end."""
    return unbroken("run", job, "--run-dir", run_dir, "--quiet", *extra, timeout_s=timeout_s)


def start_job(
    run_dir: Path, logs: Path, *extra: str | Path, job: Path = JOB, command: str = "run"
) -> Background:
    """``unbroken run`` (or ``command``: ``serve``) in the background, its output in files under
    ``logs``."""
    logs.mkdir(parents=True, exist_ok=True)
    argv = tuple(str(a) for a in (command, job, "--run-dir", run_dir, *extra))
    out = (logs / "stdout").open("w")
    err = (logs / "stderr").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "unbroken", *argv],
        env=cli_env(),
        stdin=subprocess.DEVNULL,
        stdout=out,
        stderr=err,
        text=True,
    )
    out.close()
    err.close()
    return Background(argv, proc, logs)


@dataclass
class Background:
    argv: tuple[str, ...]
    proc: subprocess.Popen[str]
    logs: Path

    def output(self) -> tuple[str, str]:
        return (self.logs / "stdout").read_text(), (self.logs / "stderr").read_text()

    def wait(self, timeout_s: float = RUN_TIMEOUT_S) -> Result:
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.stop()
            out, err = self.output()
            raise AssertionError(
                Result(self.argv, -1, out, err).explain()
                + f"\n(still running after {timeout_s:.0f} s)"
            ) from None
        out, err = self.output()
        return Result(self.argv, self.proc.returncode, out, err)

    def stop(self) -> None:
        if self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=30.0)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def wait_for(
    predicate: Callable[[], bool],
    what: str,
    deadline_s: float,
    context: Callable[[], str] | None = None,
) -> None:
    """Poll ``predicate`` until it holds; fail naming ``what`` at the deadline, with what
    ``context`` then says (a run's last lines, say)."""
    deadline = time.monotonic() + deadline_s
    while not predicate():
        if time.monotonic() > deadline:
            said = f"\n{context()}" if context is not None else ""
            raise AssertionError(f"{what}: not seen within {deadline_s:.0f} s{said}")
        time.sleep(0.2)


# ---- what a run left behind ---------------------------------------------------------------


def events(run_dir: Path) -> list[dict[str, Any]]:
    """The run's ledger, oldest first (``unbroken events RUN --json``)."""
    res = unbroken("events", run_dir, "--json")
    assert res.rc == 0, res.explain()
    return [json.loads(line) for line in res.stdout.splitlines() if line.strip()]


def of_kind(evs: Iterable[Mapping[str, Any]], kind: str, /, **fields: Any) -> list[dict[str, Any]]:
    """The events of ``kind`` whose fields equal ``fields``."""
    return [
        dict(e) for e in evs if e["kind"] == kind and all(e.get(k) == v for k, v in fields.items())
    ]


def status(run_dir: Path) -> dict[str, Any] | None:
    """``unbroken status RUN --json``; None while the run has no status yet."""
    res = unbroken("status", run_dir, "--json")
    if res.rc != 0:
        return None
    data: dict[str, Any] = json.loads(res.stdout)
    return data


def digest(run_dir: Path) -> str:
    """The final model digest rank 0 wrote (the job's ``--result=result.json``)."""
    result = json.loads((run_dir / "result.json").read_text())
    value: str = result["digest"]
    return value


def replica_specs(job: Path) -> str:
    """The job's ``spec:`` (what every pod runs: the launcher, the script and its arguments),
    as written: two jobs whose specs are equal train the same model, whatever their metadata
    (name, labels, annotations: how faults are handled)."""
    text = job.read_text()
    at = text.index("\nspec:\n")
    return text[at:]


def write_job(
    path: Path,
    *,
    replace: Mapping[str, str] = {},
    script: str | Path = TRAIN_SCRIPT,
    job: Path = JOB,
) -> Path:
    """A variant of the e2e job (or of another e2e ``job``) at ``path``: each ``replace`` key
    becomes its value, and the training script is ``script`` (the fixture names it relative to
    the fixture's folder)."""
    text = job.read_text().replace("../../../examples/train_mlp.py", str(script))
    for old, new in replace.items():
        assert old in text, f"{old!r} is not in {job}"
        text = text.replace(old, new)
    path.write_text(text)
    return path


# ---- processes -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Proc:
    pid: int
    cmdline: str
    why: str


def processes_of(path: Path) -> list[Proc]:
    """Live processes that name ``path`` in their command line or environment, or run in it."""
    needle = str(path)
    found: list[Proc] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            environ = (entry / "environ").read_bytes()
            cwd = os.readlink(entry / "cwd")
        except OSError:  # gone, a zombie, or not ours to read
            continue
        if needle in cmdline:
            why = "command line"
        elif cwd == needle or cwd.startswith(needle + os.sep):
            why = "working directory"
        elif needle.encode() in environ:
            why = "environment"
        else:
            continue
        found.append(Proc(int(entry.name), cmdline.strip(), why))
    return found


def assert_no_processes_left(path: Path, deadline_s: float = 15.0) -> None:
    """No process of the run under ``path`` outlives it. Stragglers are reported, then killed
    by pid (every one of them was started by this test's run)."""
    deadline = time.monotonic() + deadline_s
    left = processes_of(path)
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = processes_of(path)
    for p in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p.pid, signal.SIGKILL)
    assert not left, f"processes of the run in {path} left behind:\n" + "\n".join(
        f"  pid {p.pid} ({p.why}): {p.cmdline[:300]}" for p in left
    )


def kinds_in_order(evs: Sequence[Mapping[str, Any]], wanted: Sequence[str]) -> list[int]:
    """Indexes in ``evs`` of the first ``wanted[0]``, then the next ``wanted[1]`` after it, ...;
    fails naming the first kind not found after its predecessors."""
    at: list[int] = []
    start = 0
    for kind in wanted:
        idx = next((i for i in range(start, len(evs)) if evs[i]["kind"] == kind), None)
        assert idx is not None, (
            f"no {kind} after {' -> '.join(wanted[: len(at)]) or 'the start'}; events: "
            + ", ".join(str(e["kind"]) for e in evs)
        )
        at.append(idx)
        start = idx + 1
    return at
