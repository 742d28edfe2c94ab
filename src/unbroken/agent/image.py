"""A node's image: one process with torch imported, from which the node's agents are forked.

Every agent keeps a zygote (:mod:`unbroken.agent.standby`) that imports torch once for its
ranks: a few CPU seconds. In the embedded cluster every node's agents run on one machine, and
at a job's start each pod's agent and each spare's imported torch at the same time, on the
same cores (three imports on two cores were most of a small job's start). The image imports it
once. Each agent is forked from it and, before the agent's code runs (the process has one
thread then), forks its zygote from itself: the zygote is warm from its first moment, and a
replacement pod's agent starts in milliseconds.

The image is started by the job manager (:class:`Image`) with one end of a Unix socket pair
(``--socket-fd``; ``SOCK_SEQPACKET``: one message per request or reply). It imports, says
``ready``, then serves requests until the manager's end closes. A request is a JSON object
``{"module", "argv", "env", "cwd", "zygote_log"}`` with two file descriptors, the agent's stdin
and its stdout (stderr goes there too). The image forks the agent and replies ``pid N`` (or
``error ...``); when an agent exits, the image reaps it and says ``exit N CODE``.

A request ``{"store": {"host", "port"}}`` with one descriptor, a socket, forks a *store keeper*
instead: a process that hosts one rendezvous ``TCPStore`` (:func:`unbroken.rpc.store.host_store`),
says ``port N`` (or ``error ...``) on that socket, and exits when its other end closes
(:class:`StoreKeeper`). The manager's store is the only torch it would need; hosted here, the
manager imports none (3 CPU-s of every run).

The agent is the image's child, in a session of its own, with the signal dispositions the
interpreter starts with, the request's environment and working directory, and runs ``module``
as ``__main__`` with ``argv`` (``runpy``), as ``python -m module argv`` would. Its zygote logs
to ``zygote_log``; the agent takes it over when it starts a zygote logging there
(:func:`unbroken.agent.ranks.start_zygote`), and lets it go otherwise. Standard library and
torch only; the manager's side imports no torch.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import logging
import os
import runpy
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any, NoReturn

from unbroken.agent.children import OwnChild, become_subreaper, pid_exists
from unbroken.agent.ranks import prestarted

log = logging.getLogger(__name__)

_MAX_MESSAGE = 1 << 20
_KEEPER_ANSWER_S = 30.0  # a keeper answers from memory; this long only on a stalled machine
#: Descriptors the image holds besides its socket: an agent forked from it closes them.
_held: set[int] = set()


# ---- agents forked by the image ----------------------------------------------------------


class ImageChild(OwnChild):
    """An agent forked by the image: the image is its parent, and says when it exits."""

    def __init__(self, pid: int, image: Image, stdin: IO[bytes] | None = None) -> None:
        super().__init__(pid, stdin)
        self._image = image
        self._exited = threading.Event()

    def exited(self, code: int) -> None:
        self.returncode = code
        self._exited.set()

    def poll(self) -> int | None:
        if self.returncode is None and self._image.gone and not pid_exists(self.pid):
            self.exited(-1)  # the image died first: the exit was not seen
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(str(self.pid), timeout or 0.0)
            self._exited.wait(0.05 if left is None else min(left, 0.05))
        return code


def _spawn(
    args: list[str],
    env: Mapping[str, str],
    cwd: Path,
    log_path: Path,
    pass_fds: tuple[int, ...] = (),
) -> subprocess.Popen[bytes]:
    """Start an image process (``python -m unbroken.agent.image args``) in a session of its
    own, logging to ``log_path``."""
    with log_path.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-u", "-m", "unbroken.agent.image", *args],
            env=dict(env),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            pass_fds=pass_fds,
        )


def _connect(path: Path) -> socket.socket | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        sock.connect(str(path))
    except OSError:
        sock.close()
        return None
    return sock


# ---- the manager's side -----------------------------------------------------------------


class Image:
    """The job manager's handle on a node image: :meth:`launch` forks an agent from it."""

    def __init__(self, proc: subprocess.Popen[bytes] | None, sock: socket.socket) -> None:
        self.proc = proc  # None: a shared image, not this process's to end
        self._sock = sock
        self._lock = threading.Lock()  # one request at a time: its send, then its reply
        self._ready = threading.Event()
        self._replies: list[str] = []
        self._replied = threading.Condition()
        # Not the request lock: the reader files an exit while a request waits for its reply
        # (one lock for both hung a request whose reply came after a child's exit).
        self._children_lock = threading.Lock()
        self._children: dict[int, ImageChild] = {}
        self._exits: dict[int, int] = {}  # exits heard before the child was registered
        self.gone = False
        threading.Thread(target=self._read, name="image-replies", daemon=True).start()

    @classmethod
    def start(cls, env: Mapping[str, str], cwd: Path, log_path: Path) -> Image:
        """Start an image that imports with ``env`` and logs to ``log_path``."""
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = theirs.fileno()
            proc = _spawn(["--socket-fd", str(fd)], env, cwd, log_path, pass_fds=(fd,))
        except OSError:
            mine.close()
            raise
        finally:
            theirs.close()
        return cls(proc, mine)

    @classmethod
    def shared(
        cls, directory: Path, env: Mapping[str, str], linger_s: float = 120.0
    ) -> Image | None:
        """The image in ``directory`` (``UNBROKEN_SHARED_IMAGE``) that imported torch with
        ``env``, started there if none runs: runs one after another on this machine share it,
        and it ends ``linger_s`` after its last run. None where the directory is not this
        user's alone (anyone who reaches the image runs code as its user)."""
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = directory.stat()
        if st.st_uid != os.getuid() or st.st_mode & 0o077:
            log.warning(
                "%s is not private to this user (mode %o): no shared node image",
                directory,
                st.st_mode & 0o777,
            )
            return None
        digest = hashlib.sha256(
            json.dumps([sys.executable, sorted(env.items())]).encode()
        ).hexdigest()
        path = directory / f"image-{digest[:16]}.sock"
        sock = _connect(path)
        if sock is None:
            proc = _spawn(
                ["--listen", str(path), "--linger", str(linger_s)],
                env,
                directory,
                path.with_suffix(".log"),
            )
            deadline = time.monotonic() + 30.0
            while sock is None and time.monotonic() < deadline:
                time.sleep(0.01)
                sock = _connect(path)
                if sock is None and proc.poll() is not None:
                    sock = _connect(path)  # another run's image took the path first
                    break
        return None if sock is None else cls(None, sock)

    def _read(self) -> None:
        while True:
            try:
                data = self._sock.recv(_MAX_MESSAGE)
            except OSError:
                data = b""
            if not data:
                break
            text = data.decode(errors="replace")
            if text == "ready":
                self._ready.set()
            elif text.startswith("exit "):
                _, pid, code = text.split()
                with self._children_lock:
                    child = self._children.pop(int(pid), None)
                    if child is None:
                        self._exits[int(pid)] = int(code)
                if child is not None:
                    child.exited(int(code))
            else:
                with self._replied:
                    self._replies.append(text)
                    self._replied.notify_all()
        self.gone = True
        self._ready.set()
        with self._replied:
            self._replied.notify_all()

    def launch(
        self,
        *,
        module: str,
        argv: Sequence[str],
        env: Mapping[str, str],
        cwd: Path,
        out: int,
        stdin: int,
        zygote_log: Path,
        ready_timeout_s: float = 120.0,
    ) -> int | None:
        """Fork an agent running ``python -m module argv``; its pid, or None when the image
        cannot (gone, or not ready in time: start the agent cold instead)."""
        if not self._ready.wait(ready_timeout_s) or self.gone:
            return None
        request = {
            "module": module,
            "argv": list(argv),
            "env": dict(env),
            "cwd": str(cwd),
            "zygote_log": str(zygote_log),
        }
        with self._lock:
            try:
                socket.send_fds(self._sock, [json.dumps(request).encode()], [stdin, out])
            except OSError:
                return None
            with self._replied:
                while not self._replies and not self.gone:
                    self._replied.wait(1.0)
                reply = self._replies.pop(0) if self._replies else ""
        if not reply.startswith("pid "):
            if reply:
                log.warning("the node image could not start an agent: %s", reply)
            return None
        return int(reply[4:])

    def host_store(
        self, host: str, port: int, ready_timeout_s: float = 120.0
    ) -> StoreKeeper | None:
        """A rendezvous store on ``host:port`` (``port`` 0: any free one) hosted by a process
        forked from the image; None when the image cannot (gone, or not ready in time).

        Raises ``OSError`` naming the keeper's error when the store cannot start there (the
        port in use, the address not of this machine)."""
        if not self._ready.wait(ready_timeout_s) or self.gone:
            return None
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        request = {"store": {"host": host, "port": port}}
        with self._lock:
            try:
                socket.send_fds(self._sock, [json.dumps(request).encode()], [theirs.fileno()])
            except OSError:
                mine.close()
                return None
            finally:
                theirs.close()
            with self._replied:
                while not self._replies and not self.gone:
                    self._replied.wait(1.0)
                reply = self._replies.pop(0) if self._replies else ""
        if not reply.startswith("pid "):
            mine.close()
            if reply:
                log.warning("the node image could not start a store: %s", reply)
            return None
        keeper = self.child(int(reply[4:]))
        mine.settimeout(ready_timeout_s)
        try:
            answer = mine.recv(_MAX_MESSAGE).decode(errors="replace")
        except OSError:
            answer = ""
        if answer.startswith("port "):
            mine.settimeout(None)
            return StoreKeeper(int(answer[5:]), mine, keeper)
        mine.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            keeper.wait(10.0)
        raise OSError(answer[len("error ") :] if answer.startswith("error ") else "no answer")

    def child(self, pid: int, stdin: IO[bytes] | None = None) -> ImageChild:
        """The handle of the agent ``pid`` that :meth:`launch` started."""
        child = ImageChild(pid, self, stdin)
        with self._children_lock:
            code = self._exits.pop(pid, None)
            if code is None:
                self._children[pid] = child
        if code is not None:
            child.exited(code)
        return child

    def close(self, timeout_s: float = 5.0) -> None:
        """Let the image go (it exits when its socket closes; a shared one lingers)."""
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        if self.proc is None:
            self._sock.close()
            return
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._sock.close()


