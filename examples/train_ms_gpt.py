"""Train a small GPT with MindSpore, data parallel over MindSpore's dynamic cluster, resumable
and observable through unbroken.mindspore.

Written the way MindFormers' models are: a config object, RMSNorm, rotary-free causal attention,
a SwiGLU feed-forward, tied embeddings, ``AdamWeightDecay`` with a warm-up then cosine learning
rate (``LearningRateSchedule``), gradient clipping by global norm, no dropout (the pretraining
configs of LLaMA and Qwen set it to 0). Runs unchanged under ``msrun`` and under ``unbroken run``
(its job YAML starts it with ``msrun``, as MindCluster's do)::

    msrun --worker_num=2 --local_worker_num=2 --master_port=8118 --join=True \\
        examples/train_ms_gpt.py --steps 30 --ckpt-dir /tmp/ms-ckpt --ckpt-every 10

The data is a ``mindspore.dataset`` pipeline (a random-access corpus, shuffled and sharded
per rank, batched) that the session serves (``data=``), and the tokens seen so far are state
the script registers (``state=``). Everything that decides the result is a function of
``--seed``: the initial weights, the corpus and every epoch's order. Killed at any point and
restarted, the run resumes from its newest good checkpoint (or its last words), its data and
its registered state where they were, and ends bitwise equal to an uninterrupted run. Rank 0
writes ``--result`` as JSON: the steps trained, the world size, the data position, the tokens
seen and the sha256 digest of the final state (network and optimizer).
"""

from __future__ import annotations

import argparse
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mindspore as ms
import mindspore.dataset as ds
import numpy as np
from mindspore import nn, ops
from mindspore.communication import get_group_size, get_rank, init

import unbroken.mindspore as ub


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int = 256
    seq_length: int = 32
    hidden_size: int = 64
    num_heads: int = 4
    num_layers: int = 2
    ffn_hidden_size: int = 128
    batch_size: int = 4  # per data-parallel rank


class RMSNorm(nn.Cell):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = ms.Parameter(ops.ones(dim, ms.float32), name="weight")
        self.eps = eps

    def construct(self, x: ms.Tensor) -> ms.Tensor:
        norm = ops.rsqrt(ops.mean(x * x, -1, keep_dims=True) + self.eps)
        return x * norm * self.weight


class Attention(nn.Cell):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.heads, self.head_dim = cfg.num_heads, cfg.hidden_size // cfg.num_heads
        self.wqkv = nn.Dense(cfg.hidden_size, 3 * cfg.hidden_size, has_bias=False)
        self.wo = nn.Dense(cfg.hidden_size, cfg.hidden_size, has_bias=False)
        mask = np.triu(np.full((cfg.seq_length, cfg.seq_length), -1e9, np.float32), 1)
        self.mask = ms.Tensor(mask)

    def construct(self, x: ms.Tensor) -> ms.Tensor:
        b, s, h = x.shape
        qkv = self.wqkv(x).reshape(b, s, 3, self.heads, self.head_dim).transpose(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        scores = ops.matmul(q, k.transpose(0, 1, 3, 2)) / math.sqrt(self.head_dim)
        probs = ops.softmax(scores + self.mask[:s, :s], -1)
        out = ops.matmul(probs, v).transpose(0, 2, 1, 3).reshape(b, s, h)
        return self.wo(out)


class FeedForward(nn.Cell):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.w1 = nn.Dense(cfg.hidden_size, cfg.ffn_hidden_size, has_bias=False)
        self.w3 = nn.Dense(cfg.hidden_size, cfg.ffn_hidden_size, has_bias=False)
        self.w2 = nn.Dense(cfg.ffn_hidden_size, cfg.hidden_size, has_bias=False)

    def construct(self, x: ms.Tensor) -> ms.Tensor:
        return self.w2(ops.silu(self.w1(x)) * self.w3(x))


class Block(nn.Cell):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.attention_norm, self.attention = RMSNorm(cfg.hidden_size), Attention(cfg)
        self.ffn_norm, self.feed_forward = RMSNorm(cfg.hidden_size), FeedForward(cfg)

    def construct(self, x: ms.Tensor) -> ms.Tensor:
        x = x + self.attention(self.attention_norm(x))
        return x + self.feed_forward(self.ffn_norm(x))


class GPT(nn.Cell):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.CellList([Block(cfg) for _ in range(cfg.num_layers)])
        self.norm_out = RMSNorm(cfg.hidden_size)
        self.loss = nn.CrossEntropyLoss()

    def construct(self, tokens: ms.Tensor, labels: ms.Tensor) -> ms.Tensor:
        x = self.tok_embeddings(tokens)
        for layer in self.layers:
            x = layer(x)
        logits = ops.matmul(self.norm_out(x), self.tok_embeddings.embedding_table.T)
        return self.loss(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))


