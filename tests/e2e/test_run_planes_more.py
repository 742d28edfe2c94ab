"""Network planes beyond a plane's link going down: a plane slowed with its carrier up (network
sub-health), and planes declared in the cluster YAML under ``unbroken run`` (a network
namespace per node). In a file of their own so that they run beside the failover tests."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from tests.support.cli_runs import (
    FIXTURES,
    Reference,
    digest,
    events,
    of_kind,
    start_job,
    unbroken,
    wait_for,
    write_job,
)
from tests.support.netns_hosts import hosts
from tests.support.plane_hosts import served
from tests.support.process_helpers import started_ranks

from unbroken.cli.nethosts import unavailable

pytestmark = pytest.mark.e2e

JOB = FIXTURES / "plane-failover.yaml"


def test_a_slow_plane_is_sub_healthy_and_left_without_a_fault(
    tmp_path: Path, run_dir: Path, fault_free: Reference
) -> None:
    """Host 1's plane-A link slowed to 8 Mbit/s (``tc`` token bucket; its carrier stays up):
    the gradients' communication takes many times its time on plane A, the plane is recorded
    sub-healthy, and the job moves to plane B at a step boundary, every process kept and no
    fault for the ladder; plane A is held slow (no switchback by itself) until an operator
    switches back."""
    job = write_job(
        tmp_path / "job.yaml", job=JOB, replace={"--step-sleep=0.4": "--step-sleep=0.2"}
    )
    with hosts(2, planes=2) as h, served(h, tmp_path, run_dir, job) as run:
        h.set_rate(1, "8mbit", plane=0)
        run.wait_said("failover to plane b done", "the move off plane a", deadline_s=90.0)
        h.set_rate(1, None, plane=0)
        assert not run.said("switchback to plane a"), run.lines
        res = unbroken("link", "switchback", "--run", run_dir)
        assert res.rc == 0 and "plane a active: step" in res.stdout, res.explain()
        out = run.finish()
    assert "job e2e-planes: SUCCEEDED" in out, out
    assert "0 fault(s), 0 recovery(ies)" in out, out
    evs = events(run_dir)
    [slow] = of_kind(evs, "PlaneSubHealthy")
    assert slow["plane"] == "a" and slow["comm_s"] > 3 * slow["baseline_s"], slow
    [moved] = of_kind(evs, "PlaneFailover")
    assert (moved["from_plane"], moved["to"], moved["planned"]) == ("a", "b", True), moved
    assert "plane a slow" in moved["reason"] and "(sub-health)" in moved["reason"], moved
    [back] = of_kind(evs, "PlaneSwitchback")
    assert back["reason"] == "operator command: switch to plane a", back
    assert started_ranks(evs) == [0, 1, 2, 3]
    assert digest(run_dir) == fault_free.digest


def test_planes_in_the_cluster_yaml_under_unbroken_run(
    tmp_path: Path, run_dir: Path, fault_free: Reference
) -> None:
    """``planes: [a, b]`` in the cluster YAML: ``unbroken run`` makes each node a network
    namespace with a link on each plane (root), names the links, and the job, configured as the
    seed's PyTorch scenario ("suspension and switchback for link failover communication":
    ``retry`` and ``HCCL_OP_RETRY_ENABLE="L0:0, L1:1, L2:1"``, no ``MS_ENABLE_TFT``), fails over
    when node-1's plane-A link goes down and switches back by itself once it is up, every
    process kept; every namespace and link it made is gone after the run."""
    if unavailable():
        pytest.skip(unavailable())
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text("nodes: 3\ndevicesPerNode: 2\nplanes: [a, b]\n")
    job = write_job(
        tmp_path / "job.yaml",
        job=JOB,
        replace={
            "--step-sleep=0.4": "--step-sleep=0.3",
            'recover-strategy: "retry,recover"': 'recover-strategy: "retry"',
            '- name: MS_ENABLE_TFT\n                  value: "{TSP:1}"': (
                '- name: HCCL_OP_RETRY_ENABLE\n                  value: "L0:0, L1:1, L2:1"'
            ),
        },
    )
    running = start_job(run_dir, tmp_path / "logs", "--cluster", cluster, job=job)
    try:

        def said(text: str) -> bool:
            assert running.proc.poll() is None, "the job ended first: " + str(running.output())
            return text in running.output()[0]

        def tail() -> str:
            return running.output()[0][-4000:]

        wait_for(lambda: said("step 20/60"), "step 20", 120.0, tail)
        assert said("link failover on"), tail()
        found = re.search(r"node-1: a (\S+),", running.output()[0])
        assert found is not None, running.output()
        link = found.group(1)
        subprocess.run(["ip", "link", "set", link, "down"], check=True)
        wait_for(lambda: said("failover to plane b done"), "the failover", 120.0, tail)
        subprocess.run(["ip", "link", "set", link, "up"], check=True)
        wait_for(lambda: said("switchback to plane a done"), "the switchback", 120.0, tail)
        done = running.wait()
    finally:
        running.stop()
    assert done.rc == 0, done.explain()
    assert "job e2e-planes: SUCCEEDED" in done.stdout, done.explain()
    evs = events(run_dir)
    [failover] = of_kind(evs, "PlaneFailover")
    assert failover["reason"] == "plane a down on node-1: failover to plane b", failover
    [back] = of_kind(evs, "PlaneSwitchback")
    assert back["reason"].startswith("plane a up on every node for "), back
    assert started_ranks(evs) == [0, 1, 2, 3]
    assert digest(run_dir) == fault_free.digest
    tag = f"ub{running.proc.pid}"
    left = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    spaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert tag not in left and tag not in spaces, (left, spaces)
