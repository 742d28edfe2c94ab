"""Start training ranks the way the node agent does, for the worker and checkpoint tests.

One process per rank running ``examples/train_mlp.py``; ``dist.init_process_group("gloo")``
connects through env:// to a TCPStore this test process owns (``TORCHELASTIC_USE_AGENT_STORE``),
one store per generation. ``managed=True`` adds Unbroken's variables (job id, generation, a
heartbeat file per rank and generation); ``managed=False`` is what plain torchrun gives a rank.
The ranks are started by :func:`tests.support.ranks.start_rank`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tests.support.ranks import agent_store, clean_env, start_rank, store_env

from unbroken.agent.children import OwnChild
from unbroken.worker.heartbeat import HeartbeatReader, HeartbeatRecord

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "train_mlp.py"


class Generation:
    """The rank processes of one generation, with their logs and heartbeat files."""

    def __init__(
        self, root: Path, generation: int, procs: list[subprocess.Popen[bytes] | OwnChild]
    ) -> None:
        self.root = root
        self.generation = generation
        self.procs = procs

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def log(self, rank: int) -> str:
        return (self.root / f"gen{self.generation}-rank{rank}.log").read_text(errors="replace")

    def logs(self) -> str:
        return "\n".join(f"--- rank {r} ---\n{self.log(r)[-3000:]}" for r in range(len(self.procs)))

    def heartbeat(self, rank: int) -> HeartbeatRecord | None:
        return HeartbeatReader(heartbeat_path(self.root, self.generation, rank)).read()

    def wait(self, deadline_s: float = 180.0) -> list[int]:
        """Every rank's exit status (negative: killed by that signal)."""
        deadline = time.monotonic() + deadline_s
        codes = []
        for p in self.procs:
            try:
                codes.append(p.wait(timeout=max(0.1, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                self.kill()
                raise AssertionError(
                    f"ranks still running after {deadline_s:.0f} s\n{self.logs()}"
                ) from None
        return codes

    def expect_success(self, deadline_s: float = 180.0) -> None:
        codes = self.wait(deadline_s)
        assert codes == [0] * len(codes), f"exit statuses {codes}\n{self.logs()}"

    def signal(self, rank: int, signum: int) -> None:
        os.kill(self.procs[rank].pid, signum)

    def kill(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
                p.wait()


def heartbeat_path(root: Path, generation: int, rank: int) -> Path:
    return root / "hb" / f"gen{generation}" / f"rank{rank}"


def is_stopped(pid: int) -> bool:
    """Whether the process is in the stopped state (after SIGSTOP)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0] == "T"


class Cluster:
    """Launches generations of ranks; ends every process it started on close."""

    def __init__(self, root: Path, world_size: int = 2, script: Path = EXAMPLE) -> None:
        self.root = root
        self.world_size = world_size
        self.script = script
        self.generations: list[Generation] = []
        self._stores: list[Any] = []

    def start(
        self,
        args: Sequence[str],
        *,
        managed: bool = True,
        generation: int | None = None,
        extra_env: Mapping[str, str] | None = None,
        world_size: int | None = None,
    ) -> Generation:
        """Start one process per rank (``world_size`` of them; default: the cluster's)."""
        world = self.world_size if world_size is None else world_size
        gen = len(self.generations) if generation is None else generation
        store = agent_store()
        self._stores.append(store)
        procs: list[subprocess.Popen[bytes] | OwnChild] = []
        self.root.mkdir(parents=True, exist_ok=True)
        for rank in range(world):
            env = clean_env()
            env.update(store_env(rank, world, store.port))
            env.update(
                {
                    "LOCAL_WORLD_SIZE": str(world),
                    "GROUP_RANK": "0",
                    "TORCHELASTIC_RESTART_COUNT": str(gen),
                    "TORCHELASTIC_RUN_ID": "test",
                }
            )
            if managed:
                env.update(
                    {
                        "UNBROKEN_JOB_ID": "test-job",
                        "UNBROKEN_GENERATION": str(gen),
                        "UNBROKEN_HEARTBEAT_FILE": str(heartbeat_path(self.root, gen, rank)),
                    }
                )
            env.update(extra_env or {})
            procs.append(
                start_rank(
                    self.script,
                    args,
                    env=env,
                    cwd=self.root,
                    log_path=self.root / f"gen{gen}-rank{rank}.log",
                )
            )
        generation_ = Generation(self.root, gen, procs)
        self.generations.append(generation_)
        return generation_

    def close(self) -> None:
        for generation in self.generations:
            generation.kill()
        self._stores.clear()


def read_result(path: Path) -> dict[str, Any]:
    result = json.loads(path.read_text())
    assert isinstance(result, dict)
    return result
