"""The environment a rank starts with: gloo stays on loopback for a job on one machine."""

from __future__ import annotations

import pytest

from unbroken.agent.env import CONTROL_VARS, rank_env
from unbroken.agent.launcher import parse_launch_args

pytestmark = pytest.mark.unit


def _env(master_addr: str, base: dict[str, str] | None = None) -> dict[str, str]:
    args = parse_launch_args(
        ["--nproc_per_node=2", f"--master_addr={master_addr}", "--master_port=29500", "t.py"]
    )
    return rank_env(base or {}, args, local_rank=1, generation=3, heartbeat_file=None)


@pytest.mark.parametrize("addr", ["127.0.0.1", "127.0.1.1", "localhost", "::1"])
def test_a_loopback_store_keeps_gloo_on_loopback(addr: str) -> None:
    env = _env(addr)
    assert env["GLOO_SOCKET_IFNAME"] == "lo"
    assert (env["RANK"], env["TORCHELASTIC_RESTART_COUNT"]) == ("1", "3")


def test_a_store_on_the_network_leaves_gloo_to_torch() -> None:
    assert "GLOO_SOCKET_IFNAME" not in _env("192.0.2.10")


def test_the_users_interface_wins_and_control_variables_stay_out() -> None:
    base = {"GLOO_SOCKET_IFNAME": "eth1", "UNBROKEN_SECRET": "s", "UNBROKEN_CONTROL": "c"}
    env = _env("127.0.0.1", base)
    assert env["GLOO_SOCKET_IFNAME"] == "eth1"
    assert not any(k in env for k in CONTROL_VARS)


def test_a_rank_gets_its_gpu_among_the_pod_s() -> None:
    env = _env("127.0.0.1", {"CUDA_VISIBLE_DEVICES": "4,5", "UNBROKEN_CUDA_DEVICES": "1,0"})
    assert (env["CUDA_VISIBLE_DEVICES"], env["UNBROKEN_CUDA_DEVICE"]) == ("4,5", "0")
    assert "UNBROKEN_CUDA_DEVICE" not in _env("127.0.0.1")  # a pod without GPUs
