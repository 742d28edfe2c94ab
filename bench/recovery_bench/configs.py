"""The benchmark's configurations (which tool, which job) and settings."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent  # bench/
JOBS = HERE / "jobs"
STEPLOG = HERE / "steplog.py"
WORLD = 4
PER_POD = 2  # ranks per pod: pod p holds ranks p*2 and p*2+1
VICTIM = 3
SCRIPT_NAME = "steplog.py"  # the job YAMLs name the training script by this file name

# torchrun's agent reacting to a dead worker (elastic/multiprocessing/api.py, agent/server/api.py)
TORCHRUN_REACTION = re.compile(r"failed \(exitcode|Worker group (FAILED|UNHEALTHY)|closing signal")


@dataclass(frozen=True)
class Config:
    key: str
    label: str
    tool: str  # "unbroken" or "torchrun"
    job: str | None = None  # YAML under bench/jobs (unbroken)
    no_share_store: bool = False  # torchrun: TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1
    fault: str = "kill"  # the chaos kind fired in rank 3 after step K (Unbroken only)
    cluster: str | None = None  # cluster YAML under bench/jobs (unbroken), else the default
    script_args: tuple[str, ...] = ()  # more arguments to bench/steplog.py
    baseline: str = ""  # the fault-free baseline whose digest it must end with; "": the tool's

    @property
    def reference(self) -> str:
        """The key of the baseline this configuration's final digest is compared with."""
        return self.baseline or self.tool


CONFIGS: tuple[Config, ...] = (
    Config("unbroken-job", "Unbroken job-level rescheduling", "unbroken", "job-level.yaml"),
    Config("unbroken-pod", "Unbroken pod-level rescheduling", "unbroken", "pod-level.yaml"),
    Config("unbroken-inpod", "Unbroken in-pod restart", "unbroken", "in-pod.yaml"),
    Config("unbroken-rip", "Unbroken recover-in-place", "unbroken", "recover-in-place.yaml"),
    Config("unbroken-recover", "Unbroken recover", "unbroken", "recover.yaml"),
    Config(
        "unbroken-retry",
        "Unbroken retry (device memory error)",
        "unbroken",
        "retry.yaml",
        fault="memory",
    ),
    Config("unbroken-dump", "Unbroken dump, then pod-level", "unbroken", "dump.yaml"),
    Config(
        "unbroken-hotswitch",
        "Unbroken hot switch (sub-healthy device)",
        "unbroken",
        "hot-switch.yaml",
        fault="subhealth",
        cluster="cluster-fast-watch.yaml",
    ),
    Config(
        "unbroken-straggler",
        "Unbroken hot switch (straggler: node at 5% of one CPU)",
        "unbroken",
        "straggler.yaml",
        fault="throttle",
        cluster="cluster-fast-watch.yaml",
        script_args=(f"--virtual-ranks={WORLD}",),
        baseline="unbroken-vranks",
    ),
    Config(
        "unbroken-stress",
        "Unbroken stress test (SDC device)",
        "unbroken",
        "recover.yaml",
        fault="sdc",
    ),
    Config(
        "unbroken-elastic",
        "Unbroken elastic-training (node lost, no spare)",
        "unbroken",
        "elastic.yaml",
        fault="node",
        cluster="cluster-no-spare.yaml",
        script_args=(f"--virtual-ranks={WORLD}",),
        baseline="unbroken-vranks",
    ),
    Config(
        "unbroken-hsdp-recover-in-place",
        "Unbroken recover-in-place, HSDP 2x2",
        "unbroken",
        "recover-in-place.yaml",
        script_args=("--parallel=hsdp",),
        baseline="unbroken-hsdp",
    ),
    Config(
        "unbroken-ddp-recover-in-place",
        "Unbroken recover-in-place, DDP (the HSDP job's model)",
        "unbroken",
        "recover-in-place.yaml",
        script_args=("--parallel=ddp",),
        baseline="unbroken-ddp",
    ),
    Config("torchrun", "torchrun (defaults)", "torchrun"),
    Config(
        "torchrun-nss",
        "torchrun + TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1",
        "torchrun",
        no_share_store=True,
    ),
)
BASELINES: tuple[Config, ...] = (
    Config("unbroken", "Unbroken (job-level.yaml, no fault)", "unbroken", "job-level.yaml"),
    Config("torchrun", "torchrun (defaults, no fault)", "torchrun"),
    Config(
        "unbroken-vranks",
        f"Unbroken (elastic.yaml, {WORLD} virtual ranks, no fault)",
        "unbroken",
        "elastic.yaml",
        cluster="cluster-no-spare.yaml",
        script_args=(f"--virtual-ranks={WORLD}",),
    ),
    Config(
        "unbroken-ddp",
        "Unbroken (job-level.yaml, DDP of the HSDP job's model, no fault)",
        "unbroken",
        "job-level.yaml",
        script_args=("--parallel=ddp",),
    ),
    Config(
        "unbroken-hsdp",
        "Unbroken (job-level.yaml, HSDP 2x2, no fault)",
        "unbroken",
        "job-level.yaml",
        script_args=("--parallel=hsdp",),
    ),
)


def baselines_for(chosen: list[str]) -> list[Config]:
    """The fault-free baselines to run: each tool's, and any a chosen configuration names."""
    named = {c.baseline for c in CONFIGS if c.key in chosen}
    return [b for b in BASELINES if b.key in ("unbroken", "torchrun") or b.key in named]


@dataclass(frozen=True)
class Settings:
    repeats: int
    steps: int
    kill_step: int
    ckpt_every: int
    step_sleep_s: float
    recovery_timeout_s: float
    run_timeout_s: float
    model_args: tuple[str, ...] = ()  # more arguments to the example (its model's size)

    @property
    def expected_recomputed(self) -> int:
        """Steps recomputed by a restart from the newest checkpoint (process-level: none)."""
        return self.kill_step - (self.kill_step // self.ckpt_every) * self.ckpt_every

    @property
    def clear_step(self) -> int:
        """The elastic configuration's lost node is back once the job has committed this step
        (a few steps at the smaller size, and room left to scale out and train at full size)."""
        return self.kill_step + max(3, (self.steps - self.kill_step) // 5)

    def script_args(self) -> list[str]:
        return [
            f"--steps={self.steps}",
            "--ckpt-dir=checkpoints",
            f"--ckpt-every={self.ckpt_every}",
            f"--step-sleep={self.step_sleep_s}",
            "--result=result.json",
            *self.model_args,
        ]
