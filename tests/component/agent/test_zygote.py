"""The zygote and the agent's side of it: ranks forked from one zygote (torch imported once)
are the agent's children, with the order's session, environment, directory and log, and their
exit status is seen as a started process's would be. A real zygote imports torch once for the
module; the ranks are tiny scripts. Fake zygotes (no torch) stand in for one that never
answers or dies before forking.

This test process becomes a child subreaper, as an agent does."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import cast

import pytest

from unbroken.agent.children import become_subreaper
from unbroken.agent.ranks import RankExit, RankProcess, Zygote, _Spawn, rank_argv, start_zygote

pytestmark = pytest.mark.component

READY_S = 180.0  # a torch import on a loaded two-core machine

RANK = textwrap.dedent(
    """
    import json, os, random, signal, sys, time
    import torch

    mode, out = sys.argv[1], sys.argv[2]
    print("rank says hello", mode, flush=True)
    seen = {
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "sid": os.getsid(0),
        "cwd": os.getcwd(),
        "env": dict(os.environ),
        "argv": sys.argv,
        "name": __name__,
        "path0": sys.path[0],
        "stdin": sys.stdin.read(),
        "random": random.getrandbits(64),
        "torch_random": int(torch.randint(0, 2**62, (1,)).item()),
        "sigint": repr(signal.getsignal(signal.SIGINT)),
        "sigterm": repr(signal.getsignal(signal.SIGTERM)),
        "blocked": sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])),
        "threads": torch.get_num_threads(),
    }
    with open(out, "w") as f:
        json.dump(seen, f)
    if mode == "raise":
        raise ValueError("bad batch")
    if mode == "sleep":
        time.sleep(120)
    """
)


COLD = "import signal; print(repr(signal.getsignal(2))); print(repr(signal.getsignal(15)))"


@pytest.fixture(scope="module")
def zygote(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Zygote, Path]]:
    assert become_subreaper()
    log = tmp_path_factory.mktemp("zygote") / "standby.log"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    z = start_zygote(env, log)
    assert z is not None
    yield z, log
    z.close()
    assert z.proc.returncode == 0, log.read_text()


def _rank(
    tmp_path: Path, zygote: Zygote | None, mode: str, exits: queue.Queue[RankExit], **env: str
) -> RankProcess:
    script = tmp_path / "train.py"
    script.write_text(RANK)
    out = tmp_path / f"{mode}.json"
    return RankProcess(
        rank=3,
        local_rank=1,
        generation=0,
        argv=rank_argv(str(script), (mode, str(out)), module=False, no_python=False),
        env={"PATH": os.environ.get("PATH", ""), "FOO": "bar", **env},
        log_path=tmp_path / "logs" / f"{mode}.log",
        on_exit=exits.put,
        zygote=zygote,
    )


def _seen(tmp_path: Path, mode: str) -> dict[str, object]:
    path = tmp_path / f"{mode}.json"
    deadline = time.monotonic() + 30.0
    while time.monotonic() < deadline:
        if path.exists() and path.stat().st_size:
            return dict(json.loads(path.read_text()))
        time.sleep(0.05)
    raise AssertionError(f"the rank wrote no {path.name}")


def test_ranks_forked_from_one_zygote(
    zygote: tuple[Zygote, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    z, log = zygote
    monkeypatch.chdir(tmp_path)
    exits: queue.Queue[RankExit] = queue.Queue()
    # Ordered while the zygote may still import: served once it is ready.
    ok = _rank(tmp_path, z, "ok", exits, OMP_NUM_THREADS="2")
    assert z.wait_ready(READY_S), log.read_text()
    ex = exits.get(timeout=60)
    assert (ex.returncode, ex.pid, ex.rank) == (0, ok.pid, 3)
    assert not ok.alive and ok.wait(0)
    seen = _seen(tmp_path, "ok")
    assert seen["pid"] == ok.pid != z.pid
    assert seen["ppid"] == os.getpid()  # the agent's child, not the zygote's
    assert seen["sid"] == ok.pid  # a session of its own
    assert seen["cwd"] == str(tmp_path)
    env = seen["env"]
    assert isinstance(env, dict)
    assert env["FOO"] == "bar" and "HOME" not in env
    assert seen["argv"] == [str(tmp_path / "train.py"), "ok", str(tmp_path / "ok.json")]
    assert seen["name"] == "__main__" and seen["path0"] == str(tmp_path)
    assert seen["stdin"] == ""
    # The dispositions a cold rank started by this process gets (a signal this process
    # ignores stays ignored across exec: the zygote, started by it too, passes that on alike).
    cold = subprocess.run(
        [sys.executable, "-c", COLD],
        capture_output=True,
        text=True,
        check=True,
        start_new_session=True,
    ).stdout.splitlines()
    assert [seen["sigint"], seen["sigterm"]] == cold, log.read_text()
    assert seen["blocked"] == []
    assert seen["threads"] == 2
    assert "rank says hello ok" in ok.log_path.read_text()

    # A second and third order: the same zygote, no second import.
    raised = _rank(tmp_path, z, "raise", exits)
    ex = exits.get(timeout=60)
    assert (ex.returncode, ex.pid) == (1, raised.pid)
    assert ex.traceback.endswith("ValueError: bad batch"), ex.traceback
    sleeper = _rank(tmp_path, z, "sleep", exits)
    seen_sleep = _seen(tmp_path, "sleep")
    assert sleeper.alive
    sleeper.kill()
    ex = exits.get(timeout=30)
    assert (ex.returncode, ex.pid, ex.signal_name) == (-9, sleeper.pid, "SIGKILL")
    assert not sleeper.alive

    text = log.read_text()
    assert text.count(f"standby {z.pid} ready") == 1, text
    for proc in (ok, raised, sleeper):
        assert f"standby {z.pid} forked rank process {proc.pid}" in text, text
    assert z.alive
    # Each rank seeds Python's and torch's generators anew.
    seen_raise = _seen(tmp_path, "raise")
    assert len({s["random"] for s in (seen, seen_raise, seen_sleep)}) == 3
    assert len({s["torch_random"] for s in (seen, seen_raise, seen_sleep)}) == 3


FAKE_ZYGOTE = textwrap.dedent(
    """
    import os, sys, time
    fd = int(sys.argv[1])
    os.write(fd, b"ready\\n")
    sys.stdin.readline()
    if sys.argv[2] == "die":
        sys.exit(3)
    time.sleep(120)
    """
)


def _fake(behaviour: str) -> Zygote:
    assert become_subreaper()
    replies, end = os.pipe()
    proc = subprocess.Popen(
        [sys.executable, "-c", FAKE_ZYGOTE, str(end), behaviour],
        stdin=subprocess.PIPE,
        pass_fds=(end,),
        start_new_session=True,
    )
    os.close(end)
    return Zygote(proc, replies)


def test_a_pending_rank_that_is_killed_never_runs(tmp_path: Path) -> None:
    z = _fake("hang")
    exits: queue.Queue[RankExit] = queue.Queue()
    proc = _rank(tmp_path, z, "never", exits)
    assert proc.pending and proc.pid == 0 and proc.alive
    proc.kill()
    ex = exits.get(timeout=5)
    assert (ex.returncode, ex.pid) == (-9, 0)
    assert not proc.alive and not proc.pending and proc.wait(0)
    z.close()
    assert z.proc.returncode == -signal.SIGKILL  # it had an order left: killed
    assert not (tmp_path / "never.json").exists()


class _SaidButNotTaken(_Spawn):
    """A spawn whose pid the zygote has said while the rank's watcher thread has not taken
    it yet (held in ``wait`` until ``go`` is set)."""

    def __init__(self, pid: int) -> None:
        super().__init__()
        self.go = threading.Event()
        self.resolve(pid)

    def wait(self) -> int | None:
        self.go.wait(30)
        return super().wait()


class _Ordered:
    """A zygote that has forked the order's process already: ``order`` returns its spawn."""

    alive = True

    def __init__(self, spawn: _Spawn) -> None:
        self.spawn = spawn

    def order(self, order: Mapping[str, object]) -> _Spawn:
        return self.spawn


