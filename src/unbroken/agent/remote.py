"""``unbroken launch --join HOST:PORT --token-file F --node NAME``: the agent of one host.

It registers its node (name, device count, the address other hosts reach it on) with a control
plane on another host over the authenticated control channel, then follows the node's order
stream until the control plane closes it. A control plane that cannot be reached, or that refuses
the token, ends it with one line and exit 1.

The token is the run's shared secret, read from a file that only its owner may read (the
control plane writes it with mode 0600); it never appears on a command line, where ``ps`` shows
it to every user of the host.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import stat
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from unbroken.agent.image import OwnChild
from unbroken.agent.planes import (
    PLANES_VAR,
    Plane,
    PlaneError,
    check_planes,
    encode_planes,
    parse_plane,
)
from unbroken.manager.service import JOIN, NODE_ORDERS, NODE_POD, NodeRegistry
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


def build_join_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="unbroken launch --join",
        description="Join this host's node to a control plane on another host.",
    )
    p.add_argument("--join", required=True, metavar="HOST:PORT", help="the control plane")
    p.add_argument("--token-file", required=True, type=Path, help="the run's token (mode 0600)")
    p.add_argument("--node", default=socket.gethostname(), help="this node's name")
    p.add_argument("--devices", type=int, default=1, help="device slots on this node")
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
    if ns.devices < 1:
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
        devices=int(ns.devices),
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
    try:
        for order in client.stream(NODE_ORDERS, {"node": args.node, "pid": os.getpid()}):
            _run_order(client, args.node, order, args.planes)
    except RpcError as exc:
        raise JoinError(f"lost the control plane {args.control}: {exc}") from None
    return 0


def _run_order(
    client: ControlClient, node: str, order: dict[str, object], planes: Sequence[Plane] = ()
) -> None:
    """Start a pod's agent process on this host (``start``) or signal one (``signal``)."""
    kind = order.get("kind")
    if kind == "signal":
        with contextlib.suppress(ProcessLookupError, TypeError, ValueError):
            os.kill(int(str(order["pid"])), int(str(order["sig"])))
        return
    if kind != "start":
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
    argv = [sys.executable if a == "{python}" else str(a) for a in order["argv"]]  # type: ignore[attr-defined]
    with open(log_path, "ab") as out:
        proc = subprocess.Popen(
            argv,
            env=env,
            cwd=str(order["cwd"]),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    client.call(NODE_POD, {"node": node, "pod": pod, "pid": proc.pid})

    def watch() -> None:
        code = proc.wait()
        with contextlib.suppress(RpcError):
            client.call(NODE_POD, {"node": node, "pod": pod, "pid": proc.pid, "code": code})

    threading.Thread(target=watch, name=f"pod-{pod}", daemon=True).start()


class RemoteChild(OwnChild):
    """A pod's agent process on a joined host, with the part of ``Popen``'s interface the
    control plane uses: started, signalled and reaped through the host's agent."""

    poll_s = 0.02  # an exit is known when the host's agent reports it

    def __init__(
        self,
        registry: NodeRegistry,
        node: str,
        pod: str,
        argv: Sequence[str],
        env: Mapping[str, str],
        cwd: Path,
        log_path: Path,
        timeout_s: float = 60.0,
    ) -> None:
        self._registry = registry
        self.node = node
        python = sys.executable
        registry.order(
            node,
            {
                "kind": "start",
                "pod": pod,
                "argv": ["{python}" if a == python else a for a in argv],
                "env": dict(env),
                "cwd": str(cwd),
                "log": str(log_path),
            },
            wait_s=timeout_s,
        )
        pid = registry.started_pid(node, pod, timeout_s)
        if pid is None:
            raise OSError(f"node {node} did not start pod {pod} in {timeout_s:g} s")
        super().__init__(pid)

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._registry.exit_code(self.node, self.pid)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            self._registry.order(self.node, {"kind": "signal", "pid": self.pid, "sig": int(sig)})

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)
