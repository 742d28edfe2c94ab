"""The operator on Kubernetes: AscendJob resources in, pods and a Service out (kopf + the official
client; the only module that imports them, installed with ``pip install 'unbroken[kube]'``).

``python -m unbroken.operator.kube`` runs it cluster-wide with the pod's service account (or the
local kubeconfig); ``deploy/kubernetes/`` holds the CRD, RBAC and Deployment.

On an AscendJob's creation the job is read with the same parser as ``unbroken plan`` and planned
with :func:`unbroken.operator.plan.plan`. A job the parser refuses gets a ``Failed`` condition
with reason ``InvalidSpec`` and the parser's message (field, value, what is allowed), and no pods.
A valid job gets:

- a headless Service named after the job, selecting its pods (``job-name``), with the rank-0
  pod's ports;
- one pod per planned pod, from the replica's template, with the plan's name, labels (added to
  the template's), env (replacing the first container's), ports (likewise) and the job's
  annotations, owned by the job (deleting the job deletes them). Without a ``restartPolicy`` in
  the template the pod gets ``Never``: a failed pod is the operator's to replace, not the
  kubelet's to restart in place.

Status (``.status``): ``phase`` (``Created``, ``Running``, ``Rescheduling``, ``Failed``),
``reschedules``, ``pods`` (the planned names) and ``conditions`` (``Created``, ``Running``,
``Rescheduled``, ``Failed``, each with a reason and message).

A lost pod (phase ``Failed``, or deleted by anyone but the operator) goes to
:func:`unbroken.operator.reschedule.decide`, and its answer is carried out: the pods to replace are
marked (annotation ``unbroken.dev/replacing``) and deleted with the grace period the job's
``fault-scheduling`` gives; each marked pod's deletion event creates it again from the plan.
"""

from __future__ import annotations

import datetime
import logging
from pathlib import Path
from typing import Any

import kopf
import kubernetes
import yaml
from kubernetes.client.exceptions import ApiException

from unbroken.operator.plan import Plan, PodPlan, plan
from unbroken.operator.reschedule import GiveUp, Loss, PodLost, ReplacePods, decide
from unbroken.spec import JobSpec, SpecError, load_cluster, parse_job

log = logging.getLogger(__name__)

GROUP = "mindxdl.gitee.com"
VERSION = "v1"
PLURAL = "ascendjobs"
REPLACING = "unbroken.dev/replacing"
_FOREIGN_ANNOTATIONS = ("kopf.zalando.org/", "kubectl.kubernetes.io/", "unbroken.dev/")


def job_spec(body: dict[str, Any]) -> JobSpec:
    """The job as ``unbroken plan`` reads it; raises :class:`SpecError`."""
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
    source = Path(f"{meta.get('namespace', 'default')}/{meta.get('name')}")
    return parse_job(yaml.safe_dump(doc, sort_keys=False), source)


def job_plan(job: JobSpec) -> Plan:
    return plan(job, load_cluster(None, job=job))


def pod_manifest(body: dict[str, Any], job_plan: Plan, pod: PodPlan) -> dict[str, Any]:
    """The pod the plan asks for, built on its replica's template."""
    meta = body["metadata"]
    template = body["spec"]["replicaSpecs"][pod.replica_type.value]["template"]
    tmeta = template.get("metadata") or {}
    spec: dict[str, Any] = yaml.safe_load(yaml.safe_dump(template.get("spec") or {}))
    spec.setdefault("restartPolicy", "Never")
    spec["hostname"] = pod.name
    spec["subdomain"] = job_plan.job.name
    for c in spec.get("initContainers", []) + spec["containers"]:
        for part in ("limits", "requests"):
            quantities = (c.get("resources") or {}).get(part) or {}
            for key, value in quantities.items():
                quantities[key] = str(value)  # a quantity's canonical form is a string
    container = spec["containers"][0]
    container["env"] = [{"name": k, "value": v} for k, v in pod.env.items()]
    container["ports"] = [_port(p) for p in pod.ports]
    if not container["ports"]:
        del container["ports"]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod.name,
            "namespace": meta["namespace"],
            "labels": {**(tmeta.get("labels") or {}), **pod.labels},
            "annotations": {**(tmeta.get("annotations") or {}), **job_plan.job.annotations},
            "ownerReferences": [_owner(body)],
        },
        "spec": spec,
    }


