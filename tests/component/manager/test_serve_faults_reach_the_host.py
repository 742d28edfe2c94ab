"""Under ``unbroken serve`` an injected fault reaches the host that runs the pod, through its
agent (attack d): ``inject node``, ``throttle``, ``link`` and a rank's signal become orders to
node-1's host, never signals, cgroups or link resets on the control plane's host. The pids of
node-1's pod here are those of processes of this machine, as a remote host's pid numbers may
be: they must stay untouched."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.support.manager_job import PODS, T0, Job, scripted_job
from tests.support.remote_hosts import answer_next, join, start_remote

from unbroken.chaos import InjectKind
from unbroken.manager.pods import PodProcess
from unbroken.manager.service import NodeRegistry
from unbroken.protocol.heartbeat import Phase
from unbroken.protocol.messages import RanksStarted
from unbroken.spec.knobs import Strategy

pytestmark = pytest.mark.component


@pytest.fixture
def sleepers() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs = [
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"]) for _ in range(3)
    ]
    yield procs
    for p in procs:
        p.kill()
        p.wait()


def _remote_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sleepers: list[subprocess.Popen[bytes]]
) -> tuple[Job, NodeRegistry]:
    """The two-pod job under ``unbroken serve``: node-1's pod started on its host (its agent
    and its ranks 2 and 3 have the pids of ``sleepers``)."""
    job = scripted_job(tmp_path, monkeypatch, Strategy.RECOVER)
    registry = NodeRegistry()
    job.m.engine.remote_nodes = registry
    join(registry, "node-0")
    join(registry, "node-1")
    agent, r2, r3 = (p.pid for p in sleepers)
    child, _ = start_remote(registry, "node-1", PODS[1], agent, tmp_path)
    job.m.engine.pods[PODS[1]] = PodProcess(
        PODS[1], "node-1", 0, child, started_at=T0, rank_pids={2: r2, 3: r3}
    )
    a1 = job.agents[1]
    a1.pid, a1.rank_pids = agent, {2: r2, 3: r3}
    a1.send(RanksStarted(pids=a1.rank_pids, started_at=T0))
    a1.beat(Phase.TRAINING, committed=10)
    assert job.m.gens.ranks[2].pid == r2
    return job, registry


def _as_host(
    registry: NodeRegistry, act: Callable[[], str], **answer: Any
) -> tuple[str, dict[str, Any]]:
    """``act`` (an injection) while the test, as node-1's host, answers its order."""
    out: list[str] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            out.append(act())
        except BaseException as exc:  # re-raised below, on the test's thread
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    order = answer_next(registry, "node-1", **answer)
    thread.join(15)
    if errors:
        raise errors[0]
    return out[0], order


def test_node_throttle_link_and_signals_go_to_the_nodes_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sleepers: list[subprocess.Popen[bytes]]
) -> None:
    job, registry = _remote_job(tmp_path, monkeypatch, sleepers)
    inject = job.m.injector.inject
    _, r2, r3 = (p.pid for p in sleepers)

    said, order = _as_host(registry, lambda: inject(InjectKind.NODE, node="node-1"), count=3)
    assert order["kind"] == "down"
    assert said == "node node-1 down: SIGKILL to 3 processes"

    said, order = _as_host(
        registry, lambda: inject(InjectKind.THROTTLE, node="node-1", cpu=0.5), count=3
    )
    assert (order["kind"], order["cpu"]) == ("throttle", 0.5)
    assert said == "node node-1 throttled to 0.5 of one CPU (3 processes)"
    assert job.m.injector.throttled == {}  # no cgroup of this host
    said, order = _as_host(
        registry, lambda: inject(InjectKind.THROTTLE, node="node-1", clear=True), count=3
    )
    assert (order["kind"], order["cpu"], said) == (
        "throttle",
        None,
        "node node-1 no longer throttled",
    )

    said, order = _as_host(registry, lambda: inject(InjectKind.LINK, rank=2), count=2)
    assert (order["kind"], order["pid"], order["peer_pids"]) == ("link", r2, None)
    assert said.startswith(f"link: reset 2 connection(s) between rank 2 (pid {r2} on node-1)")
    said, order = _as_host(registry, lambda: inject(InjectKind.LINK, rank=2, peer=3), count=1)
    assert (order["pid"], order["peer_pids"]) == (r2, [r3])
    with pytest.raises(ValueError, match="rank 0 runs on node-0, another host"):
        inject(InjectKind.LINK, rank=2, peer=0)

    said, order = _as_host(registry, lambda: inject(InjectKind.HANG, rank=3))
    assert (order["kind"], order["pid"]) == ("signal", r3)

    # A host's refusal is the injection's one-line refusal.
    with pytest.raises(ValueError, match="node node-1: cannot throttle node node-1: no cgroup"):
        _as_host(
            registry,
            lambda: inject(InjectKind.THROTTLE, node="node-1", cpu=0.5),
            error="cannot throttle node node-1: no cgroup v1 cpu controller",
        )
    # Not one of these pids was signalled, throttled or had its links reset on this host.
    assert all(p.poll() is None for p in sleepers), [p.poll() for p in sleepers]
