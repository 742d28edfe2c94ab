"""What the worker hooks cost a training step.

Starts ``--world`` ranks the way ``unbroken launch`` does (env:// against a TCPStore this script
owns, Unbroken's variables set, so the heartbeat is on), each training the anchor workload (an
MLP 256->1024->1024->1024->16, AdamW, DDP on gloo, a step of roughly 70 ms on two cores). Every
rank alternates blocks of ``--block`` steps driven by a plain ``range`` and by
``session.steps``, ``--repeats`` blocks of each; the median and the mean per-step times are
compared (the median is the steady-state cost of the hooks; the mean also carries rare
stalls). With ``--ckpt-every N`` the session also saves an asynchronous checkpoint every N
steps, so the mean includes the checkpoint stall. A micro-benchmark of the hooks alone (an
empty loop body) gives their cost in microseconds, free of the training's noise.

    OMP_NUM_THREADS=1 .venv/bin/python bench/worker_overhead.py [--ckpt-every 20]
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
    ddp = DistributedDataParallel(model, find_unused_parameters=True)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-4)
    loss_fn = nn.CrossEntropyLoss()
    teacher = torch.randn(256, 16, generator=torch.Generator().manual_seed(1))

    def train_step(step: int) -> None:
        g = torch.Generator().manual_seed(step * 1009 + rank)
        x = torch.randn(args.batch, 256, generator=g)
        opt.zero_grad(set_to_none=True)
        loss_fn(ddp(x), (x @ teacher).argmax(dim=1)).backward()
        opt.step()

    ckpt_dir = args.ckpt_dir if args.ckpt_every else None
    session = ub.init(ddp, opt, ckpt_dir=ckpt_dir, ckpt_every=args.ckpt_every)
    for step in range(args.warmup):
        train_step(step)

    # Per-step times: from one loop body's start to the next's, so the session's work at the
    # step boundary (commit, heartbeat, checkpoint staging) counts against its steps. Short
    # alternating blocks expose both loops to the same background load.
    plain: list[float] = []
    hooked: list[float] = []
    for _ in range(args.repeats):
        dist.barrier()
        marks = []
        for step in range(args.block):
            marks.append(time.perf_counter())
            train_step(step)
        marks.append(time.perf_counter())
        plain += [b - a for a, b in itertools.pairwise(marks)]
        dist.barrier()
        marks = []
        for step in session.steps(session.committed + args.block):
            marks.append(time.perf_counter())
            train_step(step)
        marks.append(time.perf_counter())
        hooked += [b - a for a, b in itertools.pairwise(marks)]

    # The hooks alone: an empty body, so the loop costs only what the session adds.
    n = 20_000
    t0 = time.perf_counter()
    for _step in range(n):
        pass
    empty_s = (time.perf_counter() - t0) / n
    saved_every = session.ckpt_every
    session.ckpt_every = 0  # keep checkpoints out of the micro-benchmark
    t0 = time.perf_counter()
    for _step in session.steps(session.committed + n):
        pass
    hooks_s = (time.perf_counter() - t0) / n - empty_s
    session.ckpt_every = saved_every
    session.close()
    if rank == 0:
        Path(args.out).write_text(
            json.dumps({"plain_s": plain, "session_s": hooked, "hooks_s": hooks_s})
        )


def _launch(args: argparse.Namespace) -> dict[str, Any]:
    def argv(tmp: Path) -> list[str]:
        out = ["--ckpt-dir", str(tmp / "ckpt")]
        for name in ("block", "repeats", "warmup", "ckpt_every", "hidden", "batch"):
            out += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
        return out

    return run_ranks(__file__, args.world, argv, mailbox=False)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--block", type=int, default=10, help="steps per alternating block")
    p.add_argument("--repeats", type=int, default=30, help="blocks of each kind")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--ckpt-every", type=int, default=0)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--rank-worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", default="", help=argparse.SUPPRESS)
    p.add_argument("--ckpt-dir", default="", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.rank_worker:
        _rank_main(args)
        return
    result = _launch(args)
    plain, hooked = result["plain_s"], result["session_s"]
    ckpt = f", checkpoint every {args.ckpt_every} steps" if args.ckpt_every else ""
    print(f"world {args.world}, {len(plain)} steps of each loop in blocks of {args.block}{ckpt}")
    for name, stat in (("median", statistics.median), ("mean", statistics.fmean)):
        p, h = stat(plain), stat(hooked)
        print(
            f"{name:6s} plain {p * 1e3:7.2f} ms/step   session {h * 1e3:7.2f} ms/step   "
            f"ratio {h / p:.4f} ({(h / p - 1) * 100:+.2f} %)"
        )
    print(f"hooks alone    {result['hooks_s'] * 1e6:8.2f} us/step (empty loop body)")


if __name__ == "__main__":
    main()
