"""A job's resource as the operator reads and records it, for an ``AscendJob``
(:mod:`unbroken.operator.kube`) and a Volcano job (:mod:`unbroken.operator.volcano`) alike.

- :func:`job_spec`: the job, read from the resource's body with the parser ``unbroken plan``
  uses (:func:`job_document`: the body as the user wrote it);
- :func:`job_plan`: its plan, on the cluster the job itself describes;
- :func:`condition`: a status condition, stamped now;
- :data:`REPLACING`: the annotation that marks a pod the operator deletes to replace.

Neither kopf nor the Kubernetes client: only the body's dictionaries.
"""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

import yaml

from unbroken.operator.plan import Plan, plan
from unbroken.spec import JobSpec, load_cluster, parse_job

#: The annotation on a pod the operator deletes to replace (its value: the rescheduling's
#: number): its deletion is not a lost pod.
REPLACING = "unbroken.dev/replacing"
_FOREIGN_ANNOTATIONS = ("kopf.zalando.org/", "kubectl.kubernetes.io/", "unbroken.dev/")


def job_spec(body: dict[str, Any]) -> JobSpec:
    """The job as ``unbroken plan`` reads it; raises :class:`SpecError`."""
    meta = body.get("metadata", {})
    source = Path(f"{meta.get('namespace', 'default')}/{meta.get('name')}")
    return parse_job(yaml.safe_dump(job_document(body), sort_keys=False), source)


def job_document(body: dict[str, Any]) -> dict[str, Any]:
    """The job's YAML document as the user wrote it: without what the API server and the
    operators added (status, uid, kopf's and kubectl's annotations)."""
    meta = body.get("metadata", {})
    annotations = {
        k: v
        for k, v in (meta.get("annotations") or {}).items()
        if not k.startswith(_FOREIGN_ANNOTATIONS)
    }
    doc: dict[str, Any] = {
        "apiVersion": body.get("apiVersion"),
        "kind": body.get("kind"),
        "metadata": {"name": meta.get("name"), "namespace": meta.get("namespace", "default")},
        "spec": body.get("spec"),
    }
    if meta.get("labels"):
        doc["metadata"]["labels"] = meta["labels"]
    if annotations:
        doc["metadata"]["annotations"] = annotations
    return doc


def job_plan(job: JobSpec) -> Plan:
    return plan(job, load_cluster(None, job=job))


def condition(kind: str, reason: str, message: str) -> dict[str, str]:
    now = datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "type": kind,
        "status": "True",
        "reason": reason,
        "message": message,
        "lastTransitionTime": now,
    }
