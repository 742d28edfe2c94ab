"""One of two ranks whose checkpoint save gets stuck: rank 0 starts a save that rank 1 never
joins (as when a peer is lost mid-save), lets it go with ``Checkpointer.abandon``, and then
exits the usual way, through the interpreter's shutdown, which waits for every thread of the
save. Rank 1 holds its end of the checkpoint group open until rank 0 has let go.

With ``--no-cut`` rank 0 cannot cut the links (as when a lost peer's links are already gone
while the save still waits): the save stays stuck, and the process must exit all the same.

Usage: ``python stuck_save_rank.py RANK PORT CKPT_DIR [--no-cut]``; prints ``abandoned after S s``.
"""

from __future__ import annotations

import logging
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from unbroken.checkpoint import Checkpointer
from unbroken.worker.recovery import checkpoint_group


def main() -> None:
    rank, port, root = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    store = dist.TCPStore("127.0.0.1", port, 2, rank == 0, timeout=timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
    # The group's timeout is far beyond the test's: only cutting its links ends the save.
    pg, cut = checkpoint_group(timeout_s=600.0)
    ckpt = Checkpointer(root, pg, cut=None if "--no-cut" in sys.argv[4:] else cut)
    if rank == 0:
        model = torch.nn.Linear(4, 4)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        ckpt.save_async(1, model, opt)
        began = time.monotonic()
        ckpt.abandon(wait_s=0.5)
        print(f"abandoned after {time.monotonic() - began:.1f} s", flush=True)
        store.set("abandoned", "1")
    else:
        store.wait(["abandoned"])
    dist.barrier()
    if rank == 1 and "--no-cut" in sys.argv[4:]:
        # Keep this end of the checkpoint group open until rank 0 (which hosts the store) is
        # gone: its save never sees the link close while it exits.
        deadline = time.monotonic() + 100.0
        try:
            while time.monotonic() < deadline:
                store.check(["abandoned"])
                time.sleep(0.2)
        except Exception:
            pass
        del pg
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
