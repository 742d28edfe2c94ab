"""Train a tiny GPT with DDP on gloo, written the way such scripts are written, and resumable
through every fault through unbroken.worker.

Runs unchanged under plain torchrun and under ``unbroken launch``::

    OMP_NUM_THREADS=1 torchrun --nproc_per_node 2 examples/train_gpt.py \\
        --steps 40 --ckpt-dir /tmp/gpt-ckpt --ckpt-every 10 --result /tmp/gpt.json

The loop is the usual one: a token and position embedding, a causal mask registered as a
buffer, dropout, pre-norm attention and MLP blocks; AdamW with two parameter groups (no weight
decay on biases, norms and embeddings); a warmup-then-cosine ``LambdaLR`` stepped after
``optimizer.step()`` as the torch docs show; gradient clipping; a ``DistributedSampler``
(shuffled, re-seeded every epoch) behind torchdata's ``StatefulDataLoader`` (or a plain
``DataLoader`` with ``--loader plain``). DDP keeps ``broadcast_buffers`` at its default.

What the script adds for Unbroken is two arguments of ``ub.init``: ``state={"scheduler":
scheduler}`` and ``data=loader``, and ``session.batch()`` in place of ``next(data_iter)``.
With them every fault, in process or by restart, ends with the model, optimizer, scheduler and
data position of a fault-free run, bit for bit. ``--unregistered-scheduler`` leaves the
scheduler out of ``state=``, as a script that forgets it would: the session's agreement check
then finds the replicas diverged after an in-process recovery. ``--device cuda`` trains on the
rank's GPU (``ub.device()``; several ranks may share one) with deterministic algorithms, over
gloo as on CPU.

Every rank writes ``--result`` (rank 0 to the path itself, rank r to ``PATH.rank<r>``) as JSON:
the steps trained, the world size and digests of the final model, optimizer, scheduler and data
position.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import time
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset, DistributedSampler
from torchdata.stateful_dataloader import StatefulDataLoader

import unbroken.worker as ub

VOCAB, CONTEXT, WIDTH, HEADS, LAYERS = 96, 32, 64, 4, 2
SAMPLES = 512  # sequences in the data set


class Tokens(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Synthetic token sequences with structure to learn (each token depends on the two before
    it), a pure function of the index: the data set a real corpus stands in for."""

    def __init__(self, seed: int) -> None:
        self.seed = seed

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(self.seed * 100_003 + index)
        seq = torch.empty(CONTEXT + 1, dtype=torch.long)
        seq[:2] = torch.randint(0, VOCAB, (2,), generator=g)
        noise = torch.randint(0, VOCAB, (CONTEXT + 1,), generator=g)
        flip = torch.rand(CONTEXT + 1, generator=g) < 0.1
        for i in range(2, CONTEXT + 1):
            nxt = (seq[i - 1] * 7 + seq[i - 2] * 3 + 1) % VOCAB
            seq[i] = noise[i] if flip[i] else nxt
        return seq[:-1], seq[1:]


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(WIDTH)
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH)
        self.proj = nn.Linear(WIDTH, WIDTH)
        self.ln2 = nn.LayerNorm(WIDTH)
        self.mlp = nn.Sequential(
            nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH)
        )
        self.drop = nn.Dropout(0.1)
        mask = torch.tril(torch.ones(CONTEXT, CONTEXT, dtype=torch.bool))
        self.register_buffer("causal_mask", mask.view(1, 1, CONTEXT, CONTEXT))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(WIDTH, dim=2)
        q, k, v = (z.view(b, t, HEADS, c // HEADS).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(c // HEADS)
        att = att.masked_fill(~self.causal_mask[:, :, :t, :t], float("-inf")).softmax(dim=-1)
        y = (self.drop(att) @ v).transpose(1, 2).reshape(b, t, c)
        x = x + self.drop(self.proj(y))
        return x + self.drop(self.mlp(self.ln2(x)))


class GPT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tok = nn.Embedding(VOCAB, WIDTH)
        self.pos = nn.Embedding(CONTEXT, WIDTH)
        self.drop = nn.Dropout(0.1)
        self.blocks = nn.Sequential(*(Block() for _ in range(LAYERS)))
        self.ln = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1])
        x = self.drop(self.tok(idx) + self.pos(pos))
        return self.head(self.ln(self.blocks(x)))