class StoreKeeper:
    """The manager's handle on a store hosted by a keeper forked from the image: ``port`` is
    where it listens; :meth:`check` and :meth:`get` read it as ``TCPStore``'s methods do (the
    keeper asks its store); :meth:`close` (or the manager's exit) ends it."""

    def __init__(self, port: int, sock: socket.socket, proc: ImageChild) -> None:
        self.port = port
        self.pid = proc.pid
        self._sock = sock
        self._proc = proc
        self._lock = threading.Lock()

    def check(self, keys: Sequence[str]) -> bool:
        """Whether every one of ``keys`` is set. Raises ``RuntimeError`` as the store would."""
        return self._ask({"op": "check", "keys": list(keys)}) == b"1"

    def get(self, key: str) -> bytes:
        """The value of ``key``, which must be set (a keeper never waits for a key)."""
        return self._ask({"op": "get", "key": key})[1:]

    def _ask(self, request: dict[str, Any]) -> bytes:
        with self._lock:
            try:
                self._sock.settimeout(_KEEPER_ANSWER_S)
                self._sock.send(json.dumps(request).encode())
                reply = self._sock.recv(_MAX_MESSAGE)
            except OSError as exc:
                raise RuntimeError(f"the store keeper did not answer: {exc}") from None
        if not reply:
            raise RuntimeError("the store keeper is gone")
        if reply[:1] == b"e":
            raise RuntimeError(reply[1:].decode(errors="replace"))
        return reply

    def close(self, wait_s: float = 0.0) -> None:
        """Let the store go: the keeper sees its socket close and exits; waited for up to
        ``wait_s`` (the image must still run to say so)."""
        self._sock.close()
        if wait_s > 0:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(wait_s)


