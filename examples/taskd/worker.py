"""The seed's TaskD worker snippet, from Megatron's ``pretrain()``, as it is.

Call :func:`start_taskd` where the seed's snippet sits: after the distributed environment is
initialized and the global rank is known.
"""

import torch.distributed as dist


def start_taskd() -> None:
    if dist.is_initialized():
        rank = dist.get_rank()
        # The seed's two import lines, verbatim (isort would merge them).
        from taskd.api.taskd_worker_api import init_taskd_worker  # noqa: I001
        from taskd.api.taskd_worker_api import start_taskd_worker

        init_taskd_worker(rank, 5000, "pt")
        start_taskd_worker()
