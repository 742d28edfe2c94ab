"""A training script for the recovery tests, and a harness that plays agent and manager.

Run as a script, it is one rank of a small DDP job written against the public session API
(``ub.init`` / ``session.steps``), plus fault injection that the tests ask for by flag:

``--die-in-backward R:S``  rank R SIGKILLs itself inside its backward pass of step S, while its
                           peers' gradient collectives are in flight;
``--fail-update R:S``      rank R's optimizer update of step S changes a parameter and then
                           raises (a memory error in the middle of the update);
``--die-in-transfer``      a rank serving as replica source SIGKILLs itself after sending the
                           first tensor of its state;
``--per-parameter``        DDP without ``find_unused_parameters``: its buckets rebuild, so the
                           gradients are all-reduced one parameter at a time.

Injected faults fire only in a process that was not started as a replacement. Each rank
appends every step it runs to ``<out>/steps-rank<R>-pid<PID>`` and writes
``<out>/result-rank<R>.json`` (pid, steps committed, model digest) when it finishes.

Imported, :class:`Job` starts ranks the way the node agent does (one store per generation,
heartbeat file and mailbox per process), starts replacements with ``UNBROKEN_JOIN=1``, and
posts mailbox commands.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from forked import start_rank
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import unbroken.worker as ub
from unbroken.agent.image import OwnChild
from unbroken.worker.heartbeat import HeartbeatReader, HeartbeatRecord
from unbroken.worker.mailbox import MailboxWriter

SCRIPT = Path(__file__).resolve()
D_IN, D_HIDDEN, N_CLASSES, BATCH = 32, 64, 8, 16


# -- the rank script ---------------------------------------------------------------------------


def _rank_step(value: str | None) -> tuple[int, int] | None:
    if value is None:
        return None
    rank, step = value.split(":")
    return int(rank), int(step)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--die-in-backward", default=None)
    p.add_argument("--fail-update", default=None)
    p.add_argument("--die-in-transfer", action="store_true")
    p.add_argument("--step-sleep", type=float, default=0.0)
    p.add_argument("--ckpt-dir", default=None)
    p.add_argument("--ckpt-every", type=int, default=0)
    p.add_argument(
        "--per-parameter",
        action="store_true",
        help="DDP with find_unused_parameters=False: buckets rebuild, gradients go one by one",
    )
    p.add_argument("--comm-timeout", type=float, default=20.0)
    p.add_argument("--command-timeout", type=float, default=30.0)
    args = p.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    replacement = os.environ.get("UNBROKEN_JOIN") == "1"
    die_in_backward = None if replacement else _rank_step(args.die_in_backward)
    fail_update = None if replacement else _rank_step(args.fail_update)

    torch.manual_seed(args.seed)
    model = nn.Sequential(
        nn.Linear(D_IN, D_HIDDEN),
        nn.ReLU(),
        nn.Dropout(0.2),
        nn.Linear(D_HIDDEN, D_HIDDEN),
        nn.ReLU(),
        nn.Linear(D_HIDDEN, N_CLASSES),
    )
    ddp = DistributedDataParallel(model, find_unused_parameters=not args.per_parameter)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-2, weight_decay=0.01)
    if fail_update is not None and fail_update[0] == rank:
        _inject_update_fault(opt, model, fail_update[1])
    if args.die_in_transfer and not replacement:
        _inject_transfer_death()

    session = ub.init(
        ddp,
        opt,
        seed=args.seed,
        ckpt_dir=args.ckpt_dir,
        ckpt_every=args.ckpt_every,
        comm_timeout_s=args.comm_timeout,
        command_timeout_s=args.command_timeout,
    )
    log = (args.out / f"steps-rank{rank}-pid{os.getpid()}").open("a", buffering=1)
    teacher = torch.randn(D_IN, N_CLASSES, generator=torch.Generator().manual_seed(99))
    current = {"step": -1}
    if die_in_backward is not None and die_in_backward[0] == rank:
        last = model[0].weight  # the last gradient backward produces: the others are in flight

        def die(grad: torch.Tensor) -> torch.Tensor:
            if current["step"] == die_in_backward[1]:
                os.kill(os.getpid(), signal.SIGKILL)
            return grad

        last.register_hook(die)

    for step in session.steps(args.steps):
        current["step"] = step
        log.write(f"{step}\n")
        g = torch.Generator().manual_seed(args.seed * 1000 + step * 10 + session.rank)
        x = torch.randn(BATCH, D_IN, generator=g)
        y = (x @ teacher).argmax(dim=1)
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(ddp(x), y)
        loss.backward()
        if args.step_sleep:
            time.sleep(args.step_sleep)
        opt.step()
    committed = session.committed
    session.close()
    result = {
        "pid": os.getpid(),
        "rank": rank,
        "steps": committed,
        "digest": ub.state_digest(model),
    }
    (args.out / f"result-rank{rank}.json").write_text(json.dumps(result) + "\n")


def _inject_update_fault(opt: torch.optim.Optimizer, model: nn.Module, at_step: int) -> None:
    original = opt.step
    calls = {"n": 0}

    def step(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == at_step + 1:
            with torch.no_grad():
                model[0].weight[0].add_(1.0)  # half an update, then the device fails
            raise RuntimeError("injected: uncorrectable memory error during the optimizer update")
        return original(*args, **kwargs)

    opt.step = step  # type: ignore[method-assign]


def _inject_transfer_death() -> None:
    original = dist.broadcast
    sent = {"n": 0}

    def broadcast(tensor: torch.Tensor, src: int | None = None, *args: Any, **kwargs: Any) -> Any:
        if src is not None and src == dist.get_rank() and kwargs.get("group") is not None:
            sent["n"] += 1
            if sent["n"] == 4:  # header, description, first tensor sent
                os.kill(os.getpid(), signal.SIGKILL)
        return original(tensor, src, *args, **kwargs)

    dist.broadcast = broadcast


# -- the harness -------------------------------------------------------------------------------


def clean_env() -> dict[str, str]:
    drop = ("UNBROKEN_", "TORCHELASTIC_", "RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env.update({"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"})
    return env


def wait_for(predicate: Callable[[], bool], what: str, deadline_s: float = 60.0) -> None:
    deadline = time.monotonic() + deadline_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {deadline_s:.0f} s waiting for {what}")
        time.sleep(0.02)


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
        self.store = dist.TCPStore(  # type: ignore[attr-defined]
            "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=60)
        )
        self._stores.append(self.store)
        return self.generation

    def start(self, rank: int, *, managed: bool = True, join: bool = False) -> Rank:
        gen = self.generation
        env = clean_env()
        env.update(self.env)
        env.update(
            {
                "RANK": str(rank),
                "LOCAL_RANK": str(rank),
                "WORLD_SIZE": str(self.world_size),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(self.store.port),
                "TORCHELASTIC_USE_AGENT_STORE": "True",
            }
        )
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
        proc = start_rank(
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


if __name__ == "__main__":
    main()
