"""One rank of an HSDP job (2 replica groups x 2 shards, ``examples/train_sharded.py``'s model)
whose rank ``--perturb`` changes its own shard of the first parameter before step
``--perturb-step``: the agreement check every 2 steps must catch that the two holders of that
shard differ, and nothing else. Each rank writes ``<out>/rank<R>.txt``: ``diverged`` and the
message, or ``finished``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

import unbroken.worker as ub

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from train_sharded import batch, make_model


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--perturb", type=int, default=-1)
    p.add_argument("--perturb-step", type=int, default=3)
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("rep", "shard"))
    model = make_model(5)
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    session = ub.init(model, opt, seed=5, agree_every=2)
    out = args.out / f"rank{rank}.txt"
    try:
        for step in session.steps(8):
            if rank == args.perturb and step == args.perturb_step:
                first = next(iter(model.parameters()))
                assert isinstance(first, DTensor)
                with torch.no_grad():
                    first.to_local().add_(1e-3)
            x, y = batch(5, step, rank, world)
            opt.zero_grad(set_to_none=True)
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    except ub.ReplicasDiverged as e:
        out.write_text(f"diverged\n{e}\n{sorted(e.ranks)} {list(e.parts)}\n")
        dist.barrier()
        dist.destroy_process_group()
        return
    session.close()
    out.write_text("finished\n")


if __name__ == "__main__":
    main()
