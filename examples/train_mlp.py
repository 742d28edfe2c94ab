"""Train a small MLP with DDP on gloo, resumable and observable through unbroken.worker.

Runs unchanged under plain torchrun and under ``unbroken launch``::

    OMP_NUM_THREADS=1 torchrun --nproc_per_node 2 examples/train_mlp.py \\
        --steps 30 --ckpt-dir /tmp/mlp-ckpt --ckpt-every 10 --result /tmp/mlp.json

Everything that decides the result is a function of ``--seed``: the initial weights, the batch
of every (step, data-parallel rank), and each rank's RNG stream (dropout; ``ub.init(...,
seed=...)`` seeds it from (seed, rank, step) at the start of every step). Killed at any point
and restarted with the same arguments, the run resumes from its newest good checkpoint and ends
with a model bitwise equal to an uninterrupted run's; so does a run whose healthy ranks
recovered in process and redid the interrupted step. DDP gets ``find_unused_parameters=True``
for that: it keeps the gradient bucket layout fixed, where the default rebuilds the buckets
after the first iteration of every process and so sums gradients in a different order in the
first step after a restart.

With ``--device cuda`` each rank trains on its GPU (``ub.device()``: the one its pod's device
slot runs on; several ranks may share one) with deterministic algorithms, over gloo as on CPU.

Rank 0 writes ``--result`` as JSON: the steps trained, the world size and the sha256 digest of
the final model state.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import unbroken.worker as ub

D_IN, D_HIDDEN, D_HIDDEN2, N_CLASSES = 128, 512, 256, 16
BATCH = 32  # per data-parallel rank


def make_model(seed: int, width: int = 0, layers: int = 0) -> nn.Module:
    """The MLP; with ``width`` and ``layers``, ``layers`` hidden layers of ``width`` units
    instead of the two small ones (about ``(layers - 1) * width**2`` parameters)."""
    torch.manual_seed(seed)
    if width <= 0:
        return nn.Sequential(
            nn.Linear(D_IN, D_HIDDEN),
            nn.ReLU(),
            nn.Dropout(0.1),
            nn.Linear(D_HIDDEN, D_HIDDEN2),
            nn.ReLU(),
            nn.Linear(D_HIDDEN2, N_CLASSES),
        )
    hidden: list[nn.Module] = []
    for _ in range(max(layers, 1) - 1):
        hidden += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(
        nn.Linear(D_IN, width), nn.ReLU(), nn.Dropout(0.1), *hidden, nn.Linear(width, N_CLASSES)
    )


def batch(seed: int, step: int, dp_rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch of ``step`` for data-parallel rank ``dp_rank``: a pure function of its inputs."""
    teacher = torch.randn(D_IN, N_CLASSES, generator=torch.Generator().manual_seed(seed + 7))
    g = torch.Generator().manual_seed(seed * 1_000_003 + step * 1009 + dp_rank)
    x = torch.randn(BATCH, D_IN, generator=g)
    return x, (x @ teacher).argmax(dim=1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=100, help="total training steps")
    p.add_argument("--ckpt-dir", default=None, help="checkpoint directory (resumes from it)")
    p.add_argument("--ckpt-every", type=int, default=0, help="checkpoint every N steps; 0: never")
    p.add_argument("--result", default=None, help="rank 0 writes the final digest here (JSON)")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--step-sleep", type=float, default=0.0, help="extra seconds of 'compute'")
    p.add_argument("--width", type=int, default=0, help="hidden width (0: the small model)")
    p.add_argument("--layers", type=int, default=0, help="hidden layers of --width units")
    p.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="cuda: train on this rank's GPU (ub.device()), with deterministic algorithms",
    )
    args = p.parse_args()
    if args.device == "cuda":
        # Bitwise-repeatable cuBLAS (and so a recovered run equal to a fault-free one).
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)  # an op without one warns

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()

    device = ub.device() if args.device == "cuda" else torch.device("cpu")
    model = make_model(args.seed, args.width, args.layers).to(device)
    ddp = DistributedDataParallel(model, find_unused_parameters=True)
    opt = torch.optim.AdamW(ddp.parameters(), lr=args.lr, weight_decay=0.01)
    loss_fn = nn.CrossEntropyLoss()

    session = ub.init(ddp, opt, ckpt_dir=args.ckpt_dir, ckpt_every=args.ckpt_every, seed=args.seed)
    for step in session.steps(args.steps):
        x, y = (t.to(device) for t in batch(args.seed, step, rank))
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(ddp(x), y)
        loss.backward()
        if args.step_sleep:
            time.sleep(args.step_sleep)
        opt.step()
    session.close()

    if rank == 0 and args.result:
        result = {
            "steps": session.committed,
            "world_size": session.world_size,
            "start_step": session.start_step,
            "digest": ub.state_digest(model),
        }
        path = Path(args.result)
        tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(result) + "\n")
        tmp.replace(path)


if __name__ == "__main__":
    main()
