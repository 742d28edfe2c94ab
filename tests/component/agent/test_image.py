"""The node image: agents forked from one process that imported torch, each with its zygote
forked from itself before its code runs. A real image (one torch import for the module) forks
tiny agent modules; one of them takes its zygote over and has it fork a rank.

This test process becomes a child subreaper, as an agent does (the rank's parent is the agent
that ordered it, so this process only sees the agents, as the job manager does)."""

from __future__ import annotations

import json
import os
import socket
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from unbroken.agent.image import Image, _fork_for

pytestmark = pytest.mark.component

READY_S = 180.0  # a torch import on a loaded two-core machine

AGENT = textwrap.dedent(
    """
    import atexit, json, os, queue, sys, threading, time
    from pathlib import Path
    from unbroken.agent import ranks

    mode, out, zlog = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    print("agent says hello", mode, flush=True)
    seen = {
        "pid": os.getpid(), "sid": os.getsid(0), "cwd": os.getcwd(), "argv": sys.argv,
        "name": __name__, "foo": os.environ.get("FOO"), "stdin": sys.stdin.read(),
        "threads": threading.active_count(),
    }
    if mode == "zygote":
        z = ranks.start_zygote(dict(os.environ), zlog)
        seen["zygote_ready_at_once"] = z is not None and z.wait_ready(5.0)
        seen["zygote_pid"] = z.pid if z is not None else None
        script = out.with_name("rank.py")
        script.write_text(
            "import os, sys, torch\\n"
            "open(sys.argv[1], 'w').write(f'{os.getpid()} {os.getppid()}')\\n"
        )
        exits = queue.Queue()
        rank = ranks.RankProcess(
            rank=0, local_rank=0, generation=0,
            argv=ranks.rank_argv(str(script), (str(out.with_name("rank.txt")),), False, False),
            env={"PATH": os.environ.get("PATH", "")}, log_path=out.with_name("rank.log"),
            on_exit=exits.put, zygote=z,
        )
        ex = exits.get(timeout=60)
        seen["rank"] = [ex.returncode, rank.pid]
        z.close()
    out.write_text(json.dumps(seen))
    if mode == "exit3":
        sys.exit(3)
    if mode == "raise":
        raise ValueError("bad order")
    if mode == "linger":
        def late():
            time.sleep(0.3)
            out.with_name("late.txt").write_text("thread")
        threading.Thread(target=late).start()
        atexit.register(lambda: out.with_name("atexit.txt").write_text("handler"))
    """
)


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Image, Path]]:
    home = tmp_path_factory.mktemp("image")
    (home / "imgagent.py").write_text(AGENT)
    src = str(Path(__file__).resolve().parents[3] / "src")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": f"{home}{os.pathsep}{src}"}
    img = Image.start(env, home, home / "image.log")
    yield img, home
    img.close()
    assert img.proc.returncode == 0, (home / "image.log").read_text()


def _launch(image: Image, tmp_path: Path, mode: str, stdin: bytes = b"") -> tuple[int, Path]:
    r, w = os.pipe()
    os.write(w, stdin)
    os.close(w)
    log = tmp_path / f"{mode}.log"
    with log.open("ab") as out:
        pid = image.launch(
            module="imgagent",
            argv=[mode, str(tmp_path / f"{mode}.json"), str(tmp_path / "z" / "standby.log")],
            env={"PATH": os.environ.get("PATH", ""), "FOO": "bar", "OMP_NUM_THREADS": "1"},
            cwd=tmp_path,
            out=out.fileno(),
            stdin=r,
            zygote_log=tmp_path / "z" / "standby.log",
            ready_timeout_s=READY_S,
        )
    os.close(r)
    assert pid is not None, (tmp_path.parent / "image.log").read_text()
    return pid, log


def test_an_agent_forked_from_the_image_takes_its_warm_zygote(
    image: tuple[Image, Path], tmp_path: Path
) -> None:
    img, _ = image
    pid, log = _launch(img, tmp_path, "zygote", stdin=b"order")
    agent = img.child(pid)
    assert agent.wait(120) == 0, log.read_text()
    seen = json.loads((tmp_path / "zygote.json").read_text())
    assert seen["pid"] == pid and seen["sid"] == pid  # a session of its own
    assert seen["cwd"] == str(tmp_path) and seen["foo"] == "bar"
    assert seen["name"] == "__main__" and seen["argv"][0].endswith("imgagent.py")
    assert seen["stdin"] == "order"
    assert seen["threads"] == 3  # its main thread, and its zygote's order and reply threads
    # The zygote was forked with the agent: ready at once, no import of its own.
    assert seen["zygote_ready_at_once"], (tmp_path / "z" / "standby.log").read_text()
    zlog = (tmp_path / "z" / "standby.log").read_text()
    assert f"standby {seen['zygote_pid']} ready: a zygote (imports took 0.00 s)" in zlog
    code, rank_pid = seen["rank"]
    assert code == 0, (tmp_path / "rank.log").read_text()
    assert (tmp_path / "rank.txt").read_text() == f"{rank_pid} {pid}"  # the agent's child
    assert "agent says hello zygote" in log.read_text()


