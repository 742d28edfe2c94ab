"""The job spec: read a job YAML (and the cluster's YAML) as the seed writes them, validate every
knob, and say what is wrong with file and line.

Public API::

    load_job(path) -> JobSpec                       # raises SpecError
    load_cluster(path | None, job=None) -> ClusterSpec

Decisions a user should know (details in each module's docstring):

- Bad input is an error, never a silent default: unknown values (an unknown ``recover-strategy``
  token too), out-of-range numbers, wrong YAML types (``on`` unquoted is a boolean: quote it),
  duplicate keys, malformed ``HCCL_OP_RETRY_PARAMS``. All problems of a file come together.
- ``recover-strategy`` tokens are kept in the fixed priority order retry, recover-in-place,
  recover, elastic-training, dump, with ``exit`` appended (:mod:`.faulthandling`).
- ``fault-retry-times: 0`` (or absent) means no unconditional retry: a job that fails without a
  hardware fault fails; device and node faults are still rescheduled.
- ``hotReset=1`` (graceful fault tolerance, sunset) with process-level recovery is rejected;
  alone it warns (:mod:`.cluster`).
- Deprecated and sunset features warn and say what to use instead: ``hotReset=1``,
  ``ELASTIC_PROCESS_RECOVER_ENABLE`` (Elastic Agent, removed 2026-12-30),
  ``python -m torch.distributed.launch`` (use ``torchrun``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from unbroken.spec.cluster import ClusterSpec, DevicePlugin, HotReset, load_cluster
    from unbroken.spec.job import JobKind, JobSpec, load_job, parse_job
    from unbroken.spec.launcher import LauncherArgs, LauncherKind
    from unbroken.spec.problems import Problem, SpecError
    from unbroken.spec.replicas import Port, ReplicaSpec, ReplicaType

# Loaded on first use: a training process imports the pure knob parsers
# (``unbroken.spec.envknobs``, ``unbroken.spec.knobs``) without the YAML loader behind these.
_LAZY = {
    "ClusterSpec": "unbroken.spec.cluster",
    "DevicePlugin": "unbroken.spec.cluster",
    "HotReset": "unbroken.spec.cluster",
    "load_cluster": "unbroken.spec.cluster",
    "JobKind": "unbroken.spec.job",
    "JobSpec": "unbroken.spec.job",
    "load_job": "unbroken.spec.job",
    "parse_job": "unbroken.spec.job",
    "LauncherArgs": "unbroken.spec.launcher",
    "LauncherKind": "unbroken.spec.launcher",
    "Problem": "unbroken.spec.problems",
    "SpecError": "unbroken.spec.problems",
    "Port": "unbroken.spec.replicas",
    "ReplicaSpec": "unbroken.spec.replicas",
    "ReplicaType": "unbroken.spec.replicas",
}

__all__ = [
    "ClusterSpec",
    "DevicePlugin",
    "HotReset",
    "JobKind",
    "JobSpec",
    "LauncherArgs",
    "LauncherKind",
    "Port",
    "Problem",
    "ReplicaSpec",
    "ReplicaType",
    "SpecError",
    "load_cluster",
    "load_job",
    "parse_job",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
