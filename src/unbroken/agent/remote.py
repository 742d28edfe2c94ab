"""``unbroken launch --join HOST:PORT --token-file F --node NAME``: the agent of one host.

It registers its node (name, device count, the address other hosts reach it on) with a control
plane on another host over the authenticated control channel, then follows the node's order
stream until the control plane closes it (the calls and orders of
:mod:`unbroken.protocol.hosts`). A control plane that cannot be reached, or that refuses the
token, ends it with one line and exit 1. The control plane's handle on a pod started here is
:class:`unbroken.manager.remotepods.RemoteChild`.

The token is the run's shared secret, read from a file that only its owner may read (the
control plane writes it with mode 0600); it never appears on a command line, where ``ps`` shows
it to every user of the host.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from unbroken.agent.launcher import LaunchUsageError, parse_launch_args
from unbroken.agent.planes import (
    PLANES_VAR,
    Plane,
    PlaneError,
    check_planes,
    encode_planes,
    parse_plane,
)
from unbroken.protocol.hosts import JOIN, NODE_ORDERS, NODE_POD, PYTHON, SIGNAL, START
from unbroken.rpc import ControlClient, RpcError


class JoinError(RuntimeError):
    """The agent cannot join; the message is the one line the user sees."""


@dataclass(frozen=True)
class JoinArgs:
    control: str
    token_file: Path
    node: str
    devices: int
    address: str
    planes: tuple[Plane, ...] = ()
    warm_spare: bool = False  # --devices given: keep a spare agent of that many slots


def build_join_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="unbroken launch --join",
        description="Join this host's node to a control plane on another host.",
    )
    p.add_argument("--join", required=True, metavar="HOST:PORT", help="the control plane")
    p.add_argument("--token-file", required=True, type=Path, help="the run's token (mode 0600)")
    p.add_argument("--node", default=socket.gethostname(), help="this node's name")
    p.add_argument(
        "--devices",
        type=int,
        default=None,
        help="device slots on this node (default 1); given, a warm spare agent with that many "
        "rank slots waits while the host runs no pod",
    )
    p.add_argument(
        "--address",
        default="",
        help="this host's address that other hosts reach (default: the one that routes to the "
        "control plane)",
    )
    p.add_argument(
        "--plane",
        action="append",
        default=[],
        metavar="NAME=IFNAME",
        help="a network plane the ranks' collectives may use, in order of preference (give "
        "two or more for link failover; the job enables it with MS_ENABLE_TFT TSP:1)",
    )
    return p


def parse_join_args(argv: Sequence[str]) -> JoinArgs:
    ns = build_join_parser().parse_args(list(argv))
    host, sep, port = str(ns.join).rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) <= 65535:
        raise JoinError(f"--join {ns.join!r}: expected HOST:PORT")
    if ns.devices is not None and ns.devices < 1:
        raise JoinError(f"--devices {ns.devices}: expected at least 1")
    try:
        planes = tuple(parse_plane(text) for text in ns.plane)
        check_planes(planes)
    except PlaneError as exc:
        raise JoinError(str(exc)) from None
    return JoinArgs(
        control=str(ns.join),
        token_file=ns.token_file,
        node=str(ns.node),
        devices=int(ns.devices or 1),
        warm_spare=ns.devices is not None,
        address=str(ns.address) or route_address(host, int(port)),
        planes=planes,
    )


def route_address(host: str, port: int) -> str:
    """This host's address on the route to ``host`` (no packet is sent: a UDP connect only
    picks the source address)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((host, port))
        except OSError as exc:
            raise JoinError(f"no route to the control plane {host}:{port}: {exc}") from None
        return str(s.getsockname()[0])


def read_token(path: Path, flag: str = "--token-file") -> str:
    """The token in ``path``, a file only its owner may read (``flag`` names it in errors)."""
    try:
        st = path.stat()
        text = path.read_text().strip()
    except OSError as exc:
        raise JoinError(f"{flag} {path}: {exc.strerror or exc}") from None
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise JoinError(
            f"{flag} {path}: readable by others (mode {stat.S_IMODE(st.st_mode):o}); chmod 600 it"
        )
    if not text:
        raise JoinError(f"{flag} {path}: empty")
    return text


def join(args: JoinArgs, timeout_s: float = 5.0) -> int:
    """Register, then follow the node's orders until the control plane closes the stream."""
    client = ControlClient(args.control, read_token(args.token_file), timeout_s=timeout_s)
    try:
        reply = client.call(
            JOIN,
            {
                "node": args.node,
                "devices": args.devices,
                "address": args.address,
                "pid": os.getpid(),
            },
        )
    except RpcError as exc:
        raise JoinError(f"cannot join {args.control}: {exc}") from None
    if not reply.get("ok"):
        raise JoinError(f"{args.control} refused node {args.node}: {reply.get('error', '?')}")
    host = Host(client, args.node, args.planes, WarmSpare(args.node, args.devices), args.warm_spare)
    if args.warm_spare:
        host.spare.start()
    try:
        for order in client.stream(NODE_ORDERS, {"node": args.node, "pid": os.getpid()}):
            host.run_order(order)
    except RpcError as exc:
        raise JoinError(f"lost the control plane {args.control}: {exc}") from None
    finally:
        host.spare.close()
    return 0


