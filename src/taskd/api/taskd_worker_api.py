"""The seed's ``taskd.api.taskd_worker_api``: ``init_taskd_worker`` and ``start_taskd_worker``,
the very functions of :mod:`unbroken.compat.taskd`.

The seed's snippet works as written (``init_taskd_worker(rank, 5000, "pt")`` then
``start_taskd_worker()``). Under an Unbroken agent ``start_taskd_worker()`` returns True and
starts nothing: the worker's duties (heartbeat, step commit, stop at a step boundary, in-process
recovery) are the hooks of the training session, ``unbroken.worker.init(...)``, which the script
must create to have the in-process rungs (see :mod:`taskd`).
"""

from unbroken.compat.taskd import init_taskd_worker, start_taskd_worker

__all__ = ["init_taskd_worker", "start_taskd_worker"]
