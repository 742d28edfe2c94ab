"""Across hosts: a host's agent (``unbroken launch --join``) joins a control plane on another host.

Each host is a network namespace on a bridge (tests/support/netns_hosts.py); the control plane's
server listens on the root namespace's bridge address, which only the hosts' links reach. Each
host joins with its node's credentials (mutual TLS), made as a user makes them: by ``unbroken
credentials`` for a token of the user's, or by ``unbroken serve`` in ``RUN_DIR/hosts``.
"""

from __future__ import annotations

import contextlib
import os
import queue
import secrets
import signal
import socket
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
from tests.support.cli_runs import (
    FIXTURES,
    JOB,
    RUN_TIMEOUT_S,
    Reference,
    cli_env,
    digest,
    events,
    of_kind,
    wait_for,
)
from tests.support.netns_hosts import PLANE_IFNAMES, Hosts, hosts
from tests.support.remote_hosts import provision

from unbroken.manager.service import CommandQueues, Inbound, NodeRegistry, build_server
from unbroken.rpc.tls import node_identity, write_credentials

pytestmark = pytest.mark.e2e


def _token_file(tmp_path: Path, secret: str) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "token"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secret + "\n")
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _join(
    h: Hosts,
    i: int,
    control: str,
    credentials: Path,
    node: str,
    env: dict[str, str] | None = None,
    private: Path | None = None,
    warm: bool = False,
) -> subprocess.Popen[str]:
    """The host's agent in host i's namespace; with ``private``, that directory is the host's
    own (an empty tmpfs over it in a mount namespace of its own); ``warm``: with the job's
    device slots (``--devices 2``), so it keeps a warm spare agent while it runs no pod."""
    argv = [
        sys.executable,
        "-m",
        "unbroken",
        "launch",
        "--join",
        control,
        "--credentials",
        str(credentials),
        "--node",
        node,
        *(["--devices", "2"] if warm else []),
    ]
    if private is not None:
        private.mkdir(parents=True, exist_ok=True)
        mount = 'mount -t tmpfs tmpfs "$0" && exec "$@"'
        argv = [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            mount,
            str(private),
            *argv,
        ]
    return subprocess.Popen(
        h.argv(i, argv),
        env=cli_env() if env is None else env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_host_agents_join_over_the_bridge_and_refuse_bad_tokens_and_downed_links(
    tmp_path: Path,
) -> None:
    material = provision(tmp_path / "job", "node-0", "node-1")
    secret = material.token.read_text().strip()
    registry = NodeRegistry(tls=material.server())
    commands = CommandQueues()
    with hosts(2) as h:
        server = build_server(
            secret,
            queue.Queue[Inbound](),
            commands,
            5.0,
            nodes=registry,
            host=h.root_address(),
            port=0,
        )
        server.start()
        try:
            control = server.address
            # Two hosts join; each is known by the address it has on the bridge.
            creds = [material.hosts[f"node-{i}"] for i in range(2)]
            agents = [_join(h, i, control, creds[i], f"node-{i}") for i in range(2)]
            deadline = time.monotonic() + 30.0
            while len(registry.nodes()) < 2 and time.monotonic() < deadline:
                assert all(a.poll() is None for a in agents), [a.communicate() for a in agents]
                time.sleep(0.1)
            joined = {n.node: n for n in registry.nodes()}
            assert {k: (v.address, v.devices) for k, v in joined.items()} == {
                "node-0": (h.address(0), 1),
                "node-1": (h.address(1), 1),
            }
            # The control plane closing the order streams ends the agents, exit 0.
            commands.closed.set()
            for a in agents:
                _, err = a.communicate(timeout=15)
                assert a.returncode == 0, err

            # A wrong token with the job's authority: one line, exit 1.
            wrong = tmp_path / "wrong.json"
            wrong_token = replace(material.issue(node_identity("node-9")), token="0" * 32)
            write_credentials(wrong, wrong_token)
            bad = _join(h, 1, control, wrong, "node-9")
            _, err = bad.communicate(timeout=30)
            assert bad.returncode == 1
            assert err.count("\n") == 1 and "missing or wrong run secret" in err, err
            # Another job's credentials: the control plane is not theirs, one line, exit 1.
            other = provision(tmp_path / "other", "node-9").hosts["node-9"]
            bad = _join(h, 1, control, other, "node-9")
            _, err = bad.communicate(timeout=30)
            assert bad.returncode == 1
            assert err.count("\n") == 1 and "failed the TLS handshake" in err, err
            assert "node-9" not in {n.node for n in registry.nodes()}

            # Host 1's link taken down: the control plane is unreachable from it, one line.
            h.set_link(1, up=False)
            lost = _join(h, 1, control, creds[1], "node-1")
            _, err = lost.communicate(timeout=60)
            assert lost.returncode == 1
            assert err.count("\n") == 1 and f"cannot join {control}" in err, err
        finally:
            server.stop()


def test_a_token_file_others_can_read_is_refused(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("x" * 32)
    token.chmod(0o644)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "unbroken",
            "launch",
            "--join",
            "127.0.0.1:1",
            "--token-file",
            str(token),
        ],
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 1
    assert done.stderr == (
        f"unbroken launch: --token-file {token}: readable by others (mode 644); chmod 600 it\n"
    )


def _checkpointed(run_dir: Path) -> bool:
    ckpt = run_dir / "checkpoints"
    return ckpt.is_dir() and any(ckpt.iterdir())


def _kill_host(h: Hosts, i: int) -> None:
    """Every process in host i's namespace (its agent, its pods' agents, their ranks), SIGKILL."""
    pids = subprocess.run(["ip", "netns", "pids", h.ns(i)], capture_output=True, text=True)
    for pid in pids.stdout.split():
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)


