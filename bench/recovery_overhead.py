"""What in-process recovery costs a training step when nothing fails.

The recovery hooks on the hot path are the DDP gradient hook (per-parameter all-reduce in a
fixed order, failures caught; :mod:`unbroken.worker.commhook`), the optimizer wrapper, the
per-step RNG seeding, and one mailbox ``stat`` per step. Each rank trains the anchor workload
(MLP 256->1024->1024->1024->16, AdamW, DDP on gloo with ``find_unused_parameters=True``, the
fixed-bucket mode; ``--per-parameter`` measures the other mode) and alternates blocks of
``--block`` steps: *plain* blocks run a ``range`` loop with DDP's bucketed all-reduce (torch's
default hook), *recovery* blocks run ``session.steps`` with the recovery hook, a mailbox and a
seed. Median and mean per-step times are compared; a
micro-benchmark of the loop with an empty body gives the per-step cost of the session alone.

    OMP_NUM_THREADS=1 .venv/bin/python bench/recovery_overhead.py [--world 2]
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from ranks import run_ranks
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel


def _rank_main(args: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    import unbroken.worker as ub

    torch.manual_seed(0)
    widths = [256, args.hidden, args.hidden, args.hidden, 16]
    layers: list[nn.Module] = []
    for d_in, d_out in itertools.pairwise(widths):
        layers += [nn.Linear(d_in, d_out), nn.ReLU()]
    model = nn.Sequential(*layers[:-1])
    ddp = DistributedDataParallel(model, find_unused_parameters=not args.per_parameter)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-4)
    loss_fn = nn.CrossEntropyLoss()
    teacher = torch.randn(256, 16, generator=torch.Generator().manual_seed(1))

    def train_step(step: int) -> None:
        g = torch.Generator().manual_seed(step * 1009 + rank)
        x = torch.randn(args.batch, 256, generator=g)
        opt.zero_grad(set_to_none=True)
        loss_fn(ddp(x), (x @ teacher).argmax(dim=1)).backward()
        opt.step()

    session = ub.init(ddp, opt, seed=0)
    recovery = session._recovery
    assert recovery is not None, "in-process recovery is off in this configuration"
    sync = recovery.sync
    hooked_bucket = sync._on_bucket

    def plain_bucket(bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        return allreduce_hook(sync.group, bucket)

    for step in range(args.warmup):
        train_step(step)

    plain: list[float] = []
    hooked: list[float] = []
    for _ in range(args.repeats):
        sync._on_bucket = plain_bucket  # type: ignore[method-assign]
        dist.barrier()
        marks = []
        for step in range(args.block):
            marks.append(time.perf_counter())
            train_step(step)
        marks.append(time.perf_counter())
        plain += [b - a for a, b in itertools.pairwise(marks)]
        sync._on_bucket = hooked_bucket  # type: ignore[method-assign]
        dist.barrier()
        marks = []
        for step in session.steps(session.committed + args.block):
            marks.append(time.perf_counter())
            train_step(step)
        marks.append(time.perf_counter())
        hooked += [b - a for a, b in itertools.pairwise(marks)]

    n = 20_000
    t0 = time.perf_counter()
    for _step in range(n):
        pass
    empty_s = (time.perf_counter() - t0) / n
    t0 = time.perf_counter()
    for _step in session.steps(session.committed + n):
        pass
    session_s = (time.perf_counter() - t0) / n - empty_s
    session.close()
    if rank == 0:
        Path(args.out).write_text(
            json.dumps({"plain_s": plain, "recovery_s": hooked, "session_s": session_s})
        )


def _launch(args: argparse.Namespace) -> dict[str, Any]:
    def argv(tmp: Path) -> list[str]:
        out = []
        for name in ("block", "repeats", "warmup", "hidden", "batch"):
            out += [f"--{name}", str(getattr(args, name))]
        return [*out, "--per-parameter"] if args.per_parameter else out

    return run_ranks(__file__, args.world, argv, mailbox=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--block", type=int, default=10, help="steps per alternating block")
    p.add_argument("--repeats", type=int, default=30, help="blocks of each kind")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--per-parameter", action="store_true", help="find_unused_parameters=False")
    p.add_argument("--rank-worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", default="", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.rank_worker:
        _rank_main(args)
        return
    result = _launch(args)
    plain, hooked = result["plain_s"], result["recovery_s"]
    mode = "per-parameter" if args.per_parameter else "fixed buckets"
    print(f"world {args.world}, {mode}, {len(plain)} steps of each loop in blocks of {args.block}")
    for name, stat in (("median", statistics.median), ("mean", statistics.fmean)):
        a, b = stat(plain), stat(hooked)
        print(
            f"{name:6s} plain DDP {a * 1e3:7.2f} ms/step   with recovery {b * 1e3:7.2f} ms/step"
            f"   ratio {b / a:.4f} ({(b / a - 1) * 100:+.2f} %)"
        )
    print(f"session alone  {result['session_s'] * 1e6:8.2f} us/step (empty loop body)")


if __name__ == "__main__":
    main()
