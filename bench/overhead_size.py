"""What Unbroken costs a training step when nothing fails, against model size.

    OMP_NUM_THREADS=1 .venv/bin/python bench/overhead_size.py --sizes 10M,50M,100M

For each size, ``--world`` ranks (started as ``bench/ranks.py`` does: Unbroken's variables
set, a recovery mailbox, so in-process recovery is on) train the MLP of
``examples/train_mlp.py`` with ``--width``/``--layers`` (AdamW, fp32, DDP on gloo with
``find_unused_parameters=True``), batches from a ``StatefulDataLoader`` given to the session
(``data=``: the data tape), an LR scheduler registered with it, gradient clipping, and take
``--steps`` steps of each of two loops, one of each in turn:

- *plain*: DDP's own bucketed all-reduce, no step snapshot, no agreement check: what the
  script costs without Unbroken;
- *Unbroken*: ``session.steps`` with everything on: the failure-tolerant gradient hook, the
  optimizer wrapper, per-step seeding, the mailbox poll, the heartbeat, the step snapshot and the
  data tape.

The plain step runs inside the session's (after its body, before its commit) and its time is
taken out of the session's, so both loops see the same moment of a noisy machine. The agreement
check, every ``--agree-every`` steps (``unbroken.worker.init``'s default) and at the end of
every ``steps()`` call, is off in this loop: it is timed alone and amortized over its interval.

Printed per size: the median and mean step of each loop and their ratio, and each part timed
alone: the session's loop with an empty body (hooks, heartbeat, mailbox), one step snapshot, the
data tape's ``state_dict()``, and one agreement check (every byte of the state hashed, the
digests all-gathered), with its share of a step at its interval.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from model_size import SIZES, params_of
from ranks import run_ranks

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _rank_main(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DistributedSampler, TensorDataset
    from torchdata.stateful_dataloader import StatefulDataLoader

    sys.path.insert(0, str(EXAMPLES))
    from train_mlp import D_IN, N_CLASSES, make_model

    import unbroken.worker as ub
    from unbroken.worker import agreement

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = make_model(0, args.width, args.layers)
    ddp = DistributedDataParallel(model, find_unused_parameters=True)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-4, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0 / (1 + step) ** 0.5)
    g = torch.Generator().manual_seed(1)
    xs = torch.randn(4096, D_IN, generator=g)
    dataset = TensorDataset(xs, (xs @ torch.randn(D_IN, N_CLASSES, generator=g)).argmax(dim=1))
    sampler = DistributedSampler(dataset, shuffle=True, seed=0, drop_last=True)
    loader = StatefulDataLoader(dataset, batch_size=args.batch, sampler=sampler, drop_last=True)
    loss_fn = nn.CrossEntropyLoss()
    session = ub.init(
        ddp,
        opt,
        state={"scheduler": scheduler},
        data=loader,
        seed=0,
        agree_every=args.agree_every,
    )
    recovery = session._recovery
    assert recovery is not None, "in-process recovery is off in this configuration"
    sync = recovery.sync
    hooked_bucket = sync._on_bucket
    state = session.state
    begin = state.begin
    plain_batches = iter(itertools.cycle(loader))

    def plain_bucket(bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        return allreduce_hook(sync.group, bucket)

    def body(x: torch.Tensor, y: torch.Tensor) -> None:
        opt.zero_grad(set_to_none=True)
        loss_fn(ddp(x), y).backward()
        torch.nn.utils.clip_grad_norm_(ddp.parameters(), 1.0)
        opt.step()
        scheduler.step()

    def plain_step() -> float:
        """One step of the plain loop, run between two of the session's (its time)."""
        sync._on_bucket = plain_bucket  # type: ignore[method-assign]
        t0 = time.perf_counter()
        body(*next(plain_batches))
        took = time.perf_counter() - t0
        sync._on_bucket = hooked_bucket  # type: ignore[method-assign]
        return took

    def pairs(n: int) -> tuple[list[float], list[float]]:
        """``n`` steps of each loop, one of each in turn: the session's step is yield to
        yield (its body, commit and the next step's start) less the plain step run inside it.
        The periodic agreement check is off here (timed alone below)."""
        plain: list[float] = []
        full: list[float] = []
        every, session.agree_every = session.agree_every, 0
        dist.barrier()
        last = None
        for _step in session.steps(session.committed + n + 1):
            now = time.perf_counter()
            if last is not None:
                full.append(now - last - plain[-1])
            last = now
            if len(plain) < n:  # the last yield ends the loop (its closing check is no step)
                body(*session.batch())
                plain.append(plain_step())
        session.agree_every = every
        return plain, full

    pairs(3)  # warm-up
    plain, full = pairs(args.steps)

    def alone(fn: Any, n: int) -> float:
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        return (time.perf_counter() - t0) / n

    n = 2000
    empty_s = alone(lambda: None, n)
    # The session's loop alone: the agreement check off (it is timed alone below), from the
    # first step's start to the last's (the closing check left out).
    every, session.agree_every = session.agree_every, 0
    yields = [time.perf_counter() for _step in session.steps(session.committed + n + 1)]
    session.agree_every = every
    session_s = (yields[-1] - yields[0]) / n - empty_s
    snapshot_s = alone(lambda: begin(session.committed, snapshot=True), 20)
    tape_s = alone(loader.state_dict, 200)
    check_s = alone(lambda: agreement.check(state, session.committed, sync.all_gather), 3)
    session.close()
    if rank == 0:
        Path(args.out).write_text(
            json.dumps(
                {
                    "plain_s": plain,
                    "full_s": full,
                    "session_s": session_s,
                    "snapshot_s": snapshot_s,
                    "tape_s": tape_s,
                    "check_s": check_s,
                }
            )
        )


