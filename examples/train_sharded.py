"""Train a small MLP, replicated or sharded, on gloo: DDP, ZeRO over DDP, FSDP2 or HSDP.

Runs unchanged under plain torchrun and under ``unbroken launch``::

    OMP_NUM_THREADS=1 torchrun --nproc_per_node 4 examples/train_sharded.py \\
        --parallel hsdp --replicas 2 --steps 30 --ckpt-dir /tmp/sharded --ckpt-every 10

``--parallel``:

``ddp``   ``DistributedDataParallel``: every rank holds the whole model and optimizer;
``zero``  ``DistributedDataParallel`` with ``torch.distributed.optim.ZeroRedundancyOptimizer``:
          the model replicated, the optimizer state partitioned over the ranks;
``fsdp``  ``fully_shard`` (FSDP2) over all ranks: parameters, gradients and optimizer state are
          ``DTensor`` shards, one per rank, no replica;
``hsdp``  ``fully_shard`` on a 2-D device mesh ``(replicate, shard)`` of ``--replicas`` groups:
          each group shards the state, and the groups hold replicas of each other's shards.

Under ``unbroken launch`` an ``hsdp`` job of 2 or more replica groups recovers in process (a
lost rank's shards come from the other replica group; the script builds its one device mesh
before ``ub.init``, as a replacement process must), and so does ``zero`` with
``--replica-optimizer`` (each rank also keeps the previous rank's optimizer partition);
``zero`` without it and ``fsdp`` hold each shard once and restart from the newest checkpoint.

The loop is the one large-model loops write: AdamW with a warm-up then cosine learning-rate
schedule, ``clip_grad_norm_`` before the update (under FSDP2 the norm of the ``DTensor``
gradients is an all-reduce over the mesh), the loss all-reduced for the log and every rank's
token count gathered (``--log-every``). Under ``unbroken launch`` each of those collectives
fails the step, not the rank, when a peer dies.

Everything that decides the result is a function of ``--seed`` and the data-parallel rank:
initial weights, each rank's batch of each step. The script writes ``--result`` (rank 0) as
JSON: steps trained, world size, start step and the sha256 digest of the full model and
optimizer state (gathered from the shards), which does not depend on how the state is sharded.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel

import unbroken.worker as ub
from unbroken.worker.digest import update_digest

D_IN, D_HIDDEN, N_CLASSES = 32, 64, 8
BATCH = 64  # global batch per step, split over the data-parallel ranks


def make_model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(D_IN, D_HIDDEN),
        nn.ReLU(),
        nn.Linear(D_HIDDEN, D_HIDDEN),
        nn.ReLU(),
        nn.Linear(D_HIDDEN, N_CLASSES),
    )


def batch(seed: int, step: int, rank: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s slice of the global batch of ``step``: the global batch is a function
    of (seed, step), so a run at another world size trains on the same samples."""
    teacher = torch.randn(D_IN, N_CLASSES, generator=torch.Generator().manual_seed(seed + 7))
    g = torch.Generator().manual_seed(seed * 1_000_003 + step * 1009)
    x = torch.randn(BATCH, D_IN, generator=g)
    y = (x @ teacher).argmax(dim=1)
    per = BATCH // world
    return x[rank * per : (rank + 1) * per], y[rank * per : (rank + 1) * per]


