"""Every seed fixture (tests/fixtures/seed) plans to its golden JSON, and the values the seed
prescribes hold, checked by hand per fixture."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from unbroken.operator import plan
from unbroken.spec import load_cluster, load_job

pytestmark = pytest.mark.unit

SEED = Path(__file__).resolve().parents[2] / "fixtures" / "seed"
JOBS = sorted(p for p in SEED.glob("*.yaml") if not p.name.endswith(".cluster.yaml"))


def planned(path: Path) -> dict[str, Any]:
    cluster_path = path.with_name(path.stem + ".cluster.yaml")
    job = load_job(path)
    cluster = load_cluster(cluster_path if cluster_path.exists() else None, job)
    text = json.dumps(plan(job, cluster).to_json(), indent=2, sort_keys=True)
    result: dict[str, Any] = json.loads(text.replace(str(SEED), "<dir>"))
    return result


@pytest.mark.parametrize("path", JOBS, ids=[p.stem for p in JOBS])
def test_plan_matches_golden(path: Path) -> None:
    golden = path.with_name(path.stem + ".plan.json")
    got = planned(path)
    if os.environ.get("UNBROKEN_UPDATE_GOLDEN") == "1":
        golden.write_text(json.dumps(got, indent=2, sort_keys=True) + "\n")
    assert got == json.loads(golden.read_text())


def test_every_fixture_has_a_golden_plan() -> None:
    assert len(JOBS) == 16
    assert all(p.with_name(p.stem + ".plan.json").exists() for p in JOBS)


# fixture -> (ladder, env that the first Worker pod must carry, env it must not carry)
EXPECTED: dict[str, tuple[list[str], dict[str, str], set[str]]] = {
    "job-rescheduling": (
        ["exit", "job-rescheduling"],
        {"TASKD_PROCESS_ENABLE": "off"},
        {"PROCESS_RECOVER", "HCCL_ASYNC_ERROR_HANDLING"},
    ),
    "pod-rescheduling-pytorch": (
        ["exit", "pod-rescheduling", "job-rescheduling"],
        {"TASKD_PROCESS_ENABLE": "off"},
        {"PROCESS_RECOVER", "MS_ENABLE_TFT"},
    ),
    "pod-rescheduling-mindspore": (
        ["exit", "pod-rescheduling", "job-rescheduling"],
        {"MS_ENABLE_TFT": "{RSC:1}", "TASKD_PROCESS_ENABLE": "off"},
        {"PROCESS_RECOVER"},
    ),
    "process-recover": (
        ["recover", "exit", "job-rescheduling"],
        {
            "PROCESS_RECOVER": "on",
            "ELASTIC_PROCESS_RECOVER_ENABLE": "1",
            "HIGH_AVAILABILITY": "recover",
            "HCCL_ASYNC_ERROR_HANDLING": "0",
            "TORCH_NCCL_ASYNC_ERROR_HANDLING": "0",
        },
        {"ENABLE_RESTART_FAULT_PROCESS"},
    ),
    "process-recover-in-place": (
        ["recover-in-place", "exit", "job-rescheduling"],
        {
            "PROCESS_RECOVER": "on",
            "ENABLE_RESTART_FAULT_PROCESS": "on",
            "HIGH_AVAILABILITY": "recover",
        },
        set(),
    ),
    "online-recovery-pytorch": (
        ["op-retry", "retry", "exit", "job-rescheduling"],
        {
            "HIGH_AVAILABILITY": "retry",
            "HCCL_OP_RETRY_ENABLE": "L0:0, L1:1, L2:1",
            "HCCL_ASYNC_ERROR_HANDLING": "0",
        },
        set(),
    ),
    "online-recovery-mindspore": (
        ["op-retry", "retry", "exit", "job-rescheduling"],
        {"MS_ENABLE_TFT": "{UCE:1,HCCE:1}", "MINDIO_FOR_MINDSPORE": "1"},
        {"HIGH_AVAILABILITY"},
    ),
    "op-retry": (
        ["op-retry", "exit", "job-rescheduling"],
        {"HCCL_OP_RETRY_PARAMS": "MaxCnt:3, HoldTime:5000, IntervalTime:1000"},
        {"PROCESS_RECOVER"},
    ),
    "link-failover-pytorch": (
        ["op-retry", "retry", "exit", "job-rescheduling"],
        {"HIGH_AVAILABILITY": "retry"},
        set(),
    ),
    "link-failover-mindspore": (
        ["op-retry", "retry", "exit", "job-rescheduling"],
        {"MS_ENABLE_TFT": "{TTP:1,UCE:1,HCCE:1,TSP:1}"},
        set(),
    ),
    "graceful-fault-tolerance": (
        ["exit", "job-rescheduling"],
        {"MS_ENABLE_TFT": "{RSC:1}"},
        {"PROCESS_RECOVER"},
    ),
    "stress-test-pytorch": (
        ["recover", "exit", "job-rescheduling"],
        {"HIGH_AVAILABILITY": "recover"},
        set(),
    ),
    "stress-test-mindspore": (
        ["recover", "exit", "job-rescheduling"],
        {"MS_ENABLE_TFT": "{TTP:1,ARF:1,TSP:1}"},
        set(),
    ),
    "hot-switch": (
        ["exit"],
        {
            "TASKD_PROCESS_ENABLE": "on",
            "PROCESS_RECOVER": "on",
            "HIGH_AVAILABILITY": "recover",
            "HCCL_ASYNC_ERROR_HANDLING": "0",
        },
        {"ELASTIC_PROCESS_RECOVER_ENABLE", "ENABLE_RESTART_FAULT_PROCESS", "MS_ENABLE_TFT"},
    ),
    "elastic-training": (
        ["elastic-training", "exit", "job-rescheduling"],
        {
            "PROCESS_RECOVER": "on",
            "HIGH_AVAILABILITY": "elastic-training",
            "MINDIO_WAIT_MINDX_TIME": "60",
        },
        {"ELASTIC_PROCESS_RECOVER_ENABLE"},
    ),
    "last-words-vcjob": (
        ["retry", "recover", "dump", "exit", "pod-rescheduling", "job-rescheduling"],
        {
            "HIGH_AVAILABILITY": "retry,recover,dump",
            "RANK": "1",
            "WORLD_SIZE": "3",
            "MASTER_ADDR": "last-words-master-0",
            "MASTER_PORT": "29500",
            "MINDX_TASK_ID": "last-words",
        },
        set(),
    ),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_seed_values(name: str) -> None:
    ladder, present, absent = EXPECTED[name]
    result = planned(SEED / f"{name}.yaml")
    assert result["ladder"] == ladder
    worker = next(p for p in result["pods"] if p["replica_type"] == "Worker")
    assert {k: worker["env"].get(k) for k in present} == present
    assert not absent & set(worker["env"])


def test_taskd_port_on_every_pod_that_needs_it() -> None:
    for name in ("pod-rescheduling-pytorch", "process-recover", "hot-switch", "last-words-vcjob"):
        for pod in planned(SEED / f"{name}.yaml")["pods"]:
            assert {"containerPort": 9601, "name": "taskd-port", "protocol": "TCP"} in pod["ports"]
    for pod in planned(SEED / "job-rescheduling.yaml")["pods"]:
        assert pod["ports"] == []
    ports = planned(SEED / "last-words-vcjob.yaml")["pods"][0]["ports"]
    assert {"containerPort": 9602, "name": "lastwords-port", "protocol": "TCP"} in ports


def test_graceful_fault_tolerance_is_sunset_and_read_from_the_args_string() -> None:
    result = planned(SEED / "graceful-fault-tolerance.yaml")
    assert result["cluster"]["hot_reset"] == 1
    assert result["cluster"]["list_watch_period_s"] == 5.0
    assert "graceful-fault-tolerance" in result["modes"]
    assert any("hotReset=1 (graceful fault tolerance) is sunset" in w for w in result["warnings"])


def test_vcjob_pods_are_named_by_task_master_first() -> None:
    pods = planned(SEED / "last-words-vcjob.yaml")["pods"]
    assert [(p["name"], p["node_rank"]) for p in pods] == [
        ("last-words-master-0", 0),
        ("last-words-worker-0", 1),
        ("last-words-worker-1", 2),
    ]
    assert pods[1]["launcher"]["max_restarts"] == 32767  # 0 under process recovery
    assert pods[1]["launcher"]["monitor_interval_s"] == 1.0
