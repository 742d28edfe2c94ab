"""The seed's TaskD worker snippet, from Megatron's ``pretrain()``, with the import path changed.

Call :func:`start_taskd` where the seed's snippet sits: after the distributed environment is
initialized and the global rank is known.
"""

import torch.distributed as dist


def start_taskd() -> None:
    if dist.is_initialized():
        rank = dist.get_rank()
        from unbroken.compat.taskd import init_taskd_worker, start_taskd_worker

        init_taskd_worker(rank, 5000, "pt")
        start_taskd_worker()
