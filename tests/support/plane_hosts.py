"""``unbroken serve`` on the root namespace's plane-B address with two namespace hosts joined
to it, each declaring planes a and b (:func:`served`): the link-failover tests' setting."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.support.cli_runs import RUN_TIMEOUT_S, cli_env, wait_for
from tests.support.netns_hosts import PLANE_IFNAMES, Hosts


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _kill_host(h: Hosts, i: int) -> None:
    pids = subprocess.run(["ip", "netns", "pids", h.ns(i)], capture_output=True, text=True)
    for pid in pids.stdout.split():
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)


def _join(h: Hosts, i: int, control: str, token: Path) -> subprocess.Popen[str]:
    a, b = PLANE_IFNAMES
    argv = [sys.executable, "-m", "unbroken", "launch", "--join", control]
    argv += ["--token-file", str(token), "--node", f"node-{i}"]
    argv += ["--plane", f"a={a}", "--plane", f"b={b}"]
    return subprocess.Popen(
        h.argv(i, argv), env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


@dataclass
class Served:
    """``unbroken serve`` on the root namespace's plane-B address, and the two hosts' agents
    joined to it, each declaring planes a and b."""

    serve: subprocess.Popen[str]
    lines: list[str]
    agents: list[subprocess.Popen[str]]
    reader: threading.Thread | None = None

    def said(self, text: str, times: int = 1) -> bool:
        return sum(text in line for line in list(self.lines)) >= times

    def wait_said(self, text: str, what: str, times: int = 1, deadline_s: float = 60.0) -> None:
        """Wait until the run has said ``text`` ``times`` times; fail showing its last lines
        (at once if the run has ended without saying it)."""
        wait_for(
            lambda: self.said(text, times) or self.serve.poll() is not None,
            what,
            deadline_s,
            self.tail,
        )
        if not self.said(text, times) and self.reader is not None:
            self.reader.join(timeout=10)  # the run ended: its last lines read
        assert self.said(text, times), f"{what}: the run ended without it\n{self.tail()}"

    def tail(self, n: int = 40) -> str:
        """The run's last ``n`` lines of output, and its agents' when they have ended."""
        return "".join(list(self.lines)[-n:])

    def finish(self) -> str:
        """Wait for the run's end; its standard output (it must have exited 0)."""
        self.serve.wait(timeout=RUN_TIMEOUT_S)
        err = self.serve.stderr.read() if self.serve.stderr else ""
        out = "".join(self.lines)
        assert self.serve.returncode == 0, (out, err)
        for a in self.agents:
            a.wait(timeout=30)
            assert a.returncode == 0, a.communicate()
        return out


@contextlib.contextmanager
def served(h: Hosts, tmp_path: Path, run_dir: Path, job: Path) -> Iterator[Served]:
    token = tmp_path / "token"
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text("nodes: 2\ndevicesPerNode: 2\n")
    control = f"{h.root_address(1)}:{_free_port()}"
    argv = [sys.executable, "-m", "unbroken", "serve", str(job), "--cluster", str(cluster)]
    argv += ["--listen", control, "--token-file", str(token), "--run-dir", str(run_dir)]
    serve = subprocess.Popen(
        argv, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path
    )
    run = Served(serve, [], [])
    assert serve.stdout is not None
    reader = threading.Thread(target=lambda: run.lines.extend(serve.stdout or ()), daemon=True)
    run.reader = reader
    reader.start()
    try:
        wait_for(lambda: (run_dir / "control.json").exists(), "the control plane", 60.0)
        run.agents.extend(_join(h, i, control, token) for i in range(2))
        ckpt = run_dir / "checkpoints"
        wait_for(lambda: ckpt.is_dir() and any(ckpt.iterdir()), "a checkpoint", 120.0)
        yield run
    finally:
        for proc in (serve, *run.agents):
            if proc.poll() is None:
                proc.kill()
        serve.wait()
        reader.join(timeout=10)
        for a in run.agents:
            a.communicate()
        for i in range(2):
            _kill_host(h, i)
