"""One rank of an HSDP job (2 replica groups x 2 shards, ``examples/train_sharded.py``'s model)
whose rank ``--lose`` loses its training state after step ``--at``: it builds a new model from
another seed and an optimizer without state, as a replacement process does, and every rank runs
the shard-wise repair (:func:`unbroken.worker.replica.repair`, ``source`` rank 0). The lost
shard comes from the rank holding the same shard in the other replica group. With
``--rebind`` every rank first moves its FSDP modules to a new mesh's process groups and
destroys the old ones, as the healthy ranks of a new generation must
(:func:`unbroken.worker.sharding.rebind`). Training goes on to ``--steps``; rank 0 writes
``<out>/result.txt``: the ranks that received and the digest of the whole state
(``full_digest``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard

from unbroken.worker.replica import repair
from unbroken.worker.sharding import rebind
from unbroken.worker.trainstate import TrainState

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from train_sharded import batch, full_digest, make_model


def build(seed: int, mesh: DeviceMesh) -> tuple[nn.Module, torch.optim.Optimizer]:
    model = make_model(seed)
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--lose", type=int, default=-1)
    p.add_argument("--at", type=int, default=3)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument(
        "--rebind", action="store_true", help="move the model to a new mesh's groups at --at"
    )
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("rep", "shard"))
    model, opt = build(5, mesh)
    received: tuple[int, ...] = ()
    for step in range(args.steps):
        if step == args.at and args.rebind:
            old = [mesh.get_group(d) for d in range(mesh.ndim)]
            new_mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("rep", "shard"))
            assert rebind(model, new_mesh) == 1
            for group in old:  # the old generation's groups are gone
                dist.destroy_process_group(group)
        if step == args.at and args.lose >= 0:
            fresh = rank == args.lose
            if fresh:
                model, opt = build(99, mesh)  # another start, no optimizer state
            state = TrainState(model, opt)
            done = repair(state, 0 if fresh else step, source=0, step=step, fresh=fresh)
            assert done.step == step, done
            received = done.receivers
        x, y = batch(5, step, rank, world)
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    digest = full_digest(model, opt)
    if rank == 0:
        (args.out / "result.txt").write_text(f"{list(received)}\n{digest}\n")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