def param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Weight decay on matrices only (not on biases, norms, embeddings)."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        matrix = p.dim() >= 2 and not name.startswith(("tok.", "pos."))
        (decay if matrix else no_decay).append(p)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def warmup_cosine(warmup: int, total: int) -> Any:
    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, total - warmup)
        return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    return factor


def sha(value: Any) -> str:
    h = hashlib.sha256()

    def feed(v: Any) -> None:
        if isinstance(v, torch.Tensor):
            h.update(f"{v.dtype}{tuple(v.shape)}".encode())
            h.update(v.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
        elif isinstance(v, dict):
            for k in sorted(v, key=repr):
                h.update(repr(k).encode())
                feed(v[k])
        elif isinstance(v, list | tuple):
            for item in v:
                feed(item)
        else:
            h.update(repr(v).encode())

    feed(value)
    return h.hexdigest()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=100, help="total training steps")
    p.add_argument("--ckpt-dir", default=None, help="checkpoint directory (resumes from it)")
    p.add_argument("--ckpt-every", type=int, default=0, help="checkpoint every N steps; 0: never")
    p.add_argument("--result", default=None, help="each rank writes its final digests here")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--batch", type=int, default=8, help="sequences per rank and step")
    p.add_argument("--loader", choices=("stateful", "plain"), default="stateful")
    p.add_argument("--workers", type=int, default=0, help="data loader worker processes")
    p.add_argument("--agree-every", type=int, default=100, help="agreement check interval")
    p.add_argument("--unregistered-scheduler", action="store_true")
    p.add_argument("--step-sleep", type=float, default=0.0, help="extra seconds of 'compute'")
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

    torch.manual_seed(args.seed)
    model = GPT().to(device)
    ddp = DistributedDataParallel(model, find_unused_parameters=True)  # fixed buckets
    opt = torch.optim.AdamW(param_groups(model, 0.1), lr=args.lr, betas=(0.9, 0.95))
    scheduler = torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine(10, args.steps))

    # torchdata 0.11 calls a torch function that torch 2.13 marks deprecated, on every loader.
    warnings.filterwarnings("ignore", message="'set_vital' is deprecated")
    dataset = Tokens(args.seed)
    sampler = DistributedSampler(dataset, shuffle=True, seed=args.seed, drop_last=True)
    loader_cls = StatefulDataLoader if args.loader == "stateful" else DataLoader
    loader = loader_cls(
        dataset, batch_size=args.batch, sampler=sampler, num_workers=args.workers, drop_last=True
    )

    session = ub.init(
        ddp,
        opt,
        state={} if args.unregistered_scheduler else {"scheduler": scheduler},
        data=loader,
        ckpt_dir=args.ckpt_dir,
        ckpt_every=args.ckpt_every,
        seed=args.seed,
        agree_every=args.agree_every,
    )
    loss = torch.tensor(float("nan"))
    for _step in session.steps(args.steps):
        x, y = (t.to(device) for t in session.batch())
        logits = ddp(x)
        loss = F.cross_entropy(logits.view(-1, VOCAB), y.view(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(ddp.parameters(), 1.0)
        if args.step_sleep:
            time.sleep(args.step_sleep)
        opt.step()
        scheduler.step()
    position = session.data_position
    session.close()

    if args.result:
        result = {
            "rank": rank,
            "steps": session.committed,
            "world_size": session.world_size,
            "start_step": session.start_step,
            "digest": ub.state_digest(model),
            "optimizer": sha(opt.state_dict()),
            "scheduler": sha(scheduler.state_dict()),
            "data": position,
            "loss": float(loss.detach()),
        }
        path = Path(args.result)
        if rank:
            path = path.with_name(f"{path.name}.rank{rank}")
        tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(result) + "\n")
        tmp.replace(path)


if __name__ == "__main__":
    main()
