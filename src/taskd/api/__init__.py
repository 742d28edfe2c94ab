"""The seed's ``taskd.api``: the TaskD manager and worker calls, over Unbroken.

``from taskd.api import init_taskd_manager, start_taskd_manager`` (the seed's ``manager.py``)
and the worker pair come from :mod:`unbroken.compat.taskd`, the same objects; see there for what
each call does under Unbroken, and :mod:`taskd` for what a script using only them gets.
"""

from taskd.api.taskd_manager_api import init_taskd_manager, start_taskd_manager
from taskd.api.taskd_worker_api import init_taskd_worker, start_taskd_worker

__all__ = ["init_taskd_manager", "init_taskd_worker", "start_taskd_manager", "start_taskd_worker"]
