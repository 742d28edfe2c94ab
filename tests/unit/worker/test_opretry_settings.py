"""Which ranks re-execute a failed gradient all-reduce: HCCL_OP_RETRY_* and the level rule.

Pure logic: importing these modules must not import torch (checked below).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from unbroken.spec.knobs import RetryLevel
from unbroken.worker.heartbeat import pack_op_retry, unpack_op_retry
from unbroken.worker.linkfault import _address
from unbroken.worker.opretry import (
    OpRetrySettings,
    collective_level,
    op_retry_from_environ,
    retry_config_from_environ,
)

pytestmark = pytest.mark.unit

TWO_PODS = {"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2"}


def test_the_level_is_the_widest_span_of_the_group() -> None:
    assert collective_level(4, 2) is RetryLevel.L1  # two nodes
    assert collective_level(4, 4) is RetryLevel.L0  # one node
    assert collective_level(1, 1) is RetryLevel.L0
    with pytest.raises(ValueError, match="at least one rank per node"):
        collective_level(4, 0)


def test_enabled_for_the_groups_level_with_the_given_parameters() -> None:
    env = {
        **TWO_PODS,
        "HCCL_OP_RETRY_ENABLE": "L0:0, L1:1, L2:1",
        "HCCL_OP_RETRY_PARAMS": "MaxCnt:3, HoldTime:200, IntervalTime:50",
    }
    assert op_retry_from_environ(env) == OpRetrySettings(RetryLevel.L1, 3, 0.2, 0.05)


@pytest.mark.parametrize(
    ("ranks", "level"),
    [
        ([0, 1], RetryLevel.L0),  # a mesh's shard dimension: one pod, one node
        ([2, 3], RetryLevel.L0),
        ([0, 2], RetryLevel.L1),  # its replica dimension: across pods
        ([1, 3], RetryLevel.L1),
        ([0, 1, 2, 3], RetryLevel.L1),  # the default group
        ([3], RetryLevel.L0),
    ],
)
def test_each_groups_level_comes_from_the_nodes_of_its_ranks(
    ranks: list[int], level: RetryLevel
) -> None:
    retry = retry_config_from_environ({**TWO_PODS, "HCCL_OP_RETRY_ENABLE": "L0:0, L1:1"})
    assert retry is not None
    assert retry.level_of(ranks) is level
    settings = retry.settings_for(ranks)
    if level is RetryLevel.L1:
        assert settings == OpRetrySettings(RetryLevel.L1, 1, 5.0, 1.0)
    else:
        assert settings is None  # L0 is off: its collectives fail the step


def test_a_job_enabling_no_level_has_no_op_retry() -> None:
    assert retry_config_from_environ({**TWO_PODS, "HCCL_OP_RETRY_ENABLE": "L0:0, L1:0"}) is None
    assert retry_config_from_environ(TWO_PODS) is None
    with pytest.raises(ValueError, match="HCCL_OP_RETRY_PARAMS"):
        retry_config_from_environ(
            {**TWO_PODS, "HCCL_OP_RETRY_ENABLE": "L1:1", "HCCL_OP_RETRY_PARAMS": "MaxCnt:99"}
        )


def test_defaults_apply_to_parameters_not_given() -> None:
    env = {**TWO_PODS, "HCCL_OP_RETRY_ENABLE": "L1:1"}
    assert op_retry_from_environ(env) == OpRetrySettings(RetryLevel.L1, 1, 5.0, 1.0)
    env["HCCL_OP_RETRY_PARAMS"] = "IntervalTime:10"
    assert op_retry_from_environ(env) == OpRetrySettings(RetryLevel.L1, 1, 5.0, 0.01)


@pytest.mark.parametrize(
    "env",
    [
        {},  # not configured
        {"HCCL_OP_RETRY_ENABLE": "L0:0, L1:1, L2:1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "4"},
        {"HCCL_OP_RETRY_ENABLE": "L0:1, L1:0", **TWO_PODS},
        {"HCCL_OP_RETRY_ENABLE": "L2:1", **TWO_PODS},  # no super-nodes here
    ],
)
def test_off_when_the_groups_level_is_not_enabled(env: dict[str, str]) -> None:
    assert op_retry_from_environ(env) is None


def test_one_node_without_local_world_size_is_l0() -> None:
    env = {"HCCL_OP_RETRY_ENABLE": "L0:1", "WORLD_SIZE": "3"}
    assert op_retry_from_environ(env) == OpRetrySettings(RetryLevel.L0, 1, 5.0, 1.0)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"HCCL_OP_RETRY_ENABLE": "L1:2"}, r"HCCL_OP_RETRY_ENABLE='L1:2': .*level L1"),
        ({"HCCL_OP_RETRY_ENABLE": "L3:1"}, r"HCCL_OP_RETRY_ENABLE='L3:1': .*unknown level"),
        ({"HCCL_OP_RETRY_ENABLE": ""}, r"HCCL_OP_RETRY_ENABLE='': .*empty"),
        (
            {"HCCL_OP_RETRY_ENABLE": "L1:1", "HCCL_OP_RETRY_PARAMS": "MaxCnt:11"},
            r"HCCL_OP_RETRY_PARAMS='MaxCnt:11': .*out of range",
        ),
        (
            {"HCCL_OP_RETRY_ENABLE": "L1:1", "HCCL_OP_RETRY_PARAMS": "HoldTime:5s"},
            r"HCCL_OP_RETRY_PARAMS='HoldTime:5s': .*whole number",
        ),
        ({"HCCL_OP_RETRY_ENABLE": "L1:1", "WORLD_SIZE": "x"}, r"WORLD_SIZE='x'"),
    ],
)
def test_a_malformed_value_is_an_error_naming_the_variable(
    env: dict[str, str], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        op_retry_from_environ({**TWO_PODS, **env})


def test_the_heartbeat_packs_step_attempt_and_level_readably() -> None:
    assert pack_op_retry(12, 1, 1) == 12011
    assert unpack_op_retry(pack_op_retry(4321, 10, 2)) == (4321, 10, 2)
    with pytest.raises(ValueError):
        pack_op_retry(1, 0, 1)


def test_proc_net_tcp_addresses_are_decoded() -> None:
    assert _address("0100007F:1F90") == ("127.0.0.1", 8080)
    assert _address("0000000000000000FFFF00000100007F:0050") == ("127.0.0.1", 80)
    assert _address("00000000000000000000000001000000:0016") == ("::1", 22)


def test_the_settings_import_no_torch() -> None:
    code = (
        "import sys\nimport unbroken.worker.opretry, unbroken.worker.linkfault\n"
        "print('torch' in sys.modules, 'yaml' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=60
    )
    assert out.stdout.split() == ["False", "False"]