@pytest.mark.parametrize(("mode", "code"), [("exit3", 3), ("raise", 1), ("linger", 0)])
def test_an_agent_exits_as_the_interpreter_would(
    image: tuple[Image, Path], tmp_path: Path, mode: str, code: int
) -> None:
    img, _ = image
    pid, log = _launch(img, tmp_path, mode)
    agent = img.child(pid)
    assert agent.wait(60) == code, log.read_text()
    assert agent.poll() == code
    if mode == "raise":
        assert log.read_text().rstrip().endswith("ValueError: bad order"), log.read_text()
    if mode == "linger":  # its threads joined and its exit handlers run first
        assert (tmp_path / "late.txt").read_text() == "thread"
        assert (tmp_path / "atexit.txt").read_text() == "handler"


def test_a_bad_request_is_refused_without_a_fork(tmp_path: Path) -> None:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    fds = list(os.pipe())
    try:
        assert _fork_for(b"[1, 2]", fds, a, {}).startswith("error a request is a JSON object")
        assert _fork_for(b'{"module": "m"}', fds, a, {}) == "error the request has no 'argv'"
        assert _fork_for(b"{", fds, a, {}).startswith("error ")
        assert _fork_for(b"{}", fds[:1], a, {}).startswith("error a request is a JSON object")
    finally:
        for fd in fds:
            os.close(fd)
        a.close()
        b.close()


def test_runs_share_one_image_that_ends_after_its_last_run(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "imgagent.py").write_text(AGENT)
    src = str(Path(__file__).resolve().parents[3] / "src")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": f"{home}{os.pathsep}{src}"}
    shared = tmp_path / "images"
    first = Image.shared(shared, env, linger_s=1.0)
    assert first is not None and first.proc is None  # not this process's to end
    (pidfile,) = shared.glob("*.pid")
    pid, log = _launch(first, tmp_path, "exit3")
    assert first.child(pid).wait(READY_S) == 3, log.read_text()
    first.close()
    # The next run finds the same image, warm: its agents come from the same process.
    second = Image.shared(shared, env, linger_s=1.0)
    assert second is not None
    image_pid = int(pidfile.read_text())
    pid, log = _launch(second, tmp_path, "linger")
    assert second.child(pid).wait(60) == 0, log.read_text()
    assert int(pidfile.read_text()) == image_pid
    second.close()
    # Nobody uses it: it ends after its linger time, and takes its socket and pid file along.
    deadline = time.monotonic() + 30.0
    while time.monotonic() < deadline and list(shared.glob("*.sock")):
        time.sleep(0.1)
    assert not list(shared.glob("*.sock")) and not list(shared.glob("*.pid"))
    assert "ready" in next(shared.glob("*.log")).read_text()


def test_a_shared_image_is_refused_in_a_directory_others_can_reach(tmp_path: Path) -> None:
    shared = tmp_path / "open"
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)
    assert Image.shared(shared, dict(os.environ)) is None
    assert not list(shared.iterdir())


def test_a_store_keeper_hosts_the_store_on_loopback_until_let_go(
    image: tuple[Image, Path],
) -> None:
    """The manager's rendezvous store is hosted by a keeper forked from the image (the manager
    imports no torch): it listens on the address asked for, a second store on its port is
    refused with the reason, and letting it go ends the keeper and frees the port. Every e2e
    run's ranks rendezvous through one; the stress tests' ranks write their results to one,
    which the manager reads through the keeper."""
    img, _ = image
    keeper = img.host_store("127.0.0.1", 0, ready_timeout_s=READY_S)
    assert keeper is not None
    with socket.create_connection(("127.0.0.1", keeper.port), timeout=5.0):
        pass
    assert keeper.check(["nobody-set-this"]) is False
    with pytest.raises(RuntimeError, match="'nobody-set-this' is not set"):
        keeper.get("nobody-set-this")  # answered at once: a keeper never waits for a key
    with pytest.raises(OSError, match="in use"):
        img.host_store("127.0.0.1", keeper.port)
    keeper.close()
    deadline = time.monotonic() + 60.0  # the keeper, then the image, scheduled on loaded cores
    while time.monotonic() < deadline and _alive(keeper.pid):
        time.sleep(0.02)
    assert not _alive(keeper.pid), f"the keeper {keeper.pid} outlived its socket"
    again = img.host_store("127.0.0.1", keeper.port)  # the port is free again
    assert again is not None and again.port == keeper.port
    again.close()


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def test_a_request_whose_reply_follows_a_childs_exit_is_answered() -> None:
    """The image reports a child's exit just before it replies to a request (a keeper that
    ended as the manager asked for another): the manager's reader files the exit and hands
    the reply on, so the request returns. (With one lock for requests and children, the
    reader waited for the request and the request for the reader: a hang.)"""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    img = Image(None, ours)
    theirs.sendall(b"ready")
    found: list[object] = []
    asking = threading.Thread(
        target=lambda: found.append(img.host_store("127.0.0.1", 0, ready_timeout_s=5.0))
    )
    asking.start()
    try:
        _, fds, _, _ = socket.recv_fds(theirs, 4096, 1)
        theirs.sendall(b"exit 999999 0")  # an earlier child's exit, before the reply
        theirs.sendall(b"pid 999998")
        with socket.socket(fileno=fds[0]) as report:
            report.sendall(b"port 29999")
        asking.join(10.0)
        assert not asking.is_alive(), "the request hung on the exit that came before its reply"
        (keeper,) = found
        assert keeper is not None and getattr(keeper, "port", None) == 29999, found
    finally:
        theirs.close()
        asking.join(10.0)
        img.close()
