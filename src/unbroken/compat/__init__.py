"""Compatibility layers: the seed's own APIs over Unbroken's.

- :mod:`unbroken.compat.taskd`: ``init_taskd_manager`` / ``start_taskd_manager`` and
  ``init_taskd_worker`` / ``start_taskd_worker``. The top-level ``taskd`` package installed with
  Unbroken re-exports them under the seed's import paths, so a training script written for TaskD
  runs under Unbroken unchanged.
"""