# ---- the image --------------------------------------------------------------------------


def _send(sock: socket.socket, text: str) -> None:
    with contextlib.suppress(OSError):
        sock.send(text.encode())


def _exit_code(code: object) -> int:
    """The exit status ``sys.exit(code)`` gives, as the interpreter computes it."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _exit_after(run: Callable[[], object]) -> NoReturn:
    """In a process forked from the image: run ``run``, then exit as the interpreter would
    (non-daemon threads joined, exit handlers run, an uncaught exception printed, the status
    of ``sys.exit``), but without unwinding into the image's loop or tearing down its modules."""
    try:
        run()
        code = 0
    except SystemExit as exc:
        code = _exit_code(exc.code)
    except BaseException:  # as the interpreter: print it, exit 1
        sys.excepthook(*sys.exc_info())
        code = 1
    me = threading.current_thread()
    for thread in threading.enumerate():
        if thread is not me and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()  # what the interpreter runs at its exit
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def _be_agent(
    request: dict[str, Any], fds: list[int], sock: socket.socket, signals: dict[int, Any]
) -> None:
    """In the forked agent: shed what is the image's, fork the zygote, run the agent."""
    sock.close()
    for fd in _held:  # the image's selector and its other agents' pidfds
        with contextlib.suppress(OSError):
            os.close(fd)
    os.setsid()
    stdin, out = fds
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(stdin, 0)
    os.dup2(out, 1)
    os.dup2(out, 2)
    for fd in fds:
        os.close(fd)
    signal.pthread_sigmask(signal.SIG_SETMASK, set())
    for sig, handler in signals.items():
        with contextlib.suppress(OSError, ValueError, TypeError):
            signal.signal(sig, handler)
    os.environ.clear()
    os.environ.update({str(k): str(v) for k, v in request["env"].items()})
    os.chdir(str(request["cwd"]))
    module = str(request["module"])
    sys.argv = [module, *(str(a) for a in request["argv"])]
    _prestart_zygote(Path(str(request["zygote_log"])), signals)
    runpy.run_module(module, run_name="__main__", alter_sys=True)