def measure(args: argparse.Namespace, width: int, layers: int) -> dict[str, Any]:
    def argv(tmp: Path) -> list[str]:
        out = [f"--width={width}", f"--layers={layers}"]
        for name in ("steps", "batch", "agree_every"):
            out += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
        return out

    return run_ranks(__file__, args.world, argv, mailbox=True)


def row(name: str, params: int, r: dict[str, Any], agree_every: int) -> str:
    plain = statistics.median(r["plain_s"])
    diffs = [f - p for p, f in zip(r["plain_s"], r["full_s"], strict=True)]
    diff, q = statistics.median(diffs), statistics.quantiles(diffs, n=4)
    check_step = r["check_s"] / agree_every
    parts = r["session_s"] + r["snapshot_s"] + r["tape_s"]
    return (
        f"| {name} ({params / 1e6:.1f}M) | {plain * 1e3:.0f} ms | "
        f"{diff * 1e3:+.1f} ms ({diff / plain * 100:+.2f} %), "
        f"{q[0] * 1e3:+.1f} to {q[2] * 1e3:+.1f} ms | "
        f"{r['session_s'] * 1e6:.0f} us | {r['snapshot_s'] * 1e6:.0f} us | "
        f"{r['tape_s'] * 1e6:.0f} us | {parts / plain * 100:.2f} % | "
        f"{r['check_s'] * 1e3:.0f} ms ({check_step / plain * 100:.2f} %) | "
        f"{(diff + check_step) / plain * 100:+.2f} % |"
    )


def svg(measured: list[tuple[int, dict[str, Any]]], agree_every: int) -> str:
    """Each part's share of the plain step against the model's size, and the 1 % aimed at."""
    from svgplot import series, standalone

    def share(of: Any) -> list[tuple[float, float]]:
        return [(p / 1e6, of(r) / statistics.median(r["plain_s"]) * 100) for p, r in measured]

    lines = series(
        [
            ("hooks, heartbeat, mailbox (%)", share(lambda r: r["session_s"])),
            ("snapshot and data tape (%)", share(lambda r: r["snapshot_s"] + r["tape_s"])),
            ("agreement check (%)", share(lambda r: r["check_s"] / agree_every)),
            ("the aim (1 %)", [(p / 1e6, 1.0) for p, _ in measured]),
        ]
    )
    return standalone(
        lines,
        css_class="overhead-size",
        x_label="parameters (millions; AdamW, fp32, world 2)",
        y_label="% of the plain step",
        width=900,
        key_step=210,
    )


HEAD = (
    "| model | plain step (median) | Unbroken's step less the plain one: median (share), "
    "quartiles | hooks, heartbeat, mailbox (per step) | step snapshot | data tape | these "
    "three, share of the step | agreement check (share at its interval) | in all: the median "
    "difference and the check |\n|---|---|---|---|---|---|---|---|---|"
)


def hash_rates(nbytes: int = 256 << 20) -> str:
    """One core's rate through each tensor's hash (:mod:`unbroken.worker.digest`) and through
    sha256, the best of three passes over ``nbytes`` of random floats."""
    import hashlib

    import torch

    from unbroken.worker.digest import TENSOR_HASH, tensor_hash

    t = torch.randn(nbytes // 4)
    raw = t.view(torch.uint8).numpy().data

    def best(fn: Any) -> float:
        times = []
        for _ in range(3):
            began = time.perf_counter()
            fn()
            times.append(time.perf_counter() - began)
        return nbytes / min(times) / 1e9

    return (
        f"one core hashes {TENSOR_HASH} at {best(lambda: tensor_hash(t)):.1f} GB/s, "
        f"sha256 at {best(lambda: hashlib.sha256(raw).digest()):.1f} GB/s"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="10M,50M,100M", help=f"of {', '.join(SIZES)}")
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--steps", type=int, default=40, help="steps of each loop")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--agree-every", type=int, default=100)
    p.add_argument("--markdown", type=Path, default=None, help="the README's table")
    p.add_argument("--svg", type=Path, default=None, help="each part's share of the step (a file)")
    p.add_argument("--width", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--layers", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--rank-worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", default="", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.rank_worker:
        _rank_main(args)
        return
    load0 = os.getloadavg()[0]
    print(
        f"world {args.world}, {args.steps} steps of each loop in turn, "
        f"batch {args.batch}, agreement every {args.agree_every} steps; load {load0:.1f}",
        flush=True,
    )
    rates = hash_rates()
    print(rates, flush=True)
    rows, measured = [], []
    for name in args.sizes.split(","):
        width, layers = SIZES[name]
        r = measure(args, width, layers)
        measured.append((params_of(width, layers), r))
        rows.append(row(name, params_of(width, layers), r, args.agree_every))
        print(rows[-1], flush=True)
    text = (
        HEAD
        + "\n"
        + "\n".join(rows)
        + f"\n\nLoad average {load0:.1f} before, {os.getloadavg()[0]:.1f} after; "
        f"{os.cpu_count()} CPUs, world {args.world}; {rates}."
    )
    print("\n" + text)
    if args.markdown is not None:
        args.markdown.write_text(text + "\n")
    if args.svg is not None:
        args.svg.write_text(svg(measured, args.agree_every))


if __name__ == "__main__":
    main()
