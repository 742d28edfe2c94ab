"""The seed's ``taskd.api.taskd_manager_api``: ``init_taskd_manager`` and
``start_taskd_manager``, the very functions of :mod:`unbroken.compat.taskd`.

Under Unbroken the job manager is part of the control plane that ``unbroken run JOB.yaml``
starts, outside the training pods: ``start_taskd_manager()`` starts nothing; inside a pod of a
run it checks the run is the configured job and waits until the run ends.
"""

from unbroken.compat.taskd import init_taskd_manager, start_taskd_manager

__all__ = ["init_taskd_manager", "start_taskd_manager"]