def test_a_signal_after_the_pid_was_said_reaches_the_process(tmp_path: Path) -> None:
    """The zygote said the rank's pid but the watcher thread has not taken it yet: the rank
    is not pending, a kill reaches its process and its exit names its pid."""
    assert become_subreaper()
    child = subprocess.Popen(["sleep", "60"], start_new_session=True)
    spawn = _SaidButNotTaken(child.pid)
    exits: queue.Queue[RankExit] = queue.Queue()
    proc = _rank(tmp_path, cast(Zygote, _Ordered(spawn)), "said", exits)
    assert not proc.pending and proc.pid == child.pid
    proc.kill()
    spawn.go.set()
    ex = exits.get(timeout=30)
    assert (ex.returncode, ex.pid, ex.signal_name) == (-9, child.pid, "SIGKILL")
    assert not proc.alive


def test_a_rank_starts_anew_when_its_zygote_dies(tmp_path: Path) -> None:
    z = _fake("die")
    exits: queue.Queue[RankExit] = queue.Queue()
    proc = _rank(tmp_path, z, "cold", exits)
    ex = exits.get(timeout=60)
    assert ex.returncode == 0 and ex.pid == proc.pid > 0
    assert _seen(tmp_path, "cold")["sid"] == proc.pid
    z.close()
    assert z.proc.returncode == 3 and not z.alive


_TRACE_CUDA = """
import sys
from unbroken.agent import standby

called = []

def profile(frame, event, arg):
    if event == "call" and frame.f_code.co_filename.endswith("torch/cuda/__init__.py"):
        if frame.f_code.co_name in standby.CUDA_DRIVER_CALLS:
            called.append(frame.f_code.co_name)

sys.setprofile(profile)
standby.warm_imports()
sys.setprofile(None)
print("called:" + ",".join(called))
"""


def test_a_zygote_s_imports_never_reach_the_cuda_driver() -> None:
    """Whatever a zygote (or the node image) imports, no function that starts CUDA, counts its
    devices or picks one runs there: its forked ranks could not use a GPU after it."""
    out = subprocess.run(
        [sys.executable, "-c", _TRACE_CUDA],
        capture_output=True,
        text=True,
        timeout=READY_S,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "called:", out.stdout


def test_a_zygote_whose_cuda_was_started_refuses_to_fork() -> None:
    script = (
        "import torch\nfrom unbroken.agent import standby\n"
        "torch.cuda.is_initialized = lambda: True\nstandby.cuda_untouched()\nprint('forked')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=READY_S
    )
    assert out.returncode == 3 and "forked" not in out.stdout, (out.stdout, out.stderr)
    assert "CUDA was initialised before the ranks were forked" in out.stderr