def full_digest(model: nn.Module, opt: torch.optim.Optimizer) -> str:
    """sha256 of the whole model and optimizer state, gathered from every rank's shards
    (collective); the same for any sharding of the same state."""
    options = StateDictOptions(full_state_dict=True, cpu_offload=False)
    if isinstance(opt, ZeroRedundancyOptimizer):
        opt.consolidate_state_dict(to=0)
        optim_sd = opt.state_dict() if dist.get_rank() == 0 else {}
        model_sd = model.module.state_dict() if isinstance(model, DistributedDataParallel) else {}
    else:
        model_sd = get_model_state_dict(model, options=options)
        optim_sd = get_optimizer_state_dict(model, opt, options=options)
    h = hashlib.sha256()
    update_digest(h, {"model": model_sd, "optim": optim_sd.get("state", {})})
    return h.hexdigest()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--parallel", choices=("ddp", "zero", "fsdp", "hsdp"), default="fsdp")
    p.add_argument("--replicas", type=int, default=2, help="replica groups of hsdp")
    p.add_argument("--steps", type=int, default=40, help="total training steps")
    p.add_argument("--ckpt-dir", default=None, help="checkpoint directory (resumes from it)")
    p.add_argument("--ckpt-every", type=int, default=0, help="checkpoint every N steps; 0: never")
    p.add_argument("--result", default=None, help="rank 0 writes the final digest here (JSON)")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument(
        "--start-digest",
        action="store_true",
        help="also write the digest of the state the run starts from (a collective after init)",
    )
    p.add_argument(
        "--replica-optimizer",
        action="store_true",
        help="zero: each rank also keeps the previous rank's optimizer partition",
    )
    p.add_argument("--step-sleep", type=float, default=0.0, help="extra seconds of 'compute'")
    p.add_argument("--lr-period", type=int, default=200, help="steps of the cosine schedule")
    p.add_argument("--max-norm", type=float, default=1.0, help="gradient clipping; 0: none")
    p.add_argument(
        "--log-every",
        type=int,
        default=1,
        help="all-reduce the loss and gather the ranks' sample counts every N steps; 0: never",
    )
    args = p.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

    model: nn.Module = make_model(args.seed)
    opt: torch.optim.Optimizer
    if args.parallel == "ddp":
        model = DistributedDataParallel(model, find_unused_parameters=True)
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    elif args.parallel == "zero":
        model = DistributedDataParallel(model, find_unused_parameters=True)
        opt = ZeroRedundancyOptimizer(
            model.parameters(), optimizer_class=torch.optim.AdamW, lr=args.lr, weight_decay=0.01
        )
    else:
        if args.parallel == "hsdp":
            mesh = init_device_mesh(
                "cpu", (args.replicas, world // args.replicas), mesh_dim_names=("rep", "shard")
            )
        else:
            mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("shard",))
        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    loss_fn = nn.CrossEntropyLoss()
    # Not a function of --steps: a run resumed with more steps follows the same schedule.
    warmup = 5
    scheduler = torch.optim.lr_scheduler.SequentialLR(
        opt,
        [
            torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.1, total_iters=warmup),
            torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=args.lr_period),
        ],
        milestones=[warmup],
    )

    session = ub.init(
        model,
        opt,
        state={"scheduler": scheduler},
        ckpt_dir=args.ckpt_dir,
        ckpt_every=args.ckpt_every,
        seed=args.seed,
        replica_optimizer=args.replica_optimizer,
    )
    start_digest = full_digest(model, opt) if args.start_digest else None
    for step in session.steps(args.steps):
        x, y = batch(args.seed, step, rank, world)
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        if args.max_norm > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_norm)
        if args.step_sleep:
            time.sleep(args.step_sleep)
        opt.step()
        scheduler.step()
        if args.log_every and step % args.log_every == 0:
            mean_loss = loss.detach().clone()
            dist.all_reduce(mean_loss)
            samples = [torch.zeros((), dtype=torch.int64) for _ in range(world)]
            dist.all_gather(samples, torch.tensor(len(y), dtype=torch.int64))
            if rank == 0 and step % 10 == 0:
                print(
                    f"step {step}: loss {mean_loss.item() / world:.4f} "
                    f"({int(sum(samples))} samples)",
                    flush=True,
                )
    digest = full_digest(model, opt)
    session.close()

    if rank == 0 and args.result:
        result: dict[str, object] = {
            "steps": session.committed,
            "world_size": world,
            "start_step": session.start_step,
            "digest": digest,
        }
        if start_digest is not None:
            result["start_digest"] = start_digest
        path = Path(args.result)
        tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(result) + "\n")
        tmp.replace(path)


if __name__ == "__main__":
    main()
