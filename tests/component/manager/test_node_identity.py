"""A connection speaks only for the node its certificate proved (attack b): the control plane's
server (``build_server`` with the registry of joined nodes, mutual TLS, 127.0.0.1) and a real
host's agent (``unbroken launch --join``) as node-0; another node's credentials cannot read
node-0's orders, report node-0's pods, join as node-0, speak for node-0's pods or make a
person's command, and a pid of -1 is refused wherever it appears. The host itself acts on the
processes it started alone, whatever an order names."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import pytest
from tests.support.cli_runs import cli_env
from tests.support.remote_hosts import provision

from unbroken.agent.hostprocs import OrderRefused, OwnProcesses
from unbroken.manager.remotepods import JoinedHost, RemoteChild
from unbroken.manager.service import CommandQueues, Inbound, NodeRegistry, build_server
from unbroken.rpc import ControlClient, RpcError

pytestmark = pytest.mark.component


def _refused(call: object, code: grpc.StatusCode) -> str:
    with pytest.raises(RpcError) as info:
        if callable(call):
            call()
    assert code.name in str(info.value), info.value
    return str(info.value)


def test_a_node_cannot_act_as_another_node_and_no_pid_below_1_is_obeyed(tmp_path: Path) -> None:
    material = provision(tmp_path, "node-0", "node-1")
    token = material.token.read_text().strip()
    registry = NodeRegistry(tls=material.server())
    inbox: queue.Queue[Inbound] = queue.Queue()
    commands = CommandQueues()
    server = build_server(token, inbox, commands, 5.0, nodes=registry)
    server.start()
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    host = subprocess.Popen(
        [
            *(sys.executable, "-m", "unbroken", "launch", "--join", server.address),
            *("--credentials", str(material.hosts["node-0"])),
        ],
        env=cli_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    node1 = ControlClient(server.address, token, tls=material.node("node-1"))
    try:
        deadline = time.monotonic() + 30
        while not registry.nodes() and time.monotonic() < deadline:
            assert host.poll() is None, host.communicate()
            time.sleep(0.05)
        assert [n.node for n in registry.nodes()] == ["node-0"]
        # The control plane starts a pod on node-0: the real host starts it.
        pod = RemoteChild(
            registry,
            "node-0",
            "pod-a",
            [sys.executable, "-c", "import time; time.sleep(60)"],
            {},
            tmp_path,
            tmp_path / "pod-a.log",
            timeout_s=30,
        )
        assert pod.poll() is None

        # node-1's certificate does not speak for node-0 ...
        stream = node1.stream("NodeOrders", {"node": "node-0", "pid": 1})
        why = _refused(lambda: next(stream), grpc.StatusCode.PERMISSION_DENIED)
        assert "this connection is node node-1's, not 'node-0''s" in why
        _refused(
            lambda: node1.call("NodePod", {"node": "node-0", "pod": "pod-a", "pid": -1}),
            grpc.StatusCode.PERMISSION_DENIED,
        )
        _refused(
            lambda: node1.call(
                "NodeJoin", {"node": "node-0", "devices": 1, "address": "x", "pid": 7}
            ),
            grpc.StatusCode.PERMISSION_DENIED,
        )
        # ... nor for node-0's pods' agents, nor as a person at the control plane's host.
        _refused(
            lambda: node1.call("AgentHeartbeat", {"pod": "pod-a", "agent_pid": pod.pid}),
            grpc.StatusCode.PERMISSION_DENIED,
        )
        # A heartbeat over the agents' heartbeat stream is checked as the call would be.
        beats = node1.pipe("AgentHeartbeats", "AgentHeartbeat")
        why = _refused(
            lambda: beats.call({"pod": "pod-a", "agent_pid": pod.pid}),
            grpc.StatusCode.PERMISSION_DENIED,
        )
        assert "pod 'pod-a' is not placed on node node-1" in why
        assert inbox.empty()
        _refused(
            lambda: node1.call("Inject", {"kind": "node", "node": "node-0"}),
            grpc.StatusCode.PERMISSION_DENIED,
        )
        # As itself, a pid of -1 (or a pod it was never asked to start) is refused.
        why = _refused(
            lambda: node1.call("NodePod", {"node": "node-1", "pod": "pod-a", "pid": -1}),
            grpc.StatusCode.INVALID_ARGUMENT,
        )
        assert "pid -1 is not a process" in why
        _refused(
            lambda: node1.call("NodePod", {"node": "node-1", "pod": "pod-a", "pid": 4242}),
            grpc.StatusCode.INVALID_ARGUMENT,
        )
        with pytest.raises(ValueError, match="pid -1 is not a process"):
            registry.order("node-0", {"kind": "signal", "pid": -1, "sig": 9})

        # An order naming a process the host did not start (as a control plane that lost its
        # mind would send it) is refused on the host; its own pod it kills when told to.
        orders = registry.orders_of("node-0")
        assert orders is not None
        orders.put({"kind": "signal", "pid": victim.pid, "sig": int(signal.SIGKILL)})
        orders.put({"kind": "kill", "pid": victim.pid})
        orders.put({"kind": "kill", "pid": os.getpid()})
        assert JoinedHost(registry, "node-0").down() >= 1  # after the orders above, in order
        assert victim.poll() is None
        pod.wait(10)
    finally:
        node1.close()
        commands.closed.set()
        for p in (victim, host):
            if p.poll() is None:
                p.kill()
        host.communicate()
        victim.wait()
        server.stop()


def test_the_hosts_own_processes_refuse_pids_it_did_not_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sent: list[tuple[int, int]] = []
    monkeypatch.setattr(os, "kill", lambda pid, sig: sent.append((pid, sig)))
    own = OwnProcesses("node-0")
    for pid in (-1, 0, 1, True, "12", os.getpid()):
        with pytest.raises(OrderRefused):
            own.signal(pid, signal.SIGKILL)
        with pytest.raises(OrderRefused):
            own.kill_tree(pid)
    assert sent == []


def test_the_command_line_on_the_control_hosts_calls_with_the_admins_credentials(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from unbroken.cli.control import call_run
    from unbroken.cli.credentials import ADMIN_FILE
    from unbroken.rpc.tls import write_credentials

    material = provision(tmp_path, "node-0")
    token = material.token.read_text().strip()
    inbox: queue.Queue[Inbound] = queue.Queue()
    commands = CommandQueues()
    server = build_server(token, inbox, commands, 5.0, nodes=NodeRegistry(tls=material.server()))
    server.start()
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    control = run / "control.json"
    control.write_text(f'{{"address": "{server.address}", "secret": "{token}", "pid": 1}}')
    control.chmod(0o600)

    def manager() -> None:
        msg = inbox.get(timeout=20)
        assert msg.reply is not None
        msg.reply.put({"ok": True, "detail": f"{msg.method} {msg.body['kind']}"})

    try:
        # Without the run's admin credentials the server is not even spoken to.
        assert call_run("inject", run, "Inject", {"kind": "node", "node": "node-0"}) is None
        assert f"control plane at {server.address} is not reachable" in capsys.readouterr().err
        write_credentials(run / ADMIN_FILE, material.admin())
        answering = threading.Thread(target=manager)
        answering.start()
        reply = call_run("inject", run, "Inject", {"kind": "node", "node": "node-0"})
        answering.join(20)
        assert reply is not None and reply["detail"] == "Inject node"
    finally:
        commands.closed.set()
        server.stop()