class WarmUpCosine(nn.learning_rate_schedule.LearningRateSchedule):
    """Linear warm-up to ``lr`` over ``warmup`` steps, then cosine decay to 10 % at ``total``."""

    def __init__(self, lr: float, warmup: int, total: int) -> None:
        super().__init__()
        self.lr, self.warmup, self.total = lr, max(warmup, 1), max(total, warmup + 1)

    def construct(self, global_step: ms.Tensor) -> ms.Tensor:
        step = global_step.astype(ms.float32)
        warm = self.lr * (step + 1) / self.warmup
        progress = ops.clamp((step - self.warmup) / (self.total - self.warmup), 0.0, 1.0)
        cosine = self.lr * (0.1 + 0.45 * (1 + ops.cos(progress * math.pi)))
        return ops.where(step < self.warmup, warm, cosine)


class TokenCorpus:
    """A corpus of ``size`` token sequences, random access (so a sampler can shuffle and shard
    it): sample ``i`` is a pure function of (seed, i), a repeating pattern with noise, so the
    loss falls."""

    def __init__(self, cfg: GPTConfig, seed: int, size: int) -> None:
        self.cfg, self.seed, self.size = cfg, seed, size

    def __getitem__(self, i: int) -> tuple[Any, Any]:
        cfg = self.cfg
        rng = np.random.default_rng([self.seed, int(i)])
        seq = (rng.integers(0, cfg.vocab_size) + 3 * np.arange(cfg.seq_length + 1)) % cfg.vocab_size
        noise = rng.random(seq.shape) < 0.1
        seq = np.where(noise, rng.integers(0, cfg.vocab_size, size=seq.shape), seq)
        return seq[:-1].astype(np.int32), seq[1:].astype(np.int32)

    def __len__(self) -> int:
        return self.size


class TokensSeen:
    """Training state of the script's own, registered with the session: checkpointed, and
    rolled back with a step that is redone."""

    def __init__(self) -> None:
        self.tokens = 0

    def state_dict(self) -> dict[str, int]:
        return {"tokens": self.tokens}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.tokens = int(state["tokens"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=100, help="total training steps")
    p.add_argument("--ckpt-dir", default=None, help="checkpoint directory (resumes from it)")
    p.add_argument("--ckpt-every", type=int, default=0, help="checkpoint every N steps; 0: never")
    p.add_argument("--result", default=None, help="rank 0 writes the final digest here (JSON)")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--layers", type=int, default=2)
    args = p.parse_args()

    ms.set_device("CPU")
    init()  # the dynamic cluster: MS_ROLE, MS_SCHED_HOST/PORT, MS_WORKER_NUM from the launcher
    rank, world = get_rank(), get_group_size()

    cfg = GPTConfig(num_layers=args.layers)
    ms.set_seed(args.seed)
    network = GPT(cfg)
    schedule = WarmUpCosine(args.lr, warmup=max(args.steps // 10, 1), total=args.steps)
    decay = [p for p in network.trainable_params() if len(p.shape) > 1]
    no_decay = [p for p in network.trainable_params() if len(p.shape) <= 1]
    optimizer = nn.AdamWeightDecay(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        learning_rate=schedule,
    )
    # Forward and backward compiled into one graph (MindFormers trains in graph mode too).
    grad_fn = ms.jit(ms.value_and_grad(network, None, optimizer.parameters))

    # Each rank reads its shard, shuffled anew every epoch (the session seeds each epoch).
    corpus = TokenCorpus(cfg, args.seed, size=16 * cfg.batch_size * world)
    dataset = ds.GeneratorDataset(
        corpus, ["tokens", "labels"], shuffle=True, num_shards=world, shard_id=rank
    ).batch(cfg.batch_size, drop_remainder=True)
    seen = TokensSeen()

    session = ub.init(
        network,
        optimizer,
        ckpt_dir=args.ckpt_dir,
        ckpt_every=args.ckpt_every,
        seed=args.seed,
        data=dataset,
        state={"tokens_seen": seen},
    )
    loss = None
    for _ in session.steps(args.steps):
        tokens, labels = session.batch()
        loss, grads = grad_fn(tokens, labels)
        seen.tokens += int(tokens.size)
        session.apply(grads, clip_norm=1.0)
    session.close()
    if loss is not None and rank == 0:
        print(f"rank 0: step {session.committed}, loss {float(loss.asnumpy()):.4f}", flush=True)

    if rank == 0 and args.result:
        result = {
            "steps": session.committed,
            "world_size": session.world_size,
            "start_step": session.start_step,
            "recoveries": session.recoveries,
            "data_position": session.data_position,
            "tokens_seen": seen.tokens,
            "digest": ub.state_digest(network, optimizer),
        }
        path = Path(args.result)
        tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(result) + "\n")
        tmp.replace(path)


if __name__ == "__main__":
    main()
