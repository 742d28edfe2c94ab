"""What the job manager runs: the job's pods and the cluster, as plain values.

Built from the operator's plan by the CLI (``unbroken run``); the manager does not parse YAML.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from unbroken.devices.sim import RESET_S_DEFAULT
from unbroken.spec.knobs import FaultHandling, Framework


@dataclass(frozen=True)
class PodLayout:
    name: str
    node_rank: int
    nproc: int
    env: Mapping[str, str] = field(default_factory=dict)

    @property
    def devices_needed(self) -> int:
        return self.nproc


@dataclass(frozen=True)
class JobLayout:
    job_id: str
    pods: tuple[PodLayout, ...]
    script: str
    script_args: tuple[str, ...]
    fault_handling: FaultHandling
    workdir: Path
    master_port: int | None = None  # None: any free port
    total_steps: int | None = None
    min_pods: int | None = None  # elastic training's minimum (minReplicas); None: every pod
    #: MindSpore: the ranks form MindSpore's dynamic cluster (a Scheduler process per
    #: generation, unbroken.agent.mindspore) instead of a torch rendezvous store.
    framework: Framework = Framework.PYTORCH

    @cached_property
    def world_size(self) -> int:
        # Read per report and per tick: a sum over 10k pods each time was most of the
        # manager's work while a large job's agents reported in.
        return sum(p.nproc for p in self.pods)

    @property
    def nproc_per_node(self) -> int:
        return self.pods[0].nproc

    @cached_property
    def _by_name(self) -> dict[str, PodLayout]:
        # An index, not a scan per call: the world's ranks are listed per pod on every tick
        # (unbroken.manager.elastic), which a scan made quadratic in the pods.
        return {p.name: p for p in self.pods}

    @cached_property
    def _by_rank(self) -> dict[int, str]:
        return {
            r: p.name
            for p in self.pods
            for r in range(p.node_rank * p.nproc, (p.node_rank + 1) * p.nproc)
        }

    def ranks_of(self, pod: str) -> tuple[int, ...]:
        p = self._by_name.get(pod)
        if p is None:
            raise ValueError(f"no pod {pod!r} in job {self.job_id}")
        return tuple(range(p.node_rank * p.nproc, (p.node_rank + 1) * p.nproc))

    def nproc_of(self, pod: str) -> int:
        p = self._by_name.get(pod)
        if p is None:
            raise ValueError(f"no pod {pod!r} in job {self.job_id}")
        return p.nproc

    def pod_of_rank(self, rank: int) -> str | None:
        return self._by_rank.get(rank)


@dataclass(frozen=True)
class ClusterLayout:
    nodes: tuple[str, ...]
    devices_per_node: int
    list_watch_period_s: float = 5.0
    auto_stowing: bool = True
    code_table: Path | None = None  # a user override of the fault code table
    #: ``-hotReset=2``: a device whose fault level resets it is reset (offline: out of the pool
    #: for ``reset_s``) before it is used again.
    offline_reset: bool = False
    reset_s: float = RESET_S_DEFAULT
    #: Where device health comes from: ``sim`` or ``nvml`` (this machine's GPUs, laid under the
    #: nodes' device slots by :func:`unbroken.devices.nvml.slots_on_gpus`).
    device_provider: str = "sim"
    #: ``hotReset: 2`` on ``nvml``: the command that resets one GPU
    #: (:mod:`unbroken.devices.gpureset`).
    reset_command: str = ""
    #: The machine's GPUs the device slots run on (NVML indices; :func:`unbroken.devices.nvml
    #: .machine_gpus`), empty where there is none: each pod gets those of its slots as
    #: ``CUDA_VISIBLE_DEVICES``.
    gpus: tuple[int, ...] = ()


@dataclass(frozen=True)
class ManagerOptions:
    """Detection settings (DESIGN section 3). Durations in seconds."""

    agent_timeout_s: float = 2.0  # an agent silent this long: its node is lost
    agent_start_timeout_s: float = 20.0  # an agent that never said hello
    settle_s: float = 0.5  # wait this long for the first fault after an echo of it
    # A rank silent (tick and progress) for hang_factor of its step times, measured online by
    # its agent, is hung; never less than hang_floor_s (jitter), and hang_startup_s before its
    # step time is known (unbroken.agent.hang).
    hang_factor: float = 3.0
    hang_floor_s: float = 0.5
    hang_startup_s: float = 3.0
    progress_every: int = 20  # a StepProgress event every N committed steps
    metrics_port: int = 0  # of the metrics and dashboard endpoint (0: a free port)
