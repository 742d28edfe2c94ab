"""The seed's Table 3 (env the operator injects, both framework rows) and Table 1 (parameters
each mode needs, all seven columns), typed in from the seed independently of the code's tables."""

from __future__ import annotations

from pathlib import Path

import pytest

from unbroken.operator import Mode, plan
from unbroken.operator.podenv import hot_switch_env
from unbroken.spec import ClusterSpec, DevicePlugin, HotReset, load_cluster, parse_job
from unbroken.spec.envknobs import parse_ms_enable_tft
from unbroken.spec.injected_env import PROCESS_RUNGS, injected_env, switched_off
from unbroken.spec.knobs import Framework, Strategy

pytestmark = pytest.mark.unit

# Table 3, as printed in the seed (column -> PyTorch row, MindSpore row).
TABLE_3: dict[str, tuple[dict[str, str], dict[str, str]]] = {
    "recover": (
        {
            "PROCESS_RECOVER": "on",
            "ELASTIC_PROCESS_RECOVER_ENABLE": "1",
            "HIGH_AVAILABILITY": "recover",
        },
        {
            "PROCESS_RECOVER": "on",
            "ELASTIC_PROCESS_RECOVER_ENABLE": "1",
            "MINDIO_FOR_MINDSPORE": "1",
            "MS_ENABLE_TFT": "{ ARF:1}",
        },
    ),
    "retry": (
        {
            "PROCESS_RECOVER": "on",
            "ELASTIC_PROCESS_RECOVER_ENABLE": "1",
            "HIGH_AVAILABILITY": "retry",
        },
        {
            "PROCESS_RECOVER": "on",
            "ELASTIC_PROCESS_RECOVER_ENABLE": "1",
            "MINDIO_FOR_MINDSPORE": "1",
            "MS_ENABLE_TFT": "{ UCE:1, HCCE:1}",
        },
    ),
    "recover-in-place": (
        {
            "PROCESS_RECOVER": "on",
            "ELASTIC_PROCESS_RECOVER_ENABLE": "1",
            "ENABLE_RESTART_FAULT_PROCESS": "on",
            "HIGH_AVAILABILITY": "recover",
        },
        {
            "PROCESS_RECOVER": "on",
            "ELASTIC_PROCESS_RECOVER_ENABLE": "1",
            "ENABLE_RESTART_FAULT_PROCESS": "on",
            "MINDIO_FOR_MINDSPORE": "1",
            "MS_ENABLE_TFT": "{ ARF:1}",
        },
    ),
    "elastic-training": (
        {"PROCESS_RECOVER": "on", "HIGH_AVAILABILITY": "elastic-training"},
        {},
    ),
    "dump": (
        {
            "PROCESS_RECOVER": "on",
            "ELASTIC_PROCESS_RECOVER_ENABLE": "1",
            "HIGH_AVAILABILITY": "dump",
        },
        {
            "PROCESS_RECOVER": "on",
            "ELASTIC_PROCESS_RECOVER_ENABLE": "1",
            "MINDIO_FOR_MINDSPORE": "1",
            "MS_ENABLE_TFT": "{ TTP:1}",
        },
    ),
    "exit": ({}, {}),
    "pod-rescheduling": ({}, {"MS_ENABLE_TFT": "{ RSC:1}"}),
}


def _normalise(env: dict[str, str]) -> dict[str, object]:
    return {k: parse_ms_enable_tft(v) if k == "MS_ENABLE_TFT" else v for k, v in env.items()}


@pytest.mark.parametrize("column", list(TABLE_3))
@pytest.mark.parametrize("framework", [Framework.PYTORCH, Framework.MINDSPORE])
def test_table_3(column: str, framework: Framework) -> None:
    pytorch, mindspore = TABLE_3[column]
    expected = pytorch if framework is Framework.PYTORCH else mindspore
    if column == "pod-rescheduling":
        got = injected_env((), framework, pod_rescheduling=True)
    else:
        got = injected_env((Strategy(column),), framework, pod_rescheduling=False)
    assert _normalise(got) == _normalise(expected)


