"""Pods of the embedded cluster: one node-agent process per pod, started and stopped by pid.

In the embedded cluster a *node* is a name with device slots and a *pod* is an agent process
(``unbroken launch``) placed on a node, with the pod's environment from the operator's plan. The
control plane plays the part of the kubelet of every node: it starts agent processes and, for
fault injection, can take a whole node down (every process of every pod on it, SIGKILL at once).
Detection never uses this privileged view: a lost node is found by its agents' missed heartbeats.

A *spare* (:class:`Spare`) is an agent process waiting on a free node with its rank slots'
zygote warm (:mod:`unbroken.agent.spare`); a pod placed on that node takes it over
(:func:`assume`) instead of starting a cold agent whose ranks import torch from scratch.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from unbroken.agent.children import OwnChild
from unbroken.agent.image import Image
from unbroken.manager.remotepods import RemoteChild
from unbroken.protocol.messages import JoinFrom

log = logging.getLogger(__name__)


@dataclass
class PodProcess:
    pod: str
    node: str
    generation: int
    proc: subprocess.Popen[bytes] | OwnChild
    started_at: float
    rank_pids: dict[int, int] = field(default_factory=dict)
    last_heartbeat_at: float = 0.0
    hello_at: float | None = None
    finished: bool = False
    stopped: bool = False
    lost: bool = False
    join: JoinFrom | None = None  # ranks start as replacements, state from a replica
    without_session: tuple[int, ...] = ()  # ranks that exited 0 without an Unbroken session
    switched_off: tuple[tuple[str, str], ...] = ()  # rungs its environment turns off (hello)

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill_all(self) -> list[int]:
        """SIGKILL the agent and every rank it reported (a node going down). The pids of a pod
        on a joined host are that host's: its agent kills the pod's processes there."""
        if isinstance(self.proc, RemoteChild):
            self.proc.kill_tree()
            return [self.proc.pid]
        killed = []
        for pid in [self.proc.pid, *self.rank_pids.values()]:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except ProcessLookupError:
                pass
        return killed

    def reap(self, timeout_s: float = 5.0) -> int | None:
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return None


def agent_argv(
    *,
    nproc_per_node: int,
    nnodes: int,
    node_rank: int,
    master_addr: str,
    master_port: int,
    max_restarts: int,
    monitor_interval_s: float,
    run_id: str,
    script: str,
    script_args: Sequence[str],
) -> list[str]:
    return [
        sys.executable,
        "-m",
        "unbroken",
        "launch",
        "--nproc_per_node",
        str(nproc_per_node),
        "--nnodes",
        str(nnodes),
        "--node_rank",
        str(node_rank),
        "--master_addr",
        master_addr,
        "--master_port",
        str(master_port),
        "--max_restarts",
        str(max_restarts),
        "--monitor_interval",
        str(monitor_interval_s),
        "--run_id",
        run_id,
        script,
        *script_args,
    ]


def _from_image(
    image: Image | None,
    *,
    argv: Sequence[str],
    env: Mapping[str, str],
    cwd: Path,
    out: int,
    zygote_log: Path,
    with_stdin: bool = False,
) -> OwnChild | None:
    """The agent ``argv`` (``python -m MODULE ...``) forked from the node's image, or None
    (no image, or it could not: the caller starts the agent cold)."""
    if image is None or list(argv[:2]) != [sys.executable, "-m"]:
        return None
    if with_stdin:
        stdin, writer = os.pipe()
    else:
        stdin, writer = os.open(os.devnull, os.O_RDONLY), -1
    try:
        pid = image.launch(
            module=argv[2],
            argv=argv[3:],
            env=env,
            cwd=cwd,
            out=out,
            stdin=stdin,
            zygote_log=zygote_log,
        )
    finally:
        os.close(stdin)
    if pid is None:
        if writer >= 0:
            os.close(writer)
        return None
    return image.child(pid, os.fdopen(writer, "wb") if writer >= 0 else None)


def start_pod(
    *,
    pod: str,
    node: str,
    generation: int,
    argv: list[str],
    env: Mapping[str, str],
    log_path: Path,
    cwd: Path,
    image: Image | None = None,
) -> PodProcess:
    """Start the agent of ``pod``: forked from ``image`` where there is one (its zygote warm
    at once), else as a new process."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as out:
        out.write(f"=== agent for {pod} on {node}, generation {generation}\n".encode())
        out.flush()
        proc: subprocess.Popen[bytes] | OwnChild | None = _from_image(
            image,
            argv=argv,
            env=env,
            cwd=cwd,
            out=out.fileno(),
            zygote_log=log_path.parent / "logs" / "standby.log",
        )
        if proc is None:
            proc = subprocess.Popen(
                argv,
                env=dict(env),
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
    log.info("started agent of %s on %s (pid %d)", pod, node, proc.pid)
    return PodProcess(pod=pod, node=node, generation=generation, proc=proc, started_at=time.time())


@dataclass
class Spare:
    """A warm spare agent on ``node`` (see :mod:`unbroken.agent.spare`)."""

    node: str
    proc: subprocess.Popen[bytes] | OwnChild
    started_at: float

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None


def start_spare(
    *,
    node: str,
    nproc: int,
    env: Mapping[str, str],
    log_dir: Path,
    cwd: Path,
    image: Image | None = None,
) -> Spare:
    """Start a spare agent on ``node``: forked from ``image`` where there is one."""
    log_dir.mkdir(parents=True, exist_ok=True)
    argv = [
        sys.executable,
        "-m",
        "unbroken.agent.spare",
        "--nproc",
        str(nproc),
        "--log-dir",
        str(log_dir),
    ]
    with (log_dir / "agent.log").open("ab") as out:
        out.write(f"=== spare agent on {node}\n".encode())
        out.flush()
        proc: subprocess.Popen[bytes] | OwnChild | None = _from_image(
            image,
            argv=argv,
            env=env,
            cwd=cwd,
            out=out.fileno(),
            zygote_log=log_dir / "standby.log",
            with_stdin=True,
        )
        if proc is None:
            proc = subprocess.Popen(
                argv,
                env=dict(env),
                cwd=cwd,
                stdin=subprocess.PIPE,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
    log.info("started a spare agent on %s (pid %d)", node, proc.pid)
    return Spare(node=node, proc=proc, started_at=time.time())


def assume(
    spare: Spare,
    *,
    pod: str,
    generation: int,
    argv: Sequence[str],
    env: Mapping[str, str],
    log_path: Path,
    cwd: Path,
) -> PodProcess | None:
    """Make ``spare`` the agent of ``pod`` (``argv``: the whole ``unbroken launch`` command a
    cold agent would run); None when the spare is gone (start a cold agent instead)."""
    if not spare.alive or spare.proc.stdin is None:
        return None
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as out:
        out.write(
            f"=== agent for {pod} on {spare.node}, generation {generation} "
            f"(warm spare, pid {spare.proc.pid})\n".encode()
        )
    launch = list(argv)[list(argv).index("launch") + 1 :]
    order = {"argv": launch, "env": dict(env), "cwd": str(cwd), "log": str(log_path)}
    try:
        spare.proc.stdin.write((json.dumps(order) + "\n").encode())
        spare.proc.stdin.close()
    except (BrokenPipeError, ValueError):
        return None
    log.info("spare agent on %s (pid %d) is now %s", spare.node, spare.proc.pid, pod)
    return PodProcess(
        pod=pod, node=spare.node, generation=generation, proc=spare.proc, started_at=time.time()
    )


def let_go(spare: Spare, timeout_s: float = 5.0) -> None:
    """End a spare that no pod took: it lets its zygote go when its input closes."""
    if spare.alive and spare.proc.stdin is not None:
        with contextlib.suppress(BrokenPipeError, ValueError):
            spare.proc.stdin.close()
    try:
        spare.proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        spare.proc.kill()
        spare.proc.wait()
