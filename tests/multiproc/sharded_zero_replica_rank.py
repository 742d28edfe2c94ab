"""One rank of a ZeRO-1 over DDP job (``examples/train_sharded.py``'s model) that keeps a
replica optimizer (:class:`unbroken.worker.zero.ReplicaOptimizer`): after every step each
replica is checked bitwise against its partner's own partition (:func:`verify`) and its
parameter copies against the parameters ZeRO broadcast. With ``--lose`` that rank loses its
optimizer state after step ``--at`` (a new ZeRO optimizer and replica, as a replacement process
builds, and the weights of another seed) and every rank runs
:func:`unbroken.worker.zero.repair_partitions`; the model comes from rank 0 (replicated).
With ``--half`` that rank is lost inside step ``--at``'s update instead: the
others updated their partitions and replicas, the broadcast of the updated partitions never
happened, and :func:`unbroken.worker.zero.complete_update` finishes it from their copies before
the lost rank's partitions are repaired. Training goes on to ``--steps``; rank 0 writes
``<out>/result.txt``: the transfers of each rank and the digest of the whole state
(``full_digest``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel

from unbroken.worker.zero import (
    ReplicaOptimizer,
    ZeroReplicaError,
    complete_update,
    repair_partitions,
    verify,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from train_sharded import batch, full_digest, make_model


def build(model: nn.Module) -> tuple[ZeroRedundancyOptimizer, ReplicaOptimizer]:
    opt = ZeroRedundancyOptimizer(
        model.parameters(), optimizer_class=torch.optim.AdamW, lr=1e-3, weight_decay=0.01
    )
    return opt, ReplicaOptimizer(opt).install()


def as_a_replacement(model: nn.Module) -> tuple[ZeroRedundancyOptimizer, ReplicaOptimizer]:
    """What a replacement process holds: the weights of another seed, a new ZeRO optimizer
    and replica."""
    with torch.no_grad():
        for param, other in zip(model.parameters(), make_model(99).parameters(), strict=True):
            param.copy_(other)
    return build(model)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--lose", type=int, default=-1)
    p.add_argument("--at", type=int, default=3)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument(
        "--half",
        action="store_true",
        help="lose the rank inside step --at's update: the others update their partitions and "
        "replicas, their broadcast never happens, and the update is completed from them",
    )
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model = DistributedDataParallel(make_model(1234))
    opt, replica = build(model)
    loss_fn = nn.CrossEntropyLoss()
    transfers = 0
    for step in range(args.steps):
        if step == args.at and args.lose >= 0 and not args.half:
            if rank == args.lose:
                opt, replica = as_a_replacement(model)
            with torch.no_grad():
                for param in model.module.parameters():
                    dist.broadcast(param, src=0)
            transfers = repair_partitions(replica, [args.lose])
        x, y = batch(1234, step, rank, world)
        opt.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        if step == args.at and args.half:
            if rank == args.lose:
                opt, replica = as_a_replacement(model)
            else:  # ZeRO's update up to its broadcast, and the replica's
                replica._take_params()
                opt.optim.step()
                replica._step()
            complete_update(replica, [r for r in range(world) if r != args.lose])
            transfers = repair_partitions(replica, [args.lose])
        else:
            opt.step()
        verify(replica)
        if not replica.params_match():
            raise ZeroReplicaError(f"rank {rank}: the replica's parameters differ after {step}")
    done = [torch.zeros(3, dtype=torch.int64) for _ in range(world)]
    tensors = sum(len(g["params"]) for g in replica.optim.param_groups)
    mine = [transfers, replica.extra_bytes() - 4 * tensors, replica.numel]  # less Adam's steps
    dist.all_gather(done, torch.tensor(mine))
    digest = full_digest(model, opt)
    if rank == 0:
        (Path(args.out) / "result.txt").write_text(
            f"{[int(t[0]) for t in done]}\n{digest}\n"
            + f"{sum(int(t[1]) for t in done)} {sum(int(t[2]) for t in done)}\n"
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
