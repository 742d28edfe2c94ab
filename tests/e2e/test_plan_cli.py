"""``unbroken plan`` on the seed's own YAMLs, as a user moving from MindCluster runs it before any
pod starts: what the operator gives each pod (the TaskD port, the rank-0 pod's address, the
switches it derives) and Table 1, the parameters each chosen mode needs. No training runs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from tests.support.cli_runs import REPO, unbroken

pytestmark = pytest.mark.e2e

SEED = REPO / "tests" / "fixtures" / "seed"


def pods_of(plan: str) -> dict[str, str]:
    """Each pod's block of the plan, by pod name."""
    blocks = re.split(r"\n  (?=\S+  \()", plan.split("\npods:\n", 1)[1])
    return {block.split()[0]: block for block in blocks if block.strip()}


def test_every_pod_gets_the_taskd_port_and_the_rank_0_pod_s_address() -> None:
    """The seed's process-recover job: its containers declare ``taskd-port`` and its script
    exports ``MASTER_ADDR=${POD_IP}`` on rank 0; the plan declares the port on every pod and
    gives every pod the rank-0 pod's address, not the script's export."""
    res = unbroken("plan", SEED / "process-recover.yaml")
    assert res.rc == 0, res.explain()
    pods = pods_of(res.stdout)
    assert sorted(pods) == ["process-recover-master-0", "process-recover-worker-0"], pods
    for block in pods.values():
        assert "ports: 9601/taskd-port" in block, block
        assert "MASTER_ADDR=process-recover-master-0" in block, block
        assert "TASKD_PROCESS_ENABLE=on" in block, block
        assert "POD_IP" not in block, block


def test_a_job_without_a_process_rung_gets_taskd_process_enable_off() -> None:
    res = unbroken("plan", SEED / "pod-rescheduling-pytorch.yaml")
    assert res.rc == 0, res.explain()
    for block in pods_of(res.stdout).values():
        assert "TASKD_PROCESS_ENABLE=off" in block, block


def test_table_1_lists_each_chosen_mode_s_parameters_and_what_is_missing() -> None:
    res = unbroken("plan", SEED / "process-recover.yaml")
    assert res.rc == 0, res.explain()
    table = res.stdout.split("Table 1 parameters of the chosen modes:\n", 1)[1].split("\n\n")[0]
    modes = re.findall(r"^  (\S+):$", table, flags=re.M)
    assert modes == ["job-rescheduling", "recover"], (
        table
    )  # the seed job: no pod-rescheduling label
    recover = table.split("  recover:\n", 1)[1]
    for parameter in ("recover-strategy", "PROCESS_RECOVER", "--enable-high-availability"):
        assert re.search(rf"^    ok\s+{re.escape(parameter)}\s", recover, flags=re.M), recover
    assert all(
        line.split()[0] in ("ok", "MISSING")
        for line in table.splitlines()[1:]
        if line.startswith("    ")
    ), table


def test_the_plan_of_a_job_the_seed_forbids_is_refused_with_the_reason(tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    text = (SEED / "process-recover.yaml").read_text()
    job.write_text(
        text.replace('export TASKD_PROCESS_ENABLE="on"', 'export TASKD_PROCESS_ENABLE="off"')
    )
    res = unbroken("plan", job)
    assert res.rc != 0, res.explain()
    assert "TASKD_PROCESS_ENABLE=off contradicts" in res.stderr, res.explain()
