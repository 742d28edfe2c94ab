"""A start order carries the pod's planned environment and what its agent needs, never the
control plane's host's environment or the run's secret (attack c); the host starts the pod's
agent with its own environment as the base, its own way to the control plane and its own
credentials, whatever the order says of them."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from tests.support.manager_job import EdgeEngine
from tests.support.remote_hosts import join

from unbroken.agent.remote import Host, WarmSpare
from unbroken.ledger import Ledger
from unbroken.manager.job import JobManager
from unbroken.manager.layout import ClusterLayout, JobLayout, ManagerOptions, PodLayout
from unbroken.manager.service import NodeRegistry
from unbroken.spec.knobs import FaultHandling, Strategy

pytestmark = pytest.mark.component

PLANNED = {"PLANNED_VAR": "from-the-job", "PATH": "/planned/bin", "LD_PRELOAD": "/x.so"}


def test_a_start_order_carries_the_planned_env_and_no_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("UNBROKEN_STANDBY", "0")
    monkeypatch.setenv("CONTROL_HOST_ONLY", "of-the-control-plane's-host")
    layout = JobLayout(
        job_id="job",
        pods=(PodLayout(name="pod-0", node_rank=0, nproc=2, env=PLANNED),),
        script="train.py",
        script_args=(),
        fault_handling=FaultHandling(strategies=(Strategy.RECOVER, Strategy.EXIT)),
        workdir=tmp_path,
    )
    m = JobManager(
        layout,
        ClusterLayout(nodes=("node-0",), devices_per_node=2),
        tmp_path,
        Ledger(tmp_path / "ledger.db"),
        options=ManagerOptions(),
        engine_type=EdgeEngine,
    )
    m.engine.open_store()
    registry = NodeRegistry()
    m.engine.remote_nodes = registry
    orders = join(registry, "node-0")
    starting = threading.Thread(target=m.engine.start_agent, args=("pod-0", "node-0", (0, 1), 0))
    starting.start()
    order = orders.get(timeout=10)
    registry.pod_report({"node": "node-0", "pod": "pod-0", "pid": 4242})
    starting.join(10)
    assert order["kind"] == "start"
    env: dict[str, str] = order["env"]
    assert m.secret not in json.dumps(order)
    assert "UNBROKEN_SECRET" not in env and "UNBROKEN_CONTROL" not in env
    assert "CONTROL_HOST_ONLY" not in env and "HOME" not in env
    assert env["PLANNED_VAR"] == "from-the-job"
    assert "PATH" not in env and "LD_PRELOAD" not in env  # the host's to decide
    assert env["UNBROKEN_POD"] == "pod-0" and env["UNBROKEN_NODE"] == "node-0"
    assert env["UNBROKEN_DEVICES"] == "0,1"
    assert all(k.startswith("UNBROKEN_") or k in PLANNED for k in env), sorted(env)


class _Client:
    """The host's client of the control plane, recording its calls."""

    address = "control.example:29400"

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def call(self, method: str, body: dict[str, Any]) -> dict[str, Any]:
        self.calls.append((method, body))
        return {"ok": True}


def test_the_host_starts_a_pod_on_its_own_environment_and_credentials(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOST_ONLY", "of-this-host")
    monkeypatch.setenv("UNBROKEN_SECRET", "a-secret-in-the-hosts-own-environment")
    host_path = "/usr/local/bin:/usr/bin:/bin"
    monkeypatch.setenv("PATH", host_path)
    client = _Client()
    creds = tmp_path / "node-0.json"
    host = Host(
        client,  # type: ignore[arg-type]
        "node-0",
        (),
        WarmSpare("node-0", 1),
        warm_spare=False,
        control="10.0.0.1:29400",
        credentials=creds,
    )
    out = tmp_path / "env.json"
    dump = f"import json, os; json.dump(dict(os.environ), open({str(out)!r}, 'w'))"
    host.run_order(
        {
            "kind": "start",
            "pod": "pod-0",
            "argv": ["{python}", "-c", dump],
            "env": {
                **PLANNED,
                "UNBROKEN_POD": "pod-0",
                "UNBROKEN_SECRET": "sent-in-clear",
                "UNBROKEN_CONTROL": "evil.example:1",
                "UNBROKEN_CREDENTIALS": "/elsewhere.json",
                "PYTHONPATH": "/evil",
            },
            "cwd": str(tmp_path),
            "log": str(tmp_path / "agent.log"),
        }
    )
    deadline = time.monotonic() + 30
    while len(client.calls) < 2 and time.monotonic() < deadline:  # started, then exited
        time.sleep(0.05)
    assert [c[0] for c in client.calls] == ["NodePod", "NodePod"], client.calls
    assert client.calls[1][1]["code"] == 0, (tmp_path / "agent.log").read_text()
    env = json.loads(out.read_text())
    assert env["HOST_ONLY"] == "of-this-host"
    assert env["PATH"] == host_path and "LD_PRELOAD" not in env
    assert env.get("PYTHONPATH") != "/evil"
    assert env["PLANNED_VAR"] == "from-the-job" and env["UNBROKEN_POD"] == "pod-0"
    assert env["UNBROKEN_CONTROL"] == "10.0.0.1:29400"
    assert env["UNBROKEN_CREDENTIALS"] == str(creds)
    assert "UNBROKEN_SECRET" not in env
