"""A DDP training script written for torchrun, with no Unbroken API at all.

It runs as it is under ``torchrun`` and under ``unbroken launch`` / ``unbroken run``::

    OMP_NUM_THREADS=1 torchrun --nproc_per_node 2 examples/train_torchrun.py \\
        --steps 60 --ckpt-dir /tmp/plain-ckpt --ckpt-every 10 --result /tmp/plain.json

Fault tolerance is the script's own: rank 0 saves a checkpoint (model, optimizer, step) with
``torch.save`` every ``--ckpt-every`` steps, and every start resumes from the newest one. Under
``unbroken run`` such a job is protected by job- and pod-level rescheduling (the processes are
restarted and resume from that checkpoint); the process-level rungs (retry, recover-in-place,
recover, elastic training, last words) need the ``unbroken.worker`` session and are not
available to it.

Rank 0 writes ``--result`` as JSON at the end: the steps trained, the step this process
started from, and the world size.
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
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def make_dataset(seed: int, n: int = 2048) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 32, generator=g)
    teacher = torch.randn(32, 4, generator=g)
    return TensorDataset(x, (x @ teacher).argmax(dim=1))


def save_checkpoint(path: Path, step: int, model: nn.Module, opt: torch.optim.Optimizer) -> None:
    """Written under a temporary name and renamed: a kill mid-save leaves the previous one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save({"step": step, "model": model.state_dict(), "optimizer": opt.state_dict()}, tmp)
    os.replace(tmp, path)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--ckpt-dir", default="checkpoints")
    p.add_argument("--ckpt-every", type=int, default=10)
    p.add_argument("--step-sleep", type=float, default=0.0, help="stand-in for compute time")
    p.add_argument("--result", default="")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(args.seed)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
    ddp = DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    dataset = make_dataset(args.seed)
    sampler = DistributedSampler(dataset, shuffle=True, seed=args.seed)
    loader = DataLoader(dataset, batch_size=16, sampler=sampler)

    ckpt = Path(args.ckpt_dir) / "latest.pt"
    step = 0
    if ckpt.exists():
        state = torch.load(ckpt, map_location="cpu", weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        step = int(state["step"])
        print(f"rank {rank}: resumed from step {step}", flush=True)
    started_at = step

    loss_fn = nn.CrossEntropyLoss()
    while step < args.steps:
        epoch, skip = divmod(step, len(loader))
        sampler.set_epoch(epoch)
        for i, (x, y) in enumerate(loader):
            if i < skip:
                continue  # batches of this epoch trained before the restart
            opt.zero_grad()
            loss = loss_fn(ddp(x), y)
            loss.backward()
            opt.step()
            step += 1
            time.sleep(args.step_sleep)
            if step % args.ckpt_every == 0 or step == args.steps:
                if rank == 0:
                    save_checkpoint(ckpt, step, model, opt)
                dist.barrier()
            if step >= args.steps:
                break

    if rank == 0 and args.result:
        result = {"steps": step, "started_at": started_at, "world_size": world}
        Path(args.result).write_text(json.dumps(result))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