def _prestart_zygote(log_path: Path, signals: dict[int, Any]) -> None:
    """In a newly forked agent (one thread): fork its zygote, and leave it for the agent to
    take (:func:`unbroken.agent.ranks.start_zygote`)."""
    from unbroken.agent import standby
    from unbroken.agent.env import CONTROL_VARS

    if not become_subreaper():
        return
    orders, orders_end = os.pipe()
    replies, reply_end = os.pipe()
    log_path.parent.mkdir(parents=True, exist_ok=True)
    pid = os.fork()
    if pid == 0:  # the zygote
        try:
            os.setsid()
            out = os.open(str(log_path), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            os.dup2(orders, 0)
            os.dup2(out, 1)
            os.dup2(out, 2)
            for fd in (orders, orders_end, replies, out):
                os.close(fd)
            env = {k: v for k, v in os.environ.items() if k not in CONTROL_VARS}
            env.setdefault("OMP_NUM_THREADS", "1")
            os.environ.clear()
            os.environ.update(env)
        except BaseException:  # nothing may return into the agent
            os._exit(70)
        _exit_after(lambda: standby.serve_forked(reply_end, signals))
    os.close(orders)
    os.close(reply_end)
    prestarted(OwnChild(pid, os.fdopen(orders_end, "wb", buffering=0)), replies, log_path)


def _be_store(request: dict[str, Any], fd: int, sock: socket.socket) -> None:
    """In the forked store keeper: host the store, say where, hold it until let go."""
    sock.close()
    for held in _held:
        with contextlib.suppress(OSError):
            os.close(held)
    os.setsid()
    signal.pthread_sigmask(signal.SIG_SETMASK, set())
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)
    from unbroken.rpc.store import host_store

    report = socket.socket(fileno=fd)
    try:
        store = host_store(str(request["host"]), int(request["port"]))
    except Exception as exc:
        _send(report, f"error {exc}")
        return
    _send(report, f"port {store.port}")
    with contextlib.suppress(OSError):
        while asked := report.recv(_MAX_MESSAGE):  # until the manager lets go (or is gone)
            report.send(_keeper_answer(store, asked))


def _keeper_answer(store: Any, data: bytes) -> bytes:
    """A keeper's answer to the manager's ``check`` or ``get``: ``1``/``0``, ``v`` and the
    value, or ``e`` and the error."""
    try:
        request = json.loads(data)
        if request["op"] == "check":
            return b"1" if store.check([str(k) for k in request["keys"]]) else b"0"
        if request["op"] == "get":
            key = str(request["key"])
            if not store.check([key]):
                return f"e{key!r} is not set".encode()
            return b"v" + bytes(store.get(key))
        return f"e{request['op']!r} is not an operation of a keeper".encode()
    except Exception as exc:  # a bad request or the store's own error, said to the asker
        return f"e{exc}".encode()


def _fork_for(
    data: bytes, fds: list[int], sock: socket.socket, signals: dict[int, Any]
) -> int | str:
    """Fork the agent or store keeper a request asks for: its pid, or the ``error`` reply."""
    try:
        request = json.loads(data)
        if isinstance(request, dict) and isinstance(request.get("store"), dict):
            store = request["store"]
            if len(fds) != 1 or not isinstance(store.get("port"), int) or "host" not in store:
                raise ValueError("a store request has a host, a port and one descriptor")
            pid = os.fork()
            if pid == 0:
                _exit_after(lambda: _be_store(store, fds[0], sock))
            return pid
        if not isinstance(request, dict) or len(fds) != 2:
            raise ValueError("a request is a JSON object with two descriptors")
        for key in ("module", "argv", "env", "cwd", "zygote_log"):
            if key not in request:
                raise ValueError(f"the request has no {key!r}")
        pid = os.fork()
    except (ValueError, OSError) as exc:
        return f"error {exc}"
    if pid == 0:
        _exit_after(lambda: _be_agent(request, fds, sock, signals))
    return pid


