"""``unbroken launch --join HOST:PORT --credentials FILE``: the agent of one host.

It registers its node (name, device count, the address other hosts reach it on) with a control
plane on another host over the control channel, mutual TLS (:mod:`unbroken.rpc.tls`), then
follows the node's order stream until the control plane closes it (the calls and orders of
:mod:`unbroken.protocol.hosts`). Nothing is sent, the token included, before the server proved
with its certificate that it is the job's control plane; a server that cannot, a control plane
that cannot be reached, or one that refuses the token, ends it with one line and exit 1.

Its credentials are its node's (``--credentials``: a file written by ``unbroken credentials`` or
``unbroken serve``, which holds the run's token, the job's authority and the node's own
certificate). On Kubernetes each host pod has the job's Secret instead (``--token-file``: the
token, and the job's authority ``ca.crt``/``ca.key`` beside it), and makes its node's
certificate from it. Either file is refused when others may read it; no secret appears on a
command line, where ``ps`` shows it to every user of the host.

The host acts on what it started alone (:class:`unbroken.agent.hostprocs.OwnProcesses`): a pid in
an order that is no process it started for a pod, or a descendant of one, is refused. A pod's
agent starts with the host's environment as its base, the pod's planned environment from the
order (less what only the host decides, :data:`unbroken.protocol.hosts.HOST_VARS`), and the
host's own way to the control plane: its ``--join`` address and its credentials' file. The
control plane's handle on a pod started here is :class:`unbroken.manager.remotepods.RemoteChild`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from unbroken.agent.hostprocs import OrderRefused, OwnProcesses
from unbroken.agent.launcher import LaunchUsageError, parse_launch_args
from unbroken.agent.planes import (
    PLANES_VAR,
    Plane,
    PlaneError,
    check_planes,
    encode_planes,
    parse_plane,
)
from unbroken.protocol.hosts import (
    DOWN,
    JOIN,
    KILL,
    LINK,
    NODE_DONE,
    NODE_ORDERS,
    NODE_POD,
    PYTHON,
    SIGNAL,
    START,
    THROTTLE,
    host_decides,
)
from unbroken.rpc import ControlClient, RpcError
from unbroken.rpc.tls import (
    Credentials,
    CredentialsError,
    node_identity,
    private_file_problem,
    read_credentials,
    write_credentials,
)

log = logging.getLogger(__name__)

#: The variable that tells a pod's agent where its host's credentials are.
CREDENTIALS_VAR = "UNBROKEN_CREDENTIALS"


class JoinError(RuntimeError):
    """The agent cannot join; the message is the one line the user sees."""


@dataclass(frozen=True)
class JoinArgs:
    control: str
    node: str
    devices: int
    address: str
    credentials: Path | None = None  # --credentials: the node's own
    token_file: Path | None = None  # --token-file: the job's Secret (the authority beside it)
    planes: tuple[Plane, ...] = ()
    warm_spare: bool = False  # --devices given: keep a spare agent of that many slots


def build_join_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="unbroken launch --join",
        description="Join this host's node to a control plane on another host.",
    )
    p.add_argument("--join", required=True, metavar="HOST:PORT", help="the control plane")
    creds = p.add_mutually_exclusive_group(required=True)
    creds.add_argument(
        "--credentials",
        type=Path,
        help="this node's credentials (mode 0600), from `unbroken credentials` or the "
        "control plane's RUN_DIR/hosts/NODE.json",
    )
    creds.add_argument(
        "--token-file",
        type=Path,
        help="the job's token (mode 0600) with the job's authority beside it (ca.crt, ca.key: "
        "the operator's Secret); this host makes its node's certificate from it",
    )
    p.add_argument("--node", default=None, help="this node's name (default: the credentials')")
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
        "two or more for link failover; the job enables it with MS_ENABLE_TFT TSP:1, or for "
        "PyTorch with retry and HCCL_OP_RETRY_ENABLE on at L1)",
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
    node = ns.node
    if node is None:
        node = socket.gethostname()
        if ns.credentials is not None:  # the node the credentials are for
            with contextlib.suppress(CredentialsError):
                node = read_credentials(ns.credentials).node or node
    return JoinArgs(
        control=str(ns.join),
        credentials=ns.credentials,
        token_file=ns.token_file,
        node=str(node),
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
    """The token in ``path``, a file of this user's that only it may read (``flag`` names it
    in errors)."""
    try:
        st = path.stat()
        text = path.read_text().strip()
    except OSError as exc:
        raise JoinError(f"{flag} {path}: {exc.strerror or exc}") from None
    problem = private_file_problem(st)
    if problem:
        raise JoinError(f"{flag} {path}: {problem}")
    if not text:
        raise JoinError(f"{flag} {path}: empty")
    return text


def host_credentials(args: JoinArgs, private_dir: Path) -> tuple[Credentials, Path]:
    """This node's credentials and the file its pods' agents read them from: the
    ``--credentials`` file, or, with ``--token-file``, a certificate made here from the job's
    authority beside the token and written to ``private_dir``."""
    if args.credentials is not None:
        try:
            creds = read_credentials(args.credentials)
        except CredentialsError as exc:
            raise JoinError(str(exc)) from None
        if creds.node is None:
            raise JoinError(f"--credentials {args.credentials}: not a node's credentials")
        if creds.node != args.node:
            raise JoinError(
                f"--node {args.node}: the credentials {args.credentials} are node {creds.node}'s"
            )
        return creds, args.credentials.absolute()
    assert args.token_file is not None
    token = read_token(args.token_file)
    from unbroken.rpc.pki import load_authority  # cryptography: on this path alone

    try:
        authority = load_authority(args.token_file, "--token-file")
    except CredentialsError as exc:
        raise JoinError(str(exc)) from None
    if authority is None:
        raise JoinError(
            f"--token-file {args.token_file}: no job authority beside it (ca.crt, ca.key); "
            "join with --credentials FILE (unbroken credentials --secret-file TOKEN --node NAME)"
        )
    creds = authority.issue(node_identity(args.node), token)
    path = private_dir / "credentials.json"
    write_credentials(path, creds)
    return creds, path


def join(args: JoinArgs, timeout_s: float = 5.0) -> int:
    """Register, then follow the node's orders until the control plane closes the stream."""
    private = Path(tempfile.mkdtemp(prefix=f"unbroken-host-{args.node}-"))  # mode 0700
    try:
        creds, creds_path = host_credentials(args, private)
        return _follow(args, creds, creds_path, timeout_s)
    finally:
        shutil.rmtree(private, ignore_errors=True)


