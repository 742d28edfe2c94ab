"""What exactly-once steps and the replicas' agreement check cost a training step.

Each rank trains the GPT of ``examples/train_gpt.py`` (LambdaLR registered with the session, a
StatefulDataLoader behind ``session.batch()``, DDP with its buffer broadcast, under a mailbox
so in-process recovery is on) and alternates blocks of ``--block`` steps of the same
``session.steps`` loop: *off* blocks skip the step snapshot (what the step may change: the
registered objects' state dicts, the optimizer's hyperparameters, the model's buffers) and the
agreement check; *on* blocks take the snapshot at every step start and run the check every
``--agree-every`` steps (the default of ``unbroken.worker.init``). Median and mean per-step
times are compared (the check runs once every ``--agree-every`` steps, so the mean shows its
share); the cost of one snapshot and of one check, timed alone, is printed too.

    OMP_NUM_THREADS=1 .venv/bin/python bench/state_overhead.py [--world 2]
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import os
import statistics
import time
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from ranks import run_ranks
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DistributedSampler

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "train_gpt.py"


def _example() -> Any:
    spec = importlib.util.spec_from_file_location("train_gpt", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _rank_main(args: argparse.Namespace) -> None:
    warnings.filterwarnings("ignore", message="'set_vital' is deprecated")
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    from torchdata.stateful_dataloader import StatefulDataLoader

    import unbroken.worker as ub
    from unbroken.worker import agreement

    gpt = _example()
    torch.manual_seed(0)
    model = gpt.GPT()
    ddp = DistributedDataParallel(model, find_unused_parameters=True)
    opt = torch.optim.AdamW(gpt.param_groups(model, 0.1), lr=1e-3)
    total = args.warmup + 2 * args.repeats * args.block
    scheduler = torch.optim.lr_scheduler.LambdaLR(opt, gpt.warmup_cosine(10, total))
    dataset = gpt.Tokens(0)
    sampler = DistributedSampler(dataset, shuffle=True, seed=0, drop_last=True)
    loader = StatefulDataLoader(dataset, batch_size=args.batch, sampler=sampler, drop_last=True)
    session = ub.init(
        ddp,
        opt,
        state={"scheduler": scheduler},
        data=loader,
        seed=0,
        agree_every=args.agree_every,
    )
    assert session._recovery is not None, "in-process recovery is off in this configuration"
    state = session.state
    begin = state.begin

    def begin_without_snapshot(step: int, *, snapshot: bool) -> None:
        begin(step, snapshot=False)

    def run(steps: int, *, on: bool) -> list[float]:
        state.begin = begin if on else begin_without_snapshot  # type: ignore[method-assign]
        session.agree_every = args.agree_every if on else 0
        dist.barrier()
        marks = []
        for _step in session.steps(session.committed + steps):
            marks.append(time.perf_counter())
            x, y = session.batch()
            loss = F.cross_entropy(ddp(x).view(-1, gpt.VOCAB), y.view(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(ddp.parameters(), 1.0)
            opt.step()
            scheduler.step()
        marks.append(time.perf_counter())
        return [b - a for a, b in itertools.pairwise(marks)]

    run(args.warmup, on=True)
    off: list[float] = []
    on: list[float] = []
    for _ in range(args.repeats):
        off += run(args.block, on=False)
        on += run(args.block, on=True)

    n = 200
    t0 = time.perf_counter()
    for _ in range(n):
        state.begin(session.committed, snapshot=True)
    snapshot_s = (time.perf_counter() - t0) / n
    t0 = time.perf_counter()
    for _ in range(n):
        loader.state_dict()
    loader_s = (time.perf_counter() - t0) / n
    t0 = time.perf_counter()
    for _ in range(20):
        agreement.check(state, session.committed, session._recovery.sync.all_gather)
    check_s = (time.perf_counter() - t0) / 20
    rank = dist.get_rank()
    session.close()
    if rank == 0:
        Path(args.out).write_text(
            json.dumps(
                {
                    "off_s": off,
                    "on_s": on,
                    "snapshot_s": snapshot_s,
                    "check_s": check_s,
                    "loader_s": loader_s,
                }
            )
        )


def _launch(args: argparse.Namespace) -> dict[str, Any]:
    def argv(tmp: Path) -> list[str]:
        out = []
        for name in ("block", "repeats", "warmup", "batch", "agree_every"):
            out += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
        return out

    return run_ranks(__file__, args.world, argv, mailbox=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--block", type=int, default=20, help="steps per alternating block")
    p.add_argument("--repeats", type=int, default=25, help="blocks of each kind")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--agree-every", type=int, default=100)
    p.add_argument("--rank-worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", default="", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.rank_worker:
        _rank_main(args)
        return
    load = os.getloadavg()[0]
    result = _launch(args)
    off, on = result["off_s"], result["on_s"]
    print(
        f"world {args.world}, {len(off)} steps of each loop in blocks of {args.block}, "
        f"agreement check every {args.agree_every} steps; load {load:.1f} -> "
        f"{os.getloadavg()[0]:.1f}"
    )
    for name, stat in (("median", statistics.median), ("mean", statistics.fmean)):
        a, b = stat(off), stat(on)
        print(
            f"{name:6s} off {a * 1e3:7.2f} ms/step   snapshot + check {b * 1e3:7.2f} ms/step"
            f"   ratio {b / a:.4f} ({(b / a - 1) * 100:+.2f} %)"
        )
    per_step = result["snapshot_s"] + result["check_s"] / args.agree_every
    print(
        f"alone: snapshot {result['snapshot_s'] * 1e6:.1f} us/step, check "
        f"{result['check_s'] * 1e3:.2f} ms each ({per_step * 1e6:.1f} us/step amortized, "
        f"{per_step / statistics.median(off) * 100:.2f} % of the median step); the loader's "
        f"state_dict() for the data tape, in both loops: {result['loader_s'] * 1e6:.1f} us/step"
    )


if __name__ == "__main__":
    main()