def test_several_strategies_union_the_columns() -> None:
    env = injected_env(
        (Strategy.RETRY, Strategy.RECOVER, Strategy.DUMP, Strategy.EXIT), Framework.MINDSPORE, True
    )
    assert env["MS_ENABLE_TFT"] == "{TTP:1,UCE:1,HCCE:1,ARF:1,RSC:1}"
    env = injected_env(
        (Strategy.RETRY, Strategy.RECOVER_IN_PLACE, Strategy.DUMP), Framework.PYTORCH, False
    )
    assert env["HIGH_AVAILABILITY"] == "retry,recover,dump"
    assert env["ENABLE_RESTART_FAULT_PROCESS"] == "on"


def test_hot_switching_adds_the_reference_process_recovery_environment() -> None:
    """``subHealthyStrategy: hotSwitch`` gets what the reference operator injects for it,
    merged with the strategies' values (never a second ``recover``)."""
    assert hot_switch_env({}, Framework.PYTORCH) == {
        "PROCESS_RECOVER": "on",
        "HIGH_AVAILABILITY": "recover",
    }
    assert hot_switch_env({}, Framework.MINDSPORE) == {
        "PROCESS_RECOVER": "on",
        "MS_ENABLE_TFT": "{ARF:1}",
    }
    strategies = (Strategy.RETRY, Strategy.DUMP, Strategy.EXIT)
    pytorch = injected_env(strategies, Framework.PYTORCH, False)
    assert hot_switch_env(pytorch, Framework.PYTORCH)["HIGH_AVAILABILITY"] == "retry,recover,dump"
    recovering = injected_env((Strategy.RECOVER,), Framework.PYTORCH, False)
    assert hot_switch_env(recovering, Framework.PYTORCH)["HIGH_AVAILABILITY"] == "recover"
    mindspore = injected_env(strategies, Framework.MINDSPORE, True)
    assert hot_switch_env(mindspore, Framework.MINDSPORE)["MS_ENABLE_TFT"] == (
        "{TTP:1,UCE:1,HCCE:1,ARF:1,RSC:1}"
    )


# Table 1, column by column, as printed in the seed.
TABLE_1_COLUMNS: dict[Mode, set[str]] = {
    Mode.JOB_RESCHEDULING: {"fault-scheduling", "fault-retry-times"},
    Mode.POD_RESCHEDULING: {
        "fault-scheduling",
        "pod-rescheduling",
        "max_restarts",
        "monitor_interval",
        "fault-retry-times",
    },
    Mode.RECOVER: {
        "fault-scheduling",
        "process-recover-enable",
        "recover-strategy",
        "PROCESS_RECOVER",
        "ELASTIC_PROCESS_RECOVER_ENABLE",
        "--enable-high-availability",
        "--enable-worker-reboot",
        "max_restarts",
        "monitor_interval",
        "fault-retry-times",
    },
    Mode.RECOVER_IN_PLACE: {
        "fault-scheduling",
        "process-recover-enable",
        "recover-strategy",
        "PROCESS_RECOVER",
        "ENABLE_RESTART_FAULT_PROCESS",
        "ELASTIC_PROCESS_RECOVER_ENABLE",
        "--enable-high-availability",
        "--enable-worker-reboot",
        "max_restarts",
        "monitor_interval",
    },
    Mode.RETRY: {
        "fault-scheduling",
        "process-recover-enable",
        "recover-strategy",
        "PROCESS_RECOVER",
        "ELASTIC_PROCESS_RECOVER_ENABLE",
        "--enable-high-availability",
        "--enable-hbmfault-repair",
        "max_restarts",
        "monitor_interval",
    },
    Mode.GRACEFUL: {"hotReset"},
    Mode.ELASTIC_TRAINING: {
        "fault-scheduling",
        "process-recover-enable",
        "recover-strategy",
        "PROCESS_RECOVER",
        "--enable-high-availability",
        "--enable-elastic-training",
        "fault-retry-times",
    },
}

