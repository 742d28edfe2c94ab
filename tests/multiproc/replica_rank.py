"""One rank of a 3-rank data-parallel group whose state is repaired from rank 0
(:func:`unbroken.worker.replica.repair`): rank ``--fresh`` is a replacement (another start, no
optimizer state, flagged as such), rank ``--diverged`` kept its process but one weight of its
model is off by a little, with nothing flagging it. Rank 0 writes ``<out>/result.json``: the
ranks that received, and whether every rank's training-state digest after the repair equals
rank 0's."""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from unbroken.worker.replica import repair
from unbroken.worker.trainstate import TrainState

STEP = 3


def build(seed: int, trained: bool) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    if trained:
        for step in range(STEP):
            g = torch.Generator().manual_seed(step)
            opt.zero_grad()
            model(torch.randn(8, 16, generator=g)).square().mean().backward()
            opt.step()
    return model, opt


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--fresh", type=int, default=-1)
    p.add_argument("--diverged", type=int, default=-1)
    args = p.parse_args()
    torch.set_num_threads(1)
    logging.basicConfig(format="%(created)f replica %(message)s")
    logging.getLogger("unbroken.worker.replica").setLevel(logging.INFO)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    fresh = rank == args.fresh
    model, opt = build(99 if fresh else 5, trained=not fresh)
    if rank == args.diverged:
        with torch.no_grad():
            model[0].weight[0, 0] += 1e-3
    state = TrainState(model, opt)
    done = repair(state, 0 if fresh else STEP, source=0, step=STEP, fresh=fresh)
    digest = torch.frombuffer(bytearray(state.digest(done.step)), dtype=torch.uint8)
    gathered = [torch.empty_like(digest) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, digest)
    if rank == 0:
        result = {
            "receivers": list(done.receivers),
            "equal": [bool(torch.equal(g, gathered[0])) for g in gathered],
            "step": done.step,
        }
        (args.out / "result.json").write_text(json.dumps(result) + "\n")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
