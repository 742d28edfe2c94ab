"""The agent without a job manager: what ``torchrun`` does, without its stale-store trap.

The agent of node rank 0 hosts the stores (not rank 0's training process, so a crash of rank 0
does not take them with it): the agents' own store on ``--master_port``, and one rendezvous
store per restart round for the ranks, on ``--master_port + 1 + round``. torch 2.13's env://
rendezvous puts no per-attempt prefix on its keys, so a store shared across rounds would hand
restarted ranks the addresses of dead ones (the stale-store trap of torchrun); a fresh store per
round cannot. When a local rank fails, its agent moves the shared round counter forward (compare
and set, so two agents failing together make one round); every agent that sees a newer round
restarts its ranks into it. ``--max_restarts`` bounds the rounds; rounds that end within
``QUICK_ROUND_S`` of their start back off and, past the no-progress default, end the launch
(:mod:`unbroken.policy.stall`). Without a job manager there is
no rescheduling and no process-level recovery: this mode exists so the same scripts and command
lines work with and without the control plane.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import queue
import sys
import time
from datetime import timedelta
from pathlib import Path

from unbroken.agent.env import rank_env
from unbroken.agent.launcher import LaunchArgs
from unbroken.agent.ranks import RankExit, RankProcess, rank_argv
from unbroken.policy import stall
from unbroken.rpc.store import host_store
from unbroken.spec.knobs import NO_PROGRESS_RESTARTS_DEFAULT

log = logging.getLogger(__name__)

_ROUND = "unbroken/round"
_DONE = "unbroken/done"


def run_standalone(args: LaunchArgs) -> int:
    from torch.distributed import TCPStore  # type: ignore[attr-defined]

    host = args.master_addr
    is_host = args.node_rank == 0
    try:
        # The host's stores listen on --master_addr alone, not on every interface: they have
        # no authentication (see unbroken.rpc.store).
        store = (
            host_store(host, args.master_port, timeout=timedelta(seconds=60))
            if is_host
            else TCPStore(
                host,
                args.master_port,
                is_master=False,
                wait_for_workers=False,
                timeout=timedelta(seconds=60),
            )
        )
    except Exception as exc:  # OSError, or the store's RuntimeError/DistNetworkError
        what = "host" if is_host else "reach"
        print(
            f"unbroken launch: cannot {what} the rendezvous store at {host}:{args.master_port}: "
            f"{exc}",
            file=sys.stderr,
        )
        return 1
    if is_host:
        store.set(_ROUND, "0")
    log_dir = Path(args.log_dir) if args.log_dir else None
    exits: queue.Queue[RankExit] = queue.Queue()
    argv = rank_argv(args.script, args.script_args, args.module, args.no_python)
    generation = int(store.get(_ROUND).decode())
    restarts = 0

    round_stores: dict[int, TCPStore] = {}

    def start(gen: int) -> dict[int, RankProcess]:
        port = args.master_port + 1 + gen
        if is_host and gen not in round_stores:
            round_stores.clear()  # the previous round's store closes
            round_stores[gen] = host_store(host, port, timeout=timedelta(seconds=60))
        round_args = dataclasses.replace(args, master_port=port)
        procs = {}
        for local in range(args.nproc_per_node):
            rank = args.global_rank(local)
            logp = (log_dir or Path.cwd() / "unbroken-logs") / f"rank{rank}.log"
            procs[rank] = RankProcess(
                rank=rank,
                local_rank=local,
                generation=gen,
                argv=argv,
                env=rank_env(os.environ, round_args, local, gen, None),
                log_path=logp,
                on_exit=exits.put,
            )
        return procs

    procs = start(generation)
    round_began = time.monotonic()
    stalls = 0  # rounds in a row that ended quickly (unbroken.policy.stall)
    done: set[int] = set()
    while True:
        failed = False
        try:
            ex = exits.get(timeout=args.monitor_interval_s)
            if ex.generation == generation:
                if ex.succeeded:
                    done.add(ex.rank)
                else:
                    log.warning("rank %d %s", ex.rank, ex.describe())
                    print(f"unbroken launch: rank {ex.rank} {ex.describe()}", file=sys.stderr)
                    failed = True
        except queue.Empty:
            pass
        if len(done) == args.nproc_per_node:
            break
        current = int(store.get(_ROUND).decode())
        if failed and current == generation:
            store.compare_set(_ROUND, str(generation), str(generation + 1))
            current = int(store.get(_ROUND).decode())
        if current != generation:
            stalls = stall.after_round(stalls, time.monotonic() - round_began)
            if stalls > NO_PROGRESS_RESTARTS_DEFAULT:
                print(
                    f"unbroken launch: giving up: {stalls} rounds in a row ended within "
                    f"{stall.QUICK_ROUND_S:.0f} s of their start (no progress; see the rank logs)",
                    file=sys.stderr,
                )
                for p in procs.values():
                    p.kill()
                return 1
            if restarts >= args.max_restarts:
                print(
                    f"unbroken launch: giving up after {restarts} restarts (--max_restarts)",
                    file=sys.stderr,
                )
                for p in procs.values():
                    p.kill()
                return 1
            restarts += 1
            for p in procs.values():
                p.kill()
            for p in procs.values():
                p.wait(5.0)
            while not exits.empty():
                exits.get_nowait()
            generation = current
            done.clear()
            print(f"unbroken launch: restarting ranks into round {generation}", file=sys.stderr)
            if (delay_s := stall.backoff_s(stalls)) > 0:
                print(f"unbroken launch: backing off {delay_s:.0f} s", file=sys.stderr)
                time.sleep(delay_s)
            round_began = time.monotonic()
            procs = start(generation)
    store.add(_DONE, 1)
    if is_host:
        deadline = time.monotonic() + 60
        while int(store.add(_DONE, 0)) < args.nnodes and time.monotonic() < deadline:
            time.sleep(0.1)
    return 0