JOB = """\
kind: AscendJob
metadata:
  name: t1
  labels:
    fault-scheduling: "{scheduling}"
    fault-retry-times: "2"
{labels}
  annotations:
{annotations}
spec:
  replicaSpecs:
    Master:
      template:
        spec:
          containers:
            - name: ascend
              env:
                - name: MINDIO_WAIT_MINDX_TIME
                  value: "60"
              command: ["torchrun", "--nproc_per_node=1", "train.py"]
    Worker:
      template:
        spec:
          containers:
            - name: ascend
              env:
                - name: MINDIO_WAIT_MINDX_TIME
                  value: "60"
              command: ["torchrun", "--nproc_per_node=1", "train.py"]
"""

MODE_JOBS: dict[Mode, tuple[str, str, str]] = {
    Mode.JOB_RESCHEDULING: ("force", "", ""),
    Mode.POD_RESCHEDULING: ("force", '    pod-rescheduling: "on"', ""),
    Mode.RECOVER: ("grace", "", '    recover-strategy: "recover"'),
    Mode.RECOVER_IN_PLACE: ("grace", "", '    recover-strategy: "recover-in-place"'),
    Mode.RETRY: ("grace", "", '    recover-strategy: "retry"'),
    Mode.GRACEFUL: ("force", "", ""),
    Mode.ELASTIC_TRAINING: ("grace", "", '    recover-strategy: "elastic-training"'),
}


@pytest.mark.parametrize("mode", list(Mode))
def test_table_1_column(mode: Mode) -> None:
    scheduling, labels, annotations = MODE_JOBS[mode]
    text = JOB.format(scheduling=scheduling, labels=labels, annotations=annotations)
    job = parse_job(text, Path("t1.yaml"))
    if mode is Mode.GRACEFUL:
        cluster = ClusterSpec(
            nodes=3, devices_per_node=1, device_plugin=DevicePlugin(hot_reset=HotReset.GRACEFUL)
        )
    else:
        cluster = load_cluster(None, job)
    result = plan(job, cluster)
    rows = [r for r in result.required if r.mode is mode]
    assert {r.parameter for r in rows} == TABLE_1_COLUMNS[mode]
    assert all(r.present for r in rows), [r for r in rows if not r.present]
    # Every chosen mode lists itself; process modes ride on job-level rescheduling.
    assert mode.value in result.to_json()["modes"]


def test_missing_fault_retry_times_is_reported_not_invented() -> None:
    text = JOB.format(scheduling="force", labels="", annotations="").replace(
        '    fault-retry-times: "2"\n', ""
    )
    job = parse_job(text, Path("t1.yaml"))
    result = plan(job, load_cluster(None, job))
    (row,) = [r for r in result.required if r.parameter == "fault-retry-times"]
    assert (row.present, row.value, row.source) == (False, None, "missing")
    assert any("fault-retry-times: not set" in w for w in result.warnings)


@pytest.mark.parametrize(
    ("environ", "off"),
    [
        ({}, {}),
        ({"PROCESS_RECOVER": "on", "ENABLE_RESTART_FAULT_PROCESS": "on"}, {}),
        ({"TASKD_PROCESS_ENABLE": "on"}, {}),
        (
            {"PROCESS_RECOVER": "off"},
            {s: "PROCESS_RECOVER=off" for s in PROCESS_RUNGS},
        ),
        (
            {"TASKD_PROCESS_ENABLE": " off ", "PROCESS_RECOVER": "off"},
            {s: "TASKD_PROCESS_ENABLE=off" for s in PROCESS_RUNGS},
        ),
        (
            {"PROCESS_RECOVER": "on", "ENABLE_RESTART_FAULT_PROCESS": "off"},
            {Strategy.RECOVER_IN_PLACE: "ENABLE_RESTART_FAULT_PROCESS=off"},
        ),
        ({"PROCESS_RECOVER": "yes"}, {s: "PROCESS_RECOVER=yes" for s in PROCESS_RUNGS}),
    ],
)
def test_switches_a_pods_environment_turns_off(
    environ: dict[str, str], off: dict[Strategy, str]
) -> None:
    assert switched_off(environ) == off
    assert Strategy.EXIT not in switched_off(environ)