@pytest.mark.parametrize("fault", ["killed-rank", "lost-host", "downed-link"])
def test_a_job_across_namespace_hosts_recovers_to_the_fault_free_model(
    fault: str, tmp_path: Path, run_dir: Path, fault_free: Reference
) -> None:
    """``unbroken serve`` on the root namespace's bridge address, a host agent per namespace
    (two for the pods, one spare), gloo over the bridge: the job trains to the fault-free run's
    model bit for bit, through a rank killed (recovered in place), host 1 lost (every process of
    it killed: the pod moves to the spare host) or host 1's link down for 3 s.

    In the killed-rank case the token is the user's (``--secret-file``), and each host's pods'
    directory (agents' and ranks' logs, heartbeats, exit reports) is its own: a tmpfs mounted
    over it in the host's mount namespace, so control needs no file shared with the control
    plane's host (the job's checkpoints and result stay on the shared run directory)."""
    token = tmp_path / "token"
    private = fault == "killed-rank"
    chaos = ["--chaos", str(FIXTURES / "kill-rank.yaml")] if private else []
    given = ["--secret-file", str(_token_file(tmp_path / "given", secrets.token_hex(16)))]
    nodes = [f"node-{i}" for i in range(3)]
    if private:  # the user's token: its hosts' credentials made before the control plane
        made = subprocess.run(
            [sys.executable, "-m", "unbroken", "credentials", *given, "--out-dir", "creds"]
            + [a for n in nodes for a in ("--node", n)],
            env=cli_env(),
            capture_output=True,
            text=True,
            timeout=60,
            cwd=tmp_path,
        )
        assert made.returncode == 0, made.stderr
    creds = tmp_path / "creds" if private else run_dir / "hosts"
    with hosts(3) as h:
        control = f"{h.root_address()}:{_free_port()}"
        serve = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "unbroken",
                "serve",
                str(JOB),
                "--listen",
                control,
                "--token-file",
                str(token),
                "--run-dir",
                str(run_dir),
                "--quiet",
                *chaos,
                *(given if private else []),
            ],
            env=cli_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=tmp_path,
        )
        agents: list[subprocess.Popen[str]] = []
        try:
            wait_for(lambda: (run_dir / "control.json").exists(), "the control plane", 60.0)
            for i in range(3):
                # TMPDIR: a host agent killed with its host leaves its spare's directory here.
                env = {**cli_env(), "GLOO_SOCKET_IFNAME": PLANE_IFNAMES[0], "TMPDIR": str(tmp_path)}
                own = run_dir / "pods" if private else None
                warm = fault == "lost-host"  # where a pod starts on a host after the start
                node_creds = creds / f"node-{i}.json"
                agents.append(_join(h, i, control, node_creds, f"node-{i}", env, own, warm))
            if fault in ("lost-host", "downed-link"):
                wait_for(lambda: _checkpointed(run_dir), "a checkpoint", 120.0)
                if fault == "lost-host":
                    _kill_host(h, 1)
                else:
                    h.set_link(1, up=False)
                    time.sleep(3.0)
                    h.set_link(1, up=True)
            out, err = serve.communicate(timeout=RUN_TIMEOUT_S)
            assert serve.returncode == 0, (out, err, [a.poll() for a in agents])
            assert "job e2e-mlp: SUCCEEDED" in out, (out, err)
            assert "; 0 fault(s)" not in out, out
            # The control plane's end ends the hosts' agents (the lost host's was killed).
            for i, a in enumerate(agents):
                a.wait(timeout=30)
                assert a.returncode == (-signal.SIGKILL if fault == "lost-host" and i == 1 else 0)
            assert digest(run_dir) == fault_free.digest
            if private:  # the serving host's tree saw none of the hosts' pod files
                assert not list((run_dir / "pods").rglob("*")), list((run_dir / "pods").rglob("*"))
                assert token.read_text().strip() == given_secret(given)
            if fault == "lost-host":  # host 1's pod went to the spare host, node-2
                placed = [(e["pod"], e["node"]) for e in of_kind(events(run_dir), "PodPlaced")]
                assert len(placed) > 2 and placed[-1][1] == "node-2", placed
                # ... where the host's warm spare agent took it (torch imported already).
                log = (run_dir / "pods" / placed[-1][0] / "agent.log").read_text()
                assert f"=== agent for {placed[-1][0]} on node-2 (warm spare" in log, log
        finally:
            for p in (serve, *agents):
                if p.poll() is None:
                    p.kill()
                p.communicate()
            for i in range(3):
                _kill_host(h, i)


@pytest.mark.parametrize(
    ("listen", "why"),
    [
        ("nowhere", "--listen 'nowhere': expected ADDR:PORT with a port from 1 to 65535"),
        ("192.0.2.1:29400", "cannot open the rendezvous store on 192.0.2.1:0"),
    ],
)
def test_serve_where_it_cannot_listen_says_so_in_one_line(
    listen: str, why: str, tmp_path: Path
) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "unbroken",
            "serve",
            str(JOB),
            "--listen",
            listen,
            "--run-dir",
            str(tmp_path / "run"),
        ],
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith(f"unbroken serve: {why}") and done.stderr.count("\n") == 1, (
        done.stderr
    )


def given_secret(args: list[str]) -> str:
    return Path(args[1]).read_text().strip()
