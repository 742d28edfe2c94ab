"""MindSpore ranks: the dynamic cluster ``msrun`` sets up, set up by the agent instead.

MindSpore's ranks find each other through a *Scheduler*: a process of the training script run
with ``MS_ROLE=MS_SCHED``, which ``mindspore.communication.init()`` turns into the cluster's
meta server (it exits when the workers are done). Each worker runs with ``MS_ROLE=MS_WORKER``,
the Scheduler's address (``MS_SCHED_HOST``/``MS_SCHED_PORT``), the world size
(``MS_WORKER_NUM``) and its own rank (``MS_NODE_ID``), as ``msrun`` gives them.

Under Unbroken, the job's address and port (``MASTER_ADDR``/``MASTER_PORT``, the generation's
own, as for a torch rendezvous store) are the Scheduler's, and the agent of the pod of node rank
0 (the one whose address is ``MS_SCHED_HOST``: the seed's ``if [[ "${MS_SCHED_HOST}" ==
"${POD_IP}" ]]``) runs it beside its ranks, one per generation: a restart of the ranks is a new
cluster with a new Scheduler. A MindSpore rank cannot join a cluster that lost a member (its
dynamic-cluster recovery runs on GPUs in graph mode only), so every restart restarts all of
them; the ranks say so in their heartbeat (:mod:`unbroken.mindspore.session`).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from unbroken.agent.children import claim, release
from unbroken.agent.env import CONTROL_VARS
from unbroken.agent.launcher import LaunchArgs
from unbroken.agent.ranks import rank_argv
from unbroken.spec.envknobs import ms_comm_op_timeout_s, ms_last_words_on

log = logging.getLogger(__name__)

#: What a MindSpore rank writing last words has, once its collective gave up.
LAST_WORDS_S = 30.0
#: Set by the job manager on a MindSpore job's agents.
FRAMEWORK = "UNBROKEN_FRAMEWORK"
MINDSPORE = "mindspore"


def is_mindspore(env: Mapping[str, str]) -> bool:
    return env.get(FRAMEWORK) == MINDSPORE


def last_words_hold_s(env: Mapping[str, str]) -> float:
    """How long a restart leaves a MindSpore rank blocked in a collective alone when
    ``MS_ENABLE_TFT`` turns on last words (``TTP:1``): its collective gives up on the dead peer
    (``MS_CPU_COMM_OP_TIMEOUT``), then it writes them (:mod:`unbroken.mindspore.session`).
    0 for every other job: a blocked rank is killed at once."""
    if not is_mindspore(env) or not ms_last_words_on(env):
        return 0.0
    return ms_comm_op_timeout_s(env) + 2.0


def last_words_grace_s(env: Mapping[str, str]) -> float | None:
    """How long a restart gives MindSpore ranks after SIGTERM when last words are on: the hold,
    then the time to write them. None: SIGKILL at once (every other job: a torch rank's last
    words are asked for before the restart, by the job manager)."""
    hold_s = last_words_hold_s(env)
    return hold_s + LAST_WORDS_S if hold_s else None


def cluster_env(args: LaunchArgs) -> dict[str, str]:
    """The variables every process of the generation's cluster has."""
    return {
        "MS_SCHED_HOST": args.master_addr,
        "MS_SCHED_PORT": str(args.master_port),
        "MS_WORKER_NUM": str(args.world_size),
        # MindSpore's cluster waits this long (s) for every member to register.
        "MS_TOPO_TIMEOUT": os.environ.get("MS_TOPO_TIMEOUT", "120"),
    }


def worker_env(args: LaunchArgs, rank: int, local_rank: int) -> dict[str, str]:
    """A rank's variables, as ``msrun`` gives them (``RANK_ID``/``DEVICE_ID`` for the
    scripts that read the older names)."""
    return {
        **cluster_env(args),
        "MS_ROLE": "MS_WORKER",
        "MS_NODE_ID": str(rank),
        "RANK_ID": str(rank),
        "RANK_SIZE": str(args.world_size),
        "DEVICE_ID": str(local_rank),
    }


class Scheduler:
    """The generation's Scheduler process: the training script with ``MS_ROLE=MS_SCHED``."""

    def __init__(
        self, argv: Sequence[str], base_env: Mapping[str, str], args: LaunchArgs, log_path: Path
    ) -> None:
        env = dict(base_env)
        env.update(cluster_env(args))
        env["MS_ROLE"] = "MS_SCHED"
        for name in ("MS_NODE_ID", "UNBROKEN_HEARTBEAT_FILE", "UNBROKEN_MAILBOX"):
            env.pop(name, None)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("ab") as out:
            self.proc = subprocess.Popen(
                list(argv),
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        claim(self.proc.pid)  # waited for here, not by the agent's reaping of orphans
        log.info(
            "MindSpore scheduler pid %d at %s:%d", self.proc.pid, args.master_addr, args.master_port
        )

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, wait_s: float = 5.0) -> None:
        """End it (the ranks it served are gone): SIGTERM, then SIGKILL."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(wait_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        release(self.proc.pid)


class SchedulerSlot:
    """The Scheduler an agent runs (node rank 0's), one generation at a time."""

    def __init__(self) -> None:
        self.current: Scheduler | None = None

    def restart(self, args: LaunchArgs, pod_dir: Path) -> None:
        """The new generation's Scheduler, the old one ended first."""
        self.stop()
        argv = rank_argv(args.script, args.script_args, args.module, args.no_python)
        env = {k: v for k, v in os.environ.items() if k not in CONTROL_VARS}
        self.current = Scheduler(argv, env, args, pod_dir / "logs" / "scheduler.log")

    def stop(self) -> None:
        if self.current is not None:
            self.current.stop()
            self.current = None
