"""``unbroken run`` on a cluster YAML that declares ``planes``: every node a network namespace.

The embedded cluster runs in one network namespace, where a plane could not go down for one
node alone; so with ``planes`` each node becomes a host of its own on this machine
(:class:`~unbroken.cli.nethosts.NetHosts`, root and iproute2 needed): a namespace with a link
on each plane's bridge and one on a management bridge. The control plane is ``unbroken serve``
listening on the management bridge (the control channel and the rendezvous stores never ride a
plane), and each node's agent is ``unbroken launch --join ... --plane NAME=IFNAME ...`` started
in its namespace, so the ranks' collectives run over the first plane and the job's link
failover moves them when a plane goes down or is slow. ``ip link set <link> down`` on a node's
link (named on the console, ``<tag>h<i><letter>``) takes that node's plane down; ``tc qdisc
... tbf`` on it slows it. Everything made is deleted when the run ends.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from unbroken.cli import serve
from unbroken.cli.nethosts import NetHosts, NetnsError, unavailable
from unbroken.cli.run import Inputs
from unbroken.spec import ClusterSpec

#: How long a node's agent may take to end once the job has.
AGENT_EXIT_S = 30.0
#: How long the nodes' agents wait for the control plane to listen before they join.
JOIN_WAIT_S = 60.0


def refusal(cluster: ClusterSpec) -> str | None:
    """Why ``cluster``'s planes cannot be built here (one line), or None."""
    if not cluster.planes:
        return None
    why = unavailable()
    if not why:
        return None
    return (
        f"{cluster.source}: planes: network planes on one machine are network namespaces, and "
        f"{why} (run as root with iproute2, or run the job across hosts: unbroken serve, and "
        "unbroken launch --join --plane NAME=IFNAME on each)"
    )


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


def run_on_planes(args: argparse.Namespace, inputs: Inputs) -> int:
    """The job on namespace hosts, one per node of its cluster (see the module doc)."""
    cluster = inputs.cluster
    hosts = NetHosts(cluster.nodes, planes=len(cluster.planes), management=True)
    agents: list[subprocess.Popen[bytes]] = []
    ended = threading.Event()
    try:
        hosts.create()
    except NetnsError as exc:
        hosts.close()
        print(f"unbroken run: cannot build the nodes' network namespaces: {exc}", file=sys.stderr)
        return 1

    def start_agents(run_dir: Path, token: Path, listen: str) -> None:
        if not args.quiet:
            links = "; ".join(
                f"node-{i}: "
                + ", ".join(
                    f"{name} {hosts.host_veth(i, p)}" for p, name in enumerate(cluster.planes)
                )
                for i in range(cluster.nodes)
            )
            print(f"network planes {', '.join(cluster.planes)}: links {links}", flush=True)
        threading.Thread(
            target=join_when_up, args=(run_dir, token, listen), name="join", daemon=True
        ).start()

    def join_when_up(run_dir: Path, token: Path, listen: str) -> None:
        # The control plane listens once the job manager runs: it writes control.json then.
        deadline = time.monotonic() + JOIN_WAIT_S
        while not (run_dir / "control.json").exists():
            if time.monotonic() > deadline or ended.is_set():
                return  # the nodes stay silent: the run fails them as lost, saying so
            time.sleep(0.05)
        for i in range(cluster.nodes):
            if ended.is_set():
                return
            argv = [sys.executable, "-m", "unbroken", "launch", "--join", listen]
            argv += ["--token-file", str(token), "--node", f"node-{i}"]
            for p, name in enumerate(cluster.planes):
                argv += ["--plane", f"{name}={hosts.ifname(p)}"]
            log = run_dir / "hosts" / f"node-{i}.log"
            with log.open("ab") as out:
                agents.append(
                    subprocess.Popen(
                        hosts.argv(i, argv), stdout=out, stderr=subprocess.STDOUT, cwd=run_dir
                    )
                )

    mgmt = hosts.root_address(hosts.mgmt)
    served = argparse.Namespace(
        job=args.job,
        cluster=args.cluster,
        listen=f"{mgmt}:{_free_port(mgmt)}",
        token_file=None,
        secret_file=None,
        chaos=args.chaos,
        run_dir=args.run_dir,
        agent_timeout=args.agent_timeout,
        hang_timeout=args.hang_timeout,
        quiet=args.quiet,
        codes=args.codes,
        prog="run",
    )
    try:
        return serve.run(served, on_listening=start_agents, inputs=inputs)
    finally:
        ended.set()
        for agent in agents:
            try:
                agent.wait(timeout=AGENT_EXIT_S)
            except subprocess.TimeoutExpired:
                agent.kill()
                agent.wait()
        for i in range(cluster.nodes):  # nothing of a node outlives it
            done = subprocess.run(["ip", "netns", "pids", hosts.ns(i)], capture_output=True)
            for pid in done.stdout.split():
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)
        hosts.close()
