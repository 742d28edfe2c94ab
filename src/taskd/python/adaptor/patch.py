"""The seed's ``taskd.python.adaptor.patch``: imported by torchrun, it changes nothing.

The seed's Dockerfile puts ``import taskd.python.adaptor.patch`` into torchrun's
``torch/distributed/run.py`` (``sed -i '/import os/i import taskd.python.adaptor.patch' ...``).
TaskD's module of that name replaces parts of torchrun's elastic agent so that TaskD's agent
drives it: it stops, starts, restarts and monitors the ranks on TaskD's orders, kills them with
SIGKILL, and turns ``--max_restarts 0`` into a large count. Under Unbroken the pods'
launcher is ``unbroken launch`` (a job's ``torchrun`` line runs as ``unbroken launch``), a
drop-in for torchrun that already is that agent, driven by the job manager of ``unbroken run``.
So the line may stay in an image: importing this module patches nothing, imports neither torch
nor grpc, and leaves torchrun as it is.

Imported in a process that is not under an Unbroken agent (plain ``torchrun``, whose ranks have
none of Unbroken's fault handling), it logs once, at debug level, what it is: nothing is
printed unless the process enables debug logging for it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

from unbroken.worker.env import GENERATION, JOB_ID

log = logging.getLogger(__name__)

#: What this module is, as logged in a process that is not under an Unbroken agent.
WHAT = (
    "taskd.python.adaptor.patch is Unbroken's stand-in for TaskD's torchrun patch and patches "
    "nothing: this process is not under an Unbroken agent, so it has neither TaskD's fault "
    "handling nor Unbroken's. Under Unbroken the launcher is `unbroken launch`, which carries "
    "what TaskD's patch adds to torchrun: start the job with `unbroken run JOB.yaml`"
)

_said = False


def under_unbroken(environ: Mapping[str, str]) -> bool:
    """Whether ``environ`` is that of a process under an Unbroken agent: a pod of a run (the
    job manager sets ``UNBROKEN_JOB_ID``) or a rank ``unbroken launch`` started
    (``UNBROKEN_GENERATION``)."""
    return bool(environ.get(JOB_ID) or environ.get(GENERATION))


def say_once(environ: Mapping[str, str] | None = None) -> bool:
    """Log :data:`WHAT` at debug level, once per process, when not under an Unbroken agent;
    whether it was logged now. ``environ`` defaults to ``os.environ``."""
    global _said
    if _said or under_unbroken(os.environ if environ is None else environ):
        return False
    _said = True
    log.debug(WHAT)
    return True


say_once()

__all__ = ["WHAT", "say_once", "under_unbroken"]