def _follow(args: JoinArgs, creds: Credentials, creds_path: Path, timeout_s: float) -> int:
    # The TLS handshake comes first: the token goes out only to the job's control plane.
    client = ControlClient(args.control, creds.token, timeout_s=timeout_s, tls=creds)
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
    host = Host(
        client,
        args.node,
        args.planes,
        WarmSpare(args.node, args.devices),
        args.warm_spare,
        control=args.control,
        credentials=creds_path,
    )
    if args.warm_spare:
        host.spare.start()
    try:
        for order in client.stream(NODE_ORDERS, {"node": args.node, "pid": os.getpid()}):
            host.run_order(order)
    except RpcError as exc:
        raise JoinError(f"lost the control plane {args.control}: {exc}") from None
    finally:
        host.close()
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
    fits), signalled and killed, the node's faults carried out, on its own processes alone;
    the spare started again once the host runs no pod."""

    def __init__(
        self,
        client: ControlClient,
        node: str,
        planes: Sequence[Plane],
        spare: WarmSpare,
        warm_spare: bool = True,
        control: str = "",
        credentials: Path | None = None,
    ) -> None:
        self.warm_spare = warm_spare
        self.client = client
        self.node = node
        self.planes = tuple(planes)
        self.spare = spare
        #: How this host's pods' agents reach the control plane: its own address and file.
        self.control = control or client.address
        self.credentials = credentials
        self.own = OwnProcesses(node)
        self._down = False  # the node went down: no spare until a pod starts here again

    def run_order(self, order: Mapping[str, Any]) -> None:
        """Carry out one order; one that is refused is logged (and answered, when the control
        plane waits for an answer), and the host goes on."""
        kind = order.get("kind")
        try:
            if kind == START:
                self.start(order)
            elif kind == SIGNAL:
                self.own.signal(order.get("pid"), order.get("sig"))
            elif kind == KILL:
                self.own.kill_tree(order.get("pid"))
            elif kind == DOWN:
                self._answer(order, count=self.down())
            elif kind == THROTTLE:
                self._answer(order, count=self.own.throttle(order.get("cpu")))
            elif kind == LINK:
                peers = order.get("peer_pids")
                count = self.own.reset_links(
                    order.get("pid"),
                    list(order.get("exclude_ports") or ()),
                    None if peers is None else list(peers),
                )
                self._answer(order, count=count)
            else:
                raise OrderRefused(f"unknown order {kind!r}")
        except (OrderRefused, KeyError, TypeError, ValueError, OSError) as exc:
            log.warning("node %s: %s order refused: %s", self.node, kind, exc)
            self._answer(order, error=str(exc))

    def _answer(self, order: Mapping[str, Any], **what: Any) -> None:
        oid = order.get("id")
        if oid is None:
            return
        body = {"node": self.node, "id": oid, "ok": "error" not in what, **what}
        with contextlib.suppress(RpcError):
            self.client.call(NODE_DONE, body)

    def down(self) -> int:
        """The node goes down: every process of its pods, and its spare, SIGKILLed."""
        self._down = True
        spare = self.spare.proc
        return self.own.kill_all(() if spare is None else (spare.pid,))

    def close(self) -> None:
        """The control plane is gone: the spare is let go and a throttle's cgroup removed."""
        self.spare.close()
        self.own.release()

    def started(self, pid: int) -> None:
        self._down = False
        self.own.add(pid)

    def ended(self, pid: int) -> None:
        idle = self.own.discard(pid)
        if idle and self.warm_spare and not self._down:
            self.spare.start()

    def pod_env(self, planned: Mapping[str, Any]) -> dict[str, str]:
        """A pod's agent's environment: this host's, the order's (less what the host alone
        decides), and the host's way to the control plane."""
        env = dict(os.environ)
        env.pop("UNBROKEN_SECRET", None)  # the agent reads the token from the credentials
        env.update({str(k): str(v) for k, v in planned.items() if not host_decides(str(k))})
        env.setdefault("OMP_NUM_THREADS", "1")
        env["UNBROKEN_CONTROL"] = self.control
        if self.credentials is not None:
            env[CREDENTIALS_VAR] = str(self.credentials)
        # This host's choices of interface (GLOO_SOCKET_IFNAME=...) win over the order's.
        env.update({k: v for k, v in os.environ.items() if k.endswith("_SOCKET_IFNAME")})
        if self.planes:  # the ranks start on the first plane; their agent watches and switches
            env[PLANES_VAR] = encode_planes(self.planes)
            env["GLOO_SOCKET_IFNAME"] = self.planes[0].ifname
        return env

    def start(self, order: Mapping[str, Any]) -> None:
        """Start a pod's agent process on this host and say so (its pid); its exit is said
        too, when it comes."""
        pod = str(order["pod"])
        log_path = Path(str(order["log"]))
        log_path.parent.mkdir(parents=True, exist_ok=True)
        # The run directory's path on this host: made here, not shared with the control plane's.
        cwd = Path(str(order["cwd"]))
        cwd.mkdir(parents=True, exist_ok=True)
        planned = order["env"]
        if not isinstance(planned, dict):
            raise OrderRefused(f"start {pod}: env is not an object")
        env = self.pod_env(planned)
        argv = [sys.executable if a == PYTHON else str(a) for a in order["argv"]]
        proc = self.spare.take(argv, env, cwd, log_path)
        if proc is not None:
            with open(log_path, "ab") as out:
                out.write(
                    f"=== agent for {pod} on {self.node} (warm spare, pid {proc.pid})\n".encode()
                )
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
        self.started(proc.pid)
        started = proc
        self.client.call(NODE_POD, {"node": self.node, "pod": pod, "pid": started.pid})

        def watch() -> None:
            code = started.wait()
            with contextlib.suppress(RpcError):
                self.client.call(
                    NODE_POD, {"node": self.node, "pod": pod, "pid": started.pid, "code": code}
                )
            self.ended(started.pid)

        threading.Thread(target=watch, name=f"pod-{pod}", daemon=True).start()
