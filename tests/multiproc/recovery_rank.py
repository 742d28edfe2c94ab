"""One rank of a small DDP job for the recovery tests (``tests/support/recovery_job.py`` starts
it), written against the public session API (``ub.init`` / ``session.steps``), plus fault
injection that the tests ask for by flag:

``--die-in-backward R:S``  rank R SIGKILLs itself inside its backward pass of step S, while its
                           peers' gradient collectives are in flight;
``--fail-update R:S``      rank R's optimizer update of step S changes a parameter and then
                           raises (a memory error in the middle of the update);
``--die-in-transfer``      a rank serving as replica source SIGKILLs itself after sending the
                           first tensor of its state;
``--fail-retry-group R``   rank R's first op retry attempt fails at once, before its new group's
                           rendezvous, and every other rank reaches that rendezvous 0.5 s later
                           (the failed rank is the first out of the meeting);
``--per-parameter``        DDP without ``find_unused_parameters``: its buckets rebuild, so the
                           gradients are all-reduced one parameter at a time.

Injected faults fire only in a process that was not started as a replacement. Each rank
appends every step it runs to ``<out>/steps-rank<R>-pid<PID>`` and writes
``<out>/result-rank<R>.json`` (pid, steps committed, model digest) when it finishes.

Run as a script only (``python recovery_rank.py --steps N --out DIR ...``, or forked from the
test process's zygote): it imports nothing from the test tree.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import unbroken.worker as ub

D_IN, D_HIDDEN, N_CLASSES, BATCH = 32, 64, 8, 16


def _rank_step(value: str | None) -> tuple[int, int] | None:
    if value is None:
        return None
    rank, step = value.split(":")
    return int(rank), int(step)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--die-in-backward", default=None)
    p.add_argument("--fail-update", default=None)
    p.add_argument("--die-in-transfer", action="store_true")
    p.add_argument("--fail-retry-group", type=int, default=None)
    p.add_argument("--step-sleep", type=float, default=0.0)
    p.add_argument("--ckpt-dir", default=None)
    p.add_argument("--ckpt-every", type=int, default=0)
    p.add_argument(
        "--per-parameter",
        action="store_true",
        help="DDP with find_unused_parameters=False: buckets rebuild, gradients go one by one",
    )
    p.add_argument("--comm-timeout", type=float, default=20.0)
    p.add_argument("--command-timeout", type=float, default=30.0)
    args = p.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    replacement = os.environ.get("UNBROKEN_JOIN") == "1"
    die_in_backward = None if replacement else _rank_step(args.die_in_backward)
    fail_update = None if replacement else _rank_step(args.fail_update)

    torch.manual_seed(args.seed)
    model = nn.Sequential(
        nn.Linear(D_IN, D_HIDDEN),
        nn.ReLU(),
        nn.Dropout(0.2),
        nn.Linear(D_HIDDEN, D_HIDDEN),
        nn.ReLU(),
        nn.Linear(D_HIDDEN, N_CLASSES),
    )
    ddp = DistributedDataParallel(model, find_unused_parameters=not args.per_parameter)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-2, weight_decay=0.01)
    if fail_update is not None and fail_update[0] == rank:
        _inject_update_fault(opt, model, fail_update[1])
    if args.die_in_transfer and not replacement:
        _inject_transfer_death()
    if args.fail_retry_group is not None:
        _inject_retry_group_failure(args.fail_retry_group == rank)

    session = ub.init(
        ddp,
        opt,
        seed=args.seed,
        ckpt_dir=args.ckpt_dir,
        ckpt_every=args.ckpt_every,
        comm_timeout_s=args.comm_timeout,
        command_timeout_s=args.command_timeout,
    )
    log = (args.out / f"steps-rank{rank}-pid{os.getpid()}").open("a", buffering=1)
    teacher = torch.randn(D_IN, N_CLASSES, generator=torch.Generator().manual_seed(99))
    current = {"step": -1}
    if die_in_backward is not None and die_in_backward[0] == rank:
        last = model[0].weight  # the last gradient backward produces: the others are in flight

        def die(grad: torch.Tensor) -> torch.Tensor:
            if current["step"] == die_in_backward[1]:
                os.kill(os.getpid(), signal.SIGKILL)
            return grad

        last.register_hook(die)

    for step in session.steps(args.steps):
        current["step"] = step
        log.write(f"{step}\n")
        g = torch.Generator().manual_seed(args.seed * 1000 + step * 10 + session.rank)
        x = torch.randn(BATCH, D_IN, generator=g)
        y = (x @ teacher).argmax(dim=1)
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(ddp(x), y)
        loss.backward()
        if args.step_sleep:
            time.sleep(args.step_sleep)
        opt.step()
    committed = session.committed
    session.close()
    result = {
        "pid": os.getpid(),
        "rank": rank,
        "steps": committed,
        "digest": ub.state_digest(model),
    }
    (args.out / f"result-rank{rank}.json").write_text(json.dumps(result) + "\n")


def _inject_update_fault(opt: torch.optim.Optimizer, model: nn.Module, at_step: int) -> None:
    original = opt.step
    calls = {"n": 0}

    def step(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == at_step + 1:
            with torch.no_grad():
                model[0].weight[0].add_(1.0)  # half an update, then the device fails
            raise RuntimeError("injected: uncorrectable memory error during the optimizer update")
        return original(*args, **kwargs)

    opt.step = step  # type: ignore[method-assign]


def _inject_transfer_death() -> None:
    original = dist.broadcast
    sent = {"n": 0}

    def broadcast(tensor: torch.Tensor, src: int | None = None, *args: Any, **kwargs: Any) -> Any:
        if src is not None and src == dist.get_rank() and kwargs.get("group") is not None:
            sent["n"] += 1
            if sent["n"] == 4:  # header, description, first tensor sent
                os.kill(os.getpid(), signal.SIGKILL)
        return original(tensor, src, *args, **kwargs)

    dist.broadcast = broadcast


def _inject_retry_group_failure(here: bool) -> None:
    from unbroken.worker.opretry import OpRetrier

    original = OpRetrier.group
    calls = {"n": 0}

    def group(self: OpRetrier, generation: int, name: str) -> Any:
        if "/step-" in name:  # an attempt's group, not the hook's first one
            calls["n"] += 1
            if calls["n"] == 1:
                if here:
                    raise RuntimeError("injected: the new group's rendezvous failed here")
                time.sleep(0.5)
        return original(self, generation, name)

    OpRetrier.group = group  # type: ignore[method-assign]


if __name__ == "__main__":
    main()