def _listen(path: Path) -> socket.socket | None:
    """The listening socket of a shared image at ``path``; None when another image serves it."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        sock.bind(str(path))
    except OSError:
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            probe.connect(str(path))
        except OSError:  # a socket file left by an image that is gone
            path.unlink(missing_ok=True)
            sock.bind(str(path))
        else:
            sock.close()
            return None
        finally:
            probe.close()
    os.chmod(path, 0o600)
    sock.listen(16)
    return sock


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    began = time.monotonic()
    clients: list[socket.socket] = []
    listener: socket.socket | None = None
    linger_s = 0.0
    if "--listen" in args:  # shared: any number of managers, one after another or at once
        path = Path(args[args.index("--listen") + 1])
        linger_s = float(args[args.index("--linger") + 1]) if "--linger" in args else 60.0
        listener = _listen(path)
        if listener is None:
            return
        path.with_suffix(".pid").write_text(f"{os.getpid()}\n")
    else:
        clients.append(socket.socket(fileno=int(args[args.index("--socket-fd") + 1])))
    from unbroken.agent import standby

    signals = standby.startup_signals()
    standby.warm_imports()
    print(
        f"{time.time():.3f} node image {os.getpid()} ready (imports took "
        f"{time.monotonic() - began:.2f} s)",
        flush=True,
    )
    sel = selectors.DefaultSelector()
    _held.add(sel.fileno())

    def serve(client: socket.socket) -> None:
        sel.register(client, selectors.EVENT_READ, ("client", client))
        _held.add(client.fileno())
        _send(client, "ready")

    for client in list(clients):
        serve(client)
    if listener is not None:
        sel.register(listener, selectors.EVENT_READ, ("listen", listener))
        _held.add(listener.fileno())
    owners: dict[int, socket.socket | None] = {}  # agent pid -> the manager that started it
    idle_since = time.monotonic()
    while True:
        for key, _ in sel.select(timeout=1.0 if listener is not None else None):
            kind, obj = key.data
            if kind == "listen":
                assert listener is not None
                client, _ = listener.accept()
                clients.append(client)
                serve(client)
            elif kind == "client":
                client = obj
                try:
                    data, fds, _, _ = socket.recv_fds(client, _MAX_MESSAGE, 2)
                except OSError:
                    data, fds = b"", []
                if not data:  # the manager let go: its agents are its own to end
                    sel.unregister(client)
                    _held.discard(client.fileno())
                    clients.remove(client)
                    client.close()
                    for agent, owner in owners.items():
                        if owner is client:
                            owners[agent] = None
                    if listener is None:
                        sys.stdout.flush()
                        os._exit(0)
                    continue
                forked = _fork_for(data, fds, client, signals)
                for fd in fds:
                    with contextlib.suppress(OSError):
                        os.close(fd)
                if isinstance(forked, str):
                    _send(client, forked)
                    continue
                pid = forked
                pidfd = os.pidfd_open(pid)
                _held.add(pidfd)
                sel.register(pidfd, selectors.EVENT_READ, ("agent", pid))
                owners[pid] = client
                _send(client, f"pid {pid}")
            else:
                sel.unregister(key.fileobj)
                _held.discard(key.fd)
                os.close(key.fd)
                _, status = os.waitpid(obj, 0)
                owner = owners.pop(obj, None)
                if owner is not None:
                    _send(owner, f"exit {obj} {os.waitstatus_to_exitcode(status)}")
        if listener is not None:
            if clients or owners:
                idle_since = time.monotonic()
            elif time.monotonic() - idle_since > linger_s:
                _leave_shared(Path(args[args.index("--listen") + 1]))


def _leave_shared(path: Path) -> NoReturn:
    """A shared image that nobody used for its linger time ends, its files with it."""
    pidfile = path.with_suffix(".pid")
    with contextlib.suppress(OSError):
        if pidfile.read_text().strip() == str(os.getpid()):
            path.unlink(missing_ok=True)
            pidfile.unlink(missing_ok=True)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