def service_manifest(body: dict[str, Any], job_plan: Plan) -> dict[str, Any]:
    """The job's headless Service: pods reachable as ``<pod>.<job>``."""
    first = job_plan.pods[0]
    ports = [_port(p) for p in first.ports]
    for entry in ports:
        entry["port"] = entry.pop("containerPort")
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": job_plan.job.name,
            "namespace": body["metadata"]["namespace"],
            "labels": {"job-name": job_plan.job.name},
            "ownerReferences": [_owner(body)],
        },
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {"job-name": job_plan.job.name},
            "ports": ports or [{"name": "master", "port": 29500}],
        },
    }


def _model(cls: Any, manifest: dict[str, Any]) -> Any:
    """The client's typed model of ``manifest`` (its create calls take models, not dicts)."""
    model = cls.from_dict(manifest)
    assert model is not None
    return model


def _port(port: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"containerPort": port.container_port, "protocol": port.protocol}
    if port.name:
        out["name"] = port.name
    return out


def _owner(body: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "AscendJob",
        "name": body["metadata"]["name"],
        "uid": body["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def condition(kind: str, reason: str, message: str) -> dict[str, str]:
    now = datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "type": kind,
        "status": "True",
        "reason": reason,
        "message": message,
        "lastTransitionTime": now,
    }


def _with(conditions: list[dict[str, str]], new: dict[str, str]) -> list[dict[str, str]]:
    return [c for c in conditions if c.get("type") != new["type"]] + [new]


class Operator:
    """The handlers, over one API client (the service account's, or a test server's)."""

    def __init__(self, api: kubernetes.client.ApiClient) -> None:
        self.core = kubernetes.client.CoreV1Api(api)
        self.custom = kubernetes.client.CustomObjectsApi(api)

    def register(self, registry: kopf.OperatorRegistry) -> None:
        kopf.on.create(GROUP, VERSION, PLURAL, registry=registry)(self.job_created)
        kopf.on.event("", "v1", "pods", registry=registry, labels={"job-name": kopf.PRESENT})(
            self.pod_event
        )

    # --- the job ---

    def job_created(self, body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
        raw = dict(body)
        meta = raw["metadata"]
        fresh = self._job(meta["namespace"], meta["name"])
        if fresh is None or (fresh.get("status") or {}).get("phase"):
            # Gone, or handled already: a stale event replayed the creation (the status is
            # the operator's record; writing it again would turn a Running job back).
            return
        try:
            job = job_spec(raw)
        except SpecError as e:
            patch.status["phase"] = "Failed"
            patch.status["conditions"] = [condition("Failed", "InvalidSpec", str(e))]
            return
        p = job_plan(job)
        ns = raw["metadata"]["namespace"]
        self._create(
            lambda: self.core.create_namespaced_service(
                ns, _model(kubernetes.client.V1Service, service_manifest(raw, p))
            )
        )
        for pod in p.pods:
            self._create_pod(ns, pod_manifest(raw, p, pod))
        patch.status["phase"] = "Created"
        patch.status["reschedules"] = 0
        patch.status["pods"] = [pod.name for pod in p.pods]
        patch.status["conditions"] = [
            condition("Created", "PodsCreated", f"{len(p.pods)} pod(s) and Service {job.name}")
        ]

    # --- its pods ---

    def pod_event(self, event: kopf.RawEvent, **_: Any) -> None:
        pod: dict[str, Any] = dict(event["object"])
        meta = pod.get("metadata", {})
        owner = next(
            (o for o in meta.get("ownerReferences") or [] if o.get("kind") == "AscendJob"), None
        )
        if owner is None:
            return
        ns, name = meta["namespace"], meta["name"]
        replacing = REPLACING in (meta.get("annotations") or {})
        phase = (pod.get("status") or {}).get("phase")
        if event["type"] == "DELETED":
            if replacing:
                self._recreate(ns, owner["name"], name)
            else:
                self._lost(ns, owner["name"], PodLost(name, Loss.DELETED))
        elif phase == "Failed" and not replacing:
            detail = (pod.get("status") or {}).get("reason") or ""
            self._lost(ns, owner["name"], PodLost(name, Loss.FAILED, detail))
        elif phase == "Running":
            self._maybe_running(ns, owner["name"])

    def _job(self, ns: str, name: str) -> dict[str, Any] | None:
        try:
            got = self.custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)
            assert isinstance(got, dict)
            return got
        except ApiException as e:
            if e.status == 404:
                return None  # the job is gone: its pods go with it
            raise

    def _recreate(self, ns: str, job_name: str, pod_name: str) -> None:
        body = self._job(ns, job_name)
        if body is None:
            return
        p = job_plan(job_spec(body))
        pod = next(pp for pp in p.pods if pp.name == pod_name)
        self._create_pod(ns, pod_manifest(body, p, pod))

    def _still_lost(self, ns: str, lost: PodLost) -> bool:
        """Whether the pod is lost now, not only in the event: a replayed event must not count
        twice (a failed pod already marked for replacement, a deleted one already back)."""
        try:
            pod = self.core.read_namespaced_pod(lost.pod, ns)
        except ApiException as e:
            if e.status == 404:
                return lost.loss is Loss.DELETED
            raise
        if lost.loss is Loss.DELETED:
            return False
        annotations = (pod.metadata and pod.metadata.annotations) or {}
        return bool(pod.status and pod.status.phase == "Failed" and REPLACING not in annotations)

    def _lost(self, ns: str, job_name: str, lost: PodLost) -> None:
        if not self._still_lost(ns, lost):
            return
        body = self._job(ns, job_name)
        if body is None:
            return
        status = body.get("status") or {}
        if status.get("phase") == "Failed":
            return
        job = job_spec(body)
        p = job_plan(job)
        names = tuple(pod.name for pod in p.pods)
        if lost.pod not in names:
            return
        action = decide(job.fault_handling, names, lost, int(status.get("reschedules", 0)))
        conditions = list(status.get("conditions") or [])
        match action:
            case GiveUp(reason=reason, message=message):
                self._status(
                    ns, job_name, "Failed", conditions, condition("Failed", reason, message)
                )
            case ReplacePods():
                message = (
                    f"{lost.pod} {lost.loss.value.lower()}: {action.level.value} #{action.attempt} "
                    f"replaces {', '.join(action.pods)}"
                )
                self._status(
                    ns,
                    job_name,
                    "Rescheduling",
                    conditions,
                    condition("Rescheduled", action.level.value, message),
                    reschedules=action.attempt,
                )
                for pod_name in action.pods:
                    self._replace(ns, job_name, pod_name, action, lost)

    def _replace(
        self, ns: str, job_name: str, pod_name: str, action: ReplacePods, lost: PodLost
    ) -> None:
        if pod_name == lost.pod and lost.loss is Loss.DELETED:
            self._recreate(ns, job_name, pod_name)  # already gone
            return
        mark = {"metadata": {"annotations": {REPLACING: str(action.attempt)}}}
        try:
            self.core.patch_namespaced_pod(pod_name, ns, mark)
            self.core.delete_namespaced_pod(
                pod_name, ns, grace_period_seconds=action.grace_period_s
            )
        except ApiException as e:
            if e.status != 404:
                raise
            self._recreate(ns, job_name, pod_name)  # gone meanwhile

    def _maybe_running(self, ns: str, job_name: str) -> None:
        body = self._job(ns, job_name)
        if body is None:
            return
        status = body.get("status") or {}
        if status.get("phase") not in ("Created", "Rescheduling"):
            return
        planned = set(status.get("pods") or [])
        pods = self.core.list_namespaced_pod(ns, label_selector=f"job-name={job_name}").items
        running = {
            p.metadata.name for p in pods if p.metadata and p.status and p.status.phase == "Running"
        }
        if planned and planned <= running:
            message = f"{len(planned)} pod(s) running"
            conditions = list(status.get("conditions") or [])
            self._status(
                ns, job_name, "Running", conditions, condition("Running", "PodsRunning", message)
            )

    def _status(
        self,
        ns: str,
        job_name: str,
        phase: str,
        conditions: list[dict[str, str]],
        new: dict[str, str],
        **extra: Any,
    ) -> None:
        status = {"phase": phase, "conditions": _with(conditions, new), **extra}
        self.custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, ns, PLURAL, job_name, {"status": status}
        )

    def _create_pod(self, ns: str, manifest: dict[str, Any]) -> None:
        self._create(
            lambda: self.core.create_namespaced_pod(ns, _model(kubernetes.client.V1Pod, manifest))
        )

    @staticmethod
    def _create(call: Any) -> None:
        try:
            call()
        except ApiException as e:
            if e.status != 409:  # already there: a handler retried after a partial run
                raise


def registry_for(api: kubernetes.client.ApiClient) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()
    Operator(api).register(registry)
    return registry


def main() -> None:  # pragma: no cover - runs against a real cluster
    logging.basicConfig(level=logging.INFO)
    try:
        kubernetes.config.load_incluster_config()  # type: ignore[no-untyped-call]
    except kubernetes.config.ConfigException:
        kubernetes.config.load_kube_config()  # type: ignore[no-untyped-call]
    registry = registry_for(kubernetes.client.ApiClient())
    kopf.on.login(registry=registry)(kopf.login_via_client)
    kopf.run(
        registry=registry,
        clusterwide=True,
        standalone=True,
        liveness_endpoint="http://0.0.0.0:8080/healthz",
    )


if __name__ == "__main__":  # pragma: no cover
    main()
