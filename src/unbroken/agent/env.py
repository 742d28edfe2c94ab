"""The environment a rank process starts with: torchrun's variables plus Unbroken's own.

``TORCHELASTIC_USE_AGENT_STORE=True`` makes a plain ``dist.init_process_group("gloo")`` connect
as a *client* to the rendezvous store at MASTER_ADDR:MASTER_PORT instead of rank 0 hosting it.
torch 2.13 puts no per-attempt prefix on the keys of that store, so every generation gets a
store of its own (a new MASTER_PORT): a restarted world never reads a dead rank's address.
``TORCHELASTIC_RESTART_COUNT`` carries the generation for scripts that look at it. With the
store on a loopback address (a job on one machine), ``GLOO_SOCKET_IFNAME=lo`` keeps the ranks'
own gloo sockets on loopback too, unless the user set an interface.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from pathlib import Path

from unbroken.agent.launcher import LaunchArgs

#: The pod's GPUs, one index into its CUDA_VISIBLE_DEVICES per local rank (the job manager's),
#: and the one of this rank (:mod:`unbroken.worker.device` reads it).
CUDA_DEVICES = "UNBROKEN_CUDA_DEVICES"
CUDA_DEVICE = "UNBROKEN_CUDA_DEVICE"
#: Variables that give access to the control plane; ranks never see them.
CONTROL_VARS = ("UNBROKEN_CONTROL", "UNBROKEN_SECRET", "UNBROKEN_CREDENTIALS")


def rank_env(
    base: Mapping[str, str],
    args: LaunchArgs,
    local_rank: int,
    generation: int,
    heartbeat_file: Path | None,
) -> dict[str, str]:
    env = {k: v for k, v in base.items() if k not in CONTROL_VARS}
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(
        {
            "RANK": str(args.global_rank(local_rank)),
            "LOCAL_RANK": str(local_rank),
            "WORLD_SIZE": str(args.world_size),
            "LOCAL_WORLD_SIZE": str(args.nproc_per_node),
            "GROUP_RANK": str(args.node_rank),
            "ROLE_RANK": str(args.global_rank(local_rank)),
            "ROLE_WORLD_SIZE": str(args.world_size),
            "ROLE_NAME": "default",
            "MASTER_ADDR": args.master_addr,
            "MASTER_PORT": str(args.master_port),
            "TORCHELASTIC_USE_AGENT_STORE": "True",
            "TORCHELASTIC_RESTART_COUNT": str(generation),
            "TORCHELASTIC_MAX_RESTARTS": str(args.max_restarts),
            "TORCHELASTIC_RUN_ID": args.run_id,
            "UNBROKEN_GENERATION": str(generation),
        }
    )
    if heartbeat_file is not None:
        env["UNBROKEN_HEARTBEAT_FILE"] = str(heartbeat_file)
    cuda = _local_cuda_device(env.get(CUDA_DEVICES, ""), local_rank)
    if cuda is not None:  # this rank's GPU among the pod's (unbroken.worker.device)
        env[CUDA_DEVICE] = cuda
    if _loopback(args.master_addr) and not any(k in env for k in _IFNAME_VARS):
        # A job on one machine: gloo's own listening sockets stay on loopback too (torch
        # otherwise binds them to the address of the machine's host name).
        env["GLOO_SOCKET_IFNAME"] = "lo"
    return env


_IFNAME_VARS = ("GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME")


def _loopback(addr: str) -> bool:
    try:
        return ipaddress.ip_address(addr).is_loopback
    except ValueError:
        return addr == "localhost"


def _local_cuda_device(pod_devices: str, local_rank: int) -> str | None:
    """This local rank's entry of a pod's ``UNBROKEN_CUDA_DEVICES`` (None: the pod has none)."""
    entries = [e.strip() for e in pod_devices.split(",") if e.strip()]
    return entries[local_rank % len(entries)] if entries else None
