"""The node agent: ``unbroken launch``, one per pod, a drop-in for torchrun.

Starts each rank as its own process (so one rank can be stopped or restarted alone), forked
from a warm zygote with torch imported once it has one, watches exits and heartbeats, reports
to the job manager and carries out its commands (:mod:`.managed`); without a job manager it
restarts like torchrun, minus the stale-store trap (:mod:`.standalone`). It imports no torch
itself.
"""