class WarmSpare:
    """A spare pod agent kept on this host while it runs no pod (:mod:`unbroken.agent.spare`:
    its zygote has imported torch). A pod placed here takes it, so a lost host's pod starts on
    the spare host warm, as on the embedded cluster; a host whose pod runs keeps none."""

    def __init__(self, node: str, slots: int) -> None:
        self.node = node
        self.slots = slots
        self.proc: subprocess.Popen[bytes] | None = None
        self._dir: Path | None = None
        self._closed = False

    def start(self) -> None:
        if self._closed or (self.proc is not None and self.proc.poll() is None):
            return
        if self._dir is None:
            self._dir = Path(tempfile.mkdtemp(prefix=f"unbroken-spare-{self.node}-"))
        argv = [sys.executable, "-m", "unbroken.agent.spare", "--nproc", str(self.slots)]
        with open(self._dir / "agent.log", "ab") as out:
            self.proc = subprocess.Popen(
                [*argv, "--log-dir", str(self._dir)],
                stdin=subprocess.PIPE,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def take(
        self, argv: Sequence[str], env: Mapping[str, str], cwd: Path, log_path: Path
    ) -> subprocess.Popen[bytes] | None:
        """The spare as the agent of the pod ``argv`` starts (``python -m unbroken launch
        ...``); None when there is none, or its rank slots are not the pod's."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None or proc.stdin is None:
            return None
        launch = list(argv)[list(argv).index("launch") + 1 :] if "launch" in argv else []
        try:
            nproc = parse_launch_args(launch).nproc_per_node
        except (LaunchUsageError, SystemExit):
            nproc = -1
        if nproc != self.slots:
            self.proc = proc  # kept for a pod it fits
            return None
        order = {"argv": launch, "env": dict(env), "cwd": str(cwd), "log": str(log_path)}
        try:
            proc.stdin.write((json.dumps(order) + "\n").encode())
            proc.stdin.close()
        except (BrokenPipeError, ValueError):
            return None
        return proc

    def close(self) -> None:
        """Let the spare go (its input closes: it exits) and remove its directory; none is
        started after this."""
        self._closed = True
        proc, self.proc = self.proc, None
        if proc is not None:
            if proc.stdin is not None:
                with contextlib.suppress(BrokenPipeError, ValueError):
                    proc.stdin.close()
            try:
                proc.wait(5.0)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None


class Host:
    """This host's side of the node's orders: pods' agents started (warm where the spare
    fits) and signalled; the spare started again once the host runs no pod."""

    def __init__(
        self,
        client: ControlClient,
        node: str,
        planes: Sequence[Plane],
        spare: WarmSpare,
        warm_spare: bool = True,
    ) -> None:
        self.warm_spare = warm_spare
        self.client = client
        self.node = node
        self.planes = tuple(planes)
        self.spare = spare
        self._running: set[int] = set()
        self._lock = threading.Lock()

    def run_order(self, order: dict[str, object]) -> None:
        _run_order(self.client, self.node, order, self.planes, self)

    def started(self, pid: int) -> None:
        with self._lock:
            self._running.add(pid)

    def ended(self, pid: int) -> None:
        with self._lock:
            self._running.discard(pid)
            idle = not self._running
        if idle and self.warm_spare:
            self.spare.start()


def _run_order(
    client: ControlClient,
    node: str,
    order: dict[str, object],
    planes: Sequence[Plane] = (),
    host: Host | None = None,
) -> None:
    """Start a pod's agent process on this host (``start``) or signal one (``signal``)."""
    kind = order.get("kind")
    if kind == SIGNAL:
        with contextlib.suppress(ProcessLookupError, TypeError, ValueError):
            os.kill(int(str(order["pid"])), int(str(order["sig"])))
        return
    if kind != START:
        return
    pod = str(order["pod"])
    log_path = Path(str(order["log"]))
    log_path.parent.mkdir(parents=True, exist_ok=True)
    # The run directory's path on this host: made here, not shared with the control plane's.
    Path(str(order["cwd"])).mkdir(parents=True, exist_ok=True)
    env = {str(k): str(v) for k, v in dict(order["env"]).items()}  # type: ignore[call-overload]
    # This host's choices of interface (GLOO_SOCKET_IFNAME=...) win over the control plane's.
    env.update({k: v for k, v in os.environ.items() if k.endswith("_SOCKET_IFNAME")})
    if planes:  # the ranks start on the first plane; their agent watches and switches them
        env[PLANES_VAR] = encode_planes(planes)
        env["GLOO_SOCKET_IFNAME"] = planes[0].ifname
    argv = [sys.executable if a == PYTHON else str(a) for a in order["argv"]]  # type: ignore[attr-defined]
    cwd = Path(str(order["cwd"]))
    proc = host.spare.take(argv, env, cwd, log_path) if host is not None else None
    if proc is not None:
        with open(log_path, "ab") as out:
            out.write(f"=== agent for {pod} on {node} (warm spare, pid {proc.pid})\n".encode())
    else:
        with open(log_path, "ab") as out:
            proc = subprocess.Popen(
                argv,
                env=env,
                cwd=str(cwd),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
    if host is not None:
        host.started(proc.pid)
    client.call(NODE_POD, {"node": node, "pod": pod, "pid": proc.pid})

    def watch() -> None:
        code = proc.wait()
        with contextlib.suppress(RpcError):
            client.call(NODE_POD, {"node": node, "pod": pod, "pid": proc.pid, "code": code})
        if host is not None:
            host.ended(proc.pid)

    threading.Thread(target=watch, name=f"pod-{pod}", daemon=True).start()
