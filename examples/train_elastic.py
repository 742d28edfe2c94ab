"""Train the MLP of train_mlp.py with virtual data-parallel ranks: the same model, bit for bit,
on any number of processes from 1 to ``--virtual-ranks``, and across changes of that number.

::

    OMP_NUM_THREADS=1 torchrun --nproc_per_node 2 examples/train_elastic.py \\
        --virtual-ranks 4 --steps 30 --result /tmp/elastic.json

The global batch of a step is ``--virtual-ranks`` slices of ``BATCH`` samples; slice ``v`` is a
pure function of (seed, step, v). Each process runs the forward and backward of the virtual
ranks it hosts (``session.virtual_ranks``: 2 each on 2 processes, 1 each on 4, all 4 on one),
each inside ``session.virtual_rank(v)``, which seeds dropout from (seed, v, step) and keeps v's
gradients apart; ``session.reduce_gradients()`` sums the ``--virtual-ranks`` gradients in the
order 0, 1, 2, ... on every process and divides by their number. The result, and so every
step's update, does not depend on how many processes there are: no learning-rate rescaling, no
change of the global batch, and a run that shrank and grew again ends with the model of a run
that never did. ``--ckpt-dir`` resumes from the newest checkpoint, also at another world size.

The model is wrapped in DDP only so that the session can recover it in process; the virtual
ranks' forward runs on the module itself, and DDP's own gradient hook never fires.

Rank 0 writes ``--result`` as JSON: steps, world size, virtual ranks and the final digest.
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
BATCH = 16  # samples per virtual rank


def make_model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(D_IN, D_HIDDEN),
        nn.ReLU(),
        nn.Dropout(0.1),
        nn.Linear(D_HIDDEN, D_HIDDEN2),
        nn.ReLU(),
        nn.Linear(D_HIDDEN2, N_CLASSES),
    )


def batch(seed: int, step: int, v: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Virtual rank ``v``'s slice of the global batch of ``step``."""
    teacher = torch.randn(D_IN, N_CLASSES, generator=torch.Generator().manual_seed(seed + 7))
    g = torch.Generator().manual_seed(seed * 1_000_003 + step * 1009 + v)
    x = torch.randn(BATCH, D_IN, generator=g)
    return x, (x @ teacher).argmax(dim=1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--virtual-ranks", type=int, default=0, help="0: the starting world size")
    p.add_argument("--steps", type=int, default=100, help="total training steps")
    p.add_argument("--ckpt-dir", default=None, help="checkpoint directory (resumes from it)")
    p.add_argument("--ckpt-every", type=int, default=0, help="checkpoint every N steps; 0: never")
    p.add_argument("--result", default=None, help="rank 0 writes the final digest here (JSON)")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--step-sleep", type=float, default=0.0, help="extra seconds of 'compute'")
    args = p.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    virtual = args.virtual_ranks or dist.get_world_size()

    model = make_model(args.seed)
    ddp = DistributedDataParallel(model, find_unused_parameters=True)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    loss_fn = nn.CrossEntropyLoss()

    session = ub.init(
        ddp,
        opt,
        ckpt_dir=args.ckpt_dir,
        ckpt_every=args.ckpt_every,
        seed=args.seed,
        virtual_ranks=virtual,
    )
    step_times: list[float] = []
    for step in session.steps(args.steps):
        began = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        for v in session.virtual_ranks:
            x, y = batch(args.seed, step, v)
            with session.virtual_rank(v):
                loss_fn(model(x), y).backward()
        if args.step_sleep:
            time.sleep(args.step_sleep)
        session.reduce_gradients()
        opt.step()
        step_times.append(time.perf_counter() - began)
    world_size = session.world_size  # the last step's (the group is gone after close)
    session.close()

    if session.rank == 0 and args.result:
        result = {
            "steps": session.committed,
            "world_size": world_size,
            "virtual_ranks": virtual,
            "start_step": session.start_step,
            "step_time_s": sorted(step_times)[len(step_times) // 2] if step_times else 0.0,
            "digest": ub.state_digest(model),
        }
        path = Path(args.result)
        tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(result) + "\n")
        tmp.replace(path)


if __name__ == "__main__":
    main()
