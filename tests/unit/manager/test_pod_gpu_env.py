"""What a pod is given of the machine's GPUs, as a device plugin exports it: its slots' GPUs
once each, and each local rank's index among them."""

from __future__ import annotations

import pytest

from unbroken.manager.engine import pod_gpu_env
from unbroken.manager.layout import ClusterLayout

pytestmark = pytest.mark.unit

NODES = ("node-0", "node-1", "node-2")


def test_a_gpu_per_slot() -> None:
    cluster = ClusterLayout(nodes=NODES, devices_per_node=2, gpus=(0, 1, 2, 3, 4, 5))
    assert pod_gpu_env(cluster, "node-1", (0, 1)) == {
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "CUDA_VISIBLE_DEVICES": "2,3",
        "UNBROKEN_CUDA_DEVICES": "0,1",
    }


def test_ranks_share_a_gpu_when_there_are_fewer_gpus_than_slots() -> None:
    cluster = ClusterLayout(nodes=NODES, devices_per_node=2, gpus=(0,))
    env = pod_gpu_env(cluster, "node-2", (1, 0))
    assert (env["CUDA_VISIBLE_DEVICES"], env["UNBROKEN_CUDA_DEVICES"]) == ("0", "0,0")


def test_the_user_s_visible_gpus_are_the_ones_laid_under_the_slots() -> None:
    cluster = ClusterLayout(nodes=NODES, devices_per_node=2, gpus=(6, 7))
    env = pod_gpu_env(cluster, "node-0", (1,))
    assert (env["CUDA_VISIBLE_DEVICES"], env["UNBROKEN_CUDA_DEVICES"]) == ("7", "0")


def test_no_gpus_no_cuda_variables() -> None:
    assert pod_gpu_env(ClusterLayout(nodes=NODES, devices_per_node=2), "node-0", (0, 1)) == {}
