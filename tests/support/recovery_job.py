"""A job of recovery rank processes, with this test process playing agent and manager.

:class:`Job` starts ``tests/multiproc/recovery_rank.py`` ranks the way the node agent does (one
store per generation, heartbeat file and mailbox per process, through
:func:`tests.support.ranks.start_rank`), starts replacements with ``UNBROKEN_JOIN=1``, and posts
mailbox commands; :class:`Rank` is one rank process with its heartbeat file and mailbox.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tests.support import ranks

from unbroken.agent.children import OwnChild
from unbroken.worker.heartbeat import HeartbeatReader, HeartbeatRecord
from unbroken.worker.mailbox import MailboxWriter

SCRIPT = Path(__file__).resolve().parents[1] / "multiproc" / "recovery_rank.py"


def wait_for(predicate: Callable[[], bool], what: str, deadline_s: float = 60.0) -> None:
    """:func:`tests.support.ranks.wait_for` with the recovery tests' deadline."""
    ranks.wait_for(predicate, what, deadline_s)


class Rank:
    """One rank process with its heartbeat file and mailbox."""

    def __init__(
        self, job: Job, rank: int, generation: int, proc: subprocess.Popen[bytes] | OwnChild
    ) -> None:
        self.job = job
        self.rank = rank
        self.generation = generation
        self.proc = proc
        self.heartbeat = HeartbeatReader(job.root / "hb" / f"rank{rank}-g{generation}")
        self.mailbox = MailboxWriter(job.root / "mb" / f"rank{rank}-g{generation}")
        self.log_path = job.root / f"rank{rank}-g{generation}.log"

    def record(self) -> HeartbeatRecord:
        record = self.heartbeat.read()
        assert record is not None, f"rank {self.rank} has no heartbeat yet"
        return record

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None


class Job:
    """Generations of ranks on one store each; ends every process it started on close."""

    def __init__(
        self,
        root: Path,
        world_size: int,
        args: Sequence[str],
        env: dict[str, str] | None = None,
    ) -> None:
        self.root = root
        self.world_size = world_size
        self.args = list(args)
        self.env = dict(env or {})  # more environment for every rank
        self.generation = -1
        self.store: Any = None
        self._stores: list[Any] = []
        self.ranks: dict[int, Rank] = {}
        self.all: list[Rank] = []
        (root / "out").mkdir(parents=True, exist_ok=True)

    @property
    def out(self) -> Path:
        return self.root / "out"

    def new_generation(self) -> int:
        self.generation += 1
        self.store = ranks.agent_store()
        self._stores.append(self.store)
        return self.generation

    def start(self, rank: int, *, managed: bool = True, join: bool = False) -> Rank:
        gen = self.generation
        env = ranks.clean_env()
        env.update(self.env)
        env.update(ranks.store_env(rank, self.world_size, self.store.port))
        if managed:
            env.update(
                {
                    "UNBROKEN_JOB_ID": "recovery-test",
                    "UNBROKEN_GENERATION": str(gen),
                    "UNBROKEN_HEARTBEAT_FILE": str(self.root / "hb" / f"rank{rank}-g{gen}"),
                    "UNBROKEN_MAILBOX": str(self.root / "mb" / f"rank{rank}-g{gen}"),
                }
            )
        if join:
            env["UNBROKEN_JOIN"] = "1"
        proc = ranks.start_rank(
            SCRIPT,
            ["--out", str(self.out), *self.args],
            env=env,
            cwd=self.root,
            log_path=self.root / f"rank{rank}-g{gen}.log",
        )
        r = Rank(self, rank, gen, proc)
        self.ranks[rank] = r
        self.all.append(r)
        return r

    def start_all(self, *, managed: bool = True) -> list[Rank]:
        self.new_generation()
        return [self.start(rank, managed=managed) for rank in range(self.world_size)]

    def rejoin(self, *, source: int, step: int, replace: Sequence[int] = ()) -> None:
        """What the manager and agents do: new generation, replacements, rejoin commands."""
        gen = self.new_generation()
        for rank in replace:
            self.start(rank, join=True)
        for rank in range(self.world_size):
            self.ranks[rank].mailbox.post(
                {
                    "op": "rejoin",
                    "generation": gen,
                    "master_addr": "127.0.0.1",
                    "master_port": self.store.port,
                    "rank": rank,
                    "world_size": self.world_size,
                    "source": source,
                    "step": step,
                }
            )

    def wait(self, deadline_s: float = 60.0) -> dict[int, int]:
        """Exit status of every current rank (negative: killed by that signal)."""
        deadline = time.monotonic() + deadline_s
        codes = {}
        for rank, r in sorted(self.ranks.items()):
            try:
                codes[rank] = r.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.kill()
                raise AssertionError(
                    f"ranks still running after {deadline_s:.0f} s\n{self.logs()}"
                ) from None
        return codes

    def expect_success(self, deadline_s: float = 60.0) -> None:
        codes = self.wait(deadline_s)
        assert set(codes.values()) == {0}, f"exit statuses {codes}\n{self.logs()}"

    def logs(self) -> str:
        return "\n".join(
            f"--- rank {r.rank} generation {r.generation} ---\n{r.log()[-4000:]}" for r in self.all
        )

    def result(self, rank: int) -> dict[str, Any]:
        data = json.loads((self.out / f"result-rank{rank}.json").read_text())
        assert isinstance(data, dict)
        return data

    def steps_run(self, rank: int, pid: int) -> list[int]:
        """The steps a rank process ran, in order (a redone step appears twice)."""
        text = (self.out / f"steps-rank{rank}-pid{pid}").read_text()
        return [int(line) for line in text.split()]

    def kill(self) -> None:
        for r in self.all:
            if r.alive:
                r.proc.send_signal(signal.SIGKILL)
            r.proc.wait()

    def close(self) -> None:
        self.kill()
        self._stores.clear()
