"""The operator on Kubernetes: AscendJob resources in, pods and a Service out (kopf + the official
client, installed with ``pip install 'unbroken[kube]'``; imported by this module, by
:mod:`unbroken.operator.volcano` and by the entry point :mod:`unbroken.operator.__main__`
alone).

:class:`Operator` holds the handlers (:mod:`unbroken.operator.volcano` reuses them for Volcano
jobs); ``python -m unbroken.operator`` registers both kinds' and runs them.

On an AscendJob's creation the job is read with the same parser as ``unbroken plan``
(:func:`unbroken.operator.resource.job_spec`) and planned with
:func:`unbroken.operator.plan.plan`. A job the parser refuses gets a ``Failed`` condition
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

A lost pod (phase ``Failed``, deleted by anyone but the operator, or bound to a node whose
``Ready`` condition is not ``True``) and a device fault in a node's
:data:`~unbroken.operator.reschedule.DEVICE_HEALTH` annotation become faults for the policy the
local engine uses (:mod:`unbroken.operator.reschedule`), and its answer is carried out: the pods to
replace are marked (annotation ``unbroken.dev/replacing``) and deleted with the grace period the
job's ``fault-scheduling`` gives; each marked pod's deletion event creates it again from the plan,
with a node affinity that keeps it off the nodes isolated so far (``status.avoidNodes``). The
policy's state lives in the operator; its budgets are kept in ``status.budgets`` too, so an
operator restart keeps what was spent.
"""

from __future__ import annotations

import base64
import contextlib
import logging
import threading
import time
from typing import Any

import kopf
import kubernetes
import yaml
from kubernetes.client.exceptions import ApiException

from unbroken.faults import CodeTable, Fault
from unbroken.operator import controlplane
from unbroken.operator.plan import Plan, PodPlan
from unbroken.operator.reschedule import (
    DEVICE_HEALTH,
    GiveUp,
    Level,
    Loss,
    PodLost,
    ReplacePods,
    decide,
    device_faults,
    device_health,
    pod_fault,
    recovered,
    state_from_status,
    status_of,
)
from unbroken.operator.resource import REPLACING, condition, job_document, job_plan, job_spec
from unbroken.policy.states import JobState
from unbroken.scheduler.backend import Replacement, carry_out
from unbroken.spec import SpecError

log = logging.getLogger(__name__)

GROUP = "mindxdl.gitee.com"
VERSION = "v1"
PLURAL = "ascendjobs"


def pod_manifest(
    body: dict[str, Any], job_plan: Plan, pod: PodPlan, avoid_nodes: tuple[str, ...] = ()
) -> dict[str, Any]:
    """The pod the plan asks for, built on its replica's template, off ``avoid_nodes``."""
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
    container["env"] = [{"name": k, "value": v} for k, v in cluster_env(job_plan, pod).items()]
    container["ports"] = [_port(p) for p in pod.ports]
    if not container["ports"]:
        del container["ports"]
    if avoid_nodes:
        off = {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": list(avoid_nodes)}
        required = (
            spec.setdefault("affinity", {})
            .setdefault("nodeAffinity", {})
            .setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
        )
        terms = required.setdefault("nodeSelectorTerms", [{}])
        for term in terms:  # the terms are ORed: each must keep off the nodes
            term.setdefault("matchExpressions", []).append(off)
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


def cluster_env(job_plan: Plan, pod: PodPlan) -> dict[str, str]:
    """The pod's planned env, with a pod name as an address (``MASTER_ADDR``,
    ``MS_SCHED_HOST``) made ``POD.JOB``: the name the job's headless Service gives it in the
    cluster's DNS (the pods' ``hostname`` and ``subdomain``); the bare pod name resolves only on
    a local runner."""
    names = {p.name for p in job_plan.pods}
    env = dict(pod.env)
    for key in ("MASTER_ADDR", "MS_SCHED_HOST"):
        if env.get(key) in names:
            env[key] = f"{env[key]}.{job_plan.job.name}"
    return env


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


def authority_data(job: str) -> dict[str, str]:
    """A new certificate authority for the job, as data of its Secret (``ca.crt``,
    ``ca.key``: mounted beside the token, where ``unbroken serve --secret-file`` and ``unbroken
    launch --token-file`` look for it)."""
    from unbroken.rpc.pki import CA_CERT, CA_KEY, new_authority

    authority = new_authority(job)
    return {
        CA_CERT: base64.b64encode(authority.cert).decode(),
        CA_KEY: base64.b64encode(authority.key).decode(),
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


def _with(conditions: list[dict[str, str]], new: dict[str, str]) -> list[dict[str, str]]:
    return [c for c in conditions if c.get("type") != new["type"]] + [new]


class Operator:
    """The handlers, over one API client (the service account's, or a test server's)."""

    def __init__(self, api: kubernetes.client.ApiClient) -> None:
        self.core = kubernetes.client.CoreV1Api(api)
        self.custom = kubernetes.client.CustomObjectsApi(api)
        self.codes = CodeTable.load()
        self.states: dict[tuple[str, str], JobState] = {}  # the policy's state per job
        self.health: dict[str, dict[int, str]] = {}  # device faults seen per node
        self.lock = threading.Lock()  # one decision at a time: events of a job race otherwise

    #: The label every pod of a job carries (its value: the job's name).
    POD_LABEL = "job-name"

    def owner_of(self, meta: dict[str, Any]) -> str | None:
        """The name of the job of this kind that owns the object, if one does."""
        return _job_owner(meta)

    def register(self, registry: kopf.OperatorRegistry) -> None:
        kopf.on.create(GROUP, VERSION, PLURAL, registry=registry)(self.job_created)
        kopf.on.event("", "v1", "pods", registry=registry, labels={"job-name": kopf.PRESENT})(
            self.pod_event
        )
        kopf.on.event("", "v1", "nodes", registry=registry)(self.node_event)

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
        if controlplane.wanted(job):
            pods = self._create_control_plane(raw, p)
            patch.status["phase"] = "Created"
            patch.status["reschedules"] = 0
            patch.status["pods"] = list(pods)
            patch.status["conditions"] = [
                condition(
                    "Created",
                    "ControlPlaneCreated",
                    f"control plane {pods[0]} and {len(pods) - 1} host pod(s) for "
                    f"{len(p.pods)} pod(s) of the job: its process-level rungs run there",
                )
            ]
            return
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
        owner = self.owner_of(meta)
        if owner is None:
            return
        ns, name = meta["namespace"], meta["name"]
        role = (meta.get("labels") or {}).get(controlplane.ROLE)
        if role is not None:
            self._control_plane_pod_event(ns, owner, name, role, str(event["type"]), pod)
            return
        replacing = REPLACING in (meta.get("annotations") or {})
        phase = (pod.get("status") or {}).get("phase")
        node = (pod.get("spec") or {}).get("nodeName")
        if event["type"] == "DELETED":
            self._deleted(ns, owner, name, node, replacing)
        elif phase == "Failed" and not replacing:
            detail = (pod.get("status") or {}).get("reason") or ""
            self._lost(ns, owner, PodLost(name, Loss.FAILED, detail, node))
        elif phase == "Running":
            self._maybe_running(ns, owner)

    def _deleted(self, ns: str, job_name: str, pod: str, node: str | None, ours: bool) -> None:
        """A pod of the job is gone: one the operator deleted to replace is made again, any
        other is a lost pod."""
        if ours:
            self._recreate(ns, job_name, pod)
        else:
            self._lost(ns, job_name, PodLost(pod, Loss.DELETED, node=node))

    # --- a job with its own control plane (unbroken.operator.controlplane) ---

    def _create_control_plane(self, raw: dict[str, Any], p: Plan) -> tuple[str, ...]:
        ns = raw["metadata"]["namespace"]
        owner = _owner(raw)
        token = controlplane.make_token()
        secret = controlplane.secret_manifest(raw, token, owner)
        # The job's certificate authority beside its token: the control plane's and the host
        # pods' certificates come from it (mutual TLS on the control channel).
        secret["data"].update(authority_data(p.job.name))
        config = controlplane.config_manifest(raw, job_document(raw), p, owner)
        self._create(
            lambda: self.core.create_namespaced_secret(
                ns, _model(kubernetes.client.V1Secret, secret)
            )
        )
        self._create(
            lambda: self.core.create_namespaced_config_map(
                ns, _model(kubernetes.client.V1ConfigMap, config)
            )
        )
        control, hosts = controlplane.names(p.job.name, p.cluster.nodes)
        self._create_pod(ns, controlplane.control_pod(raw, p, owner))
        for host in hosts:
            self._create_pod(ns, controlplane.host_pod(raw, p, host, owner))
        return (control, *hosts)

    def _control_plane_pod_event(
        self, ns: str, job_name: str, pod: str, role: str, kind: str, body: dict[str, Any]
    ) -> None:
        """The operator as the kubelet of the job's hosts: a host pod that ends or goes is made
        again (it joins again as the same node, and the job's control plane decides what its
        pods do); the job's phase follows the control-plane pod."""
        phase = (body.get("status") or {}).get("phase")
        job = self._job(ns, job_name)
        if job is None:
            return
        status = job.get("status") or {}
        conditions = list(status.get("conditions") or [])
        if status.get("phase") in ("Succeeded", "Failed"):
            return
        if role == controlplane.CONTROL:
            if phase == "Succeeded":
                new = condition("Succeeded", "ControlPlaneSucceeded", f"{pod} ended: succeeded")
                self._status(ns, job_name, "Succeeded", conditions, new)
            elif phase == "Failed" or kind == "DELETED":
                why = "deleted" if kind == "DELETED" else "failed (see its log for the reason)"
                new = condition("Failed", "ControlPlaneEnded", f"{pod} {why}")
                self._status(ns, job_name, "Failed", conditions, new)
            elif phase == "Running":
                self._maybe_running(ns, job_name)
            return
        if kind == "DELETED":
            self._create_pod(
                ns, controlplane.host_pod(job, job_plan(job_spec(job)), pod, _owner(job))
            )
            attempt = int(status.get("reschedules", 0)) + 1
            message = f"host pod {pod} made again; it joins the control plane as before"
            self._status(
                ns,
                job_name,
                status.get("phase") or "Running",
                conditions,
                condition("Rescheduled", "HostPodReplaced", message),
                reschedules=attempt,
            )
        elif phase in ("Failed", "Succeeded"):
            with contextlib.suppress(ApiException):  # gone already: its deletion makes it again
                self.core.delete_namespaced_pod(pod, ns, grace_period_seconds=0)
        elif phase == "Running":
            self._maybe_running(ns, job_name)

    # --- nodes ---

    def node_event(self, event: kopf.RawEvent, **_: Any) -> None:
        node: dict[str, Any] = dict(event["object"])
        name = (node.get("metadata") or {}).get("name")
        if not name or event["type"] == "DELETED":
            return
        conditions = (node.get("status") or {}).get("conditions") or []
        ready = next((c for c in conditions if c.get("type") == "Ready"), None)
        if ready is not None and ready.get("status") != "True":
            why = ready.get("reason") or f"Ready {ready.get('status')}"
            for ns, job_name, pod, _uid in self._pods_on(name):
                self._lost(ns, job_name, PodLost(pod, Loss.NODE_NOT_READY, why, name))
        value = ((node.get("metadata") or {}).get("annotations") or {}).get(DEVICE_HEALTH)
        try:
            health = device_health(name, value) if value else {}
        except ValueError as e:
            log.warning("%s", e)
            return
        seen = self.health.get(name, {})
        new = {d: c for d, c in health.items() if seen.get(d) != c}
        self.health[name] = health
        if not new:
            return
        now = time.time()
        for ns, job_name, pod, uid in self._pods_on(name):
            for fault in device_faults(name, new, (pod,), self.codes, now):
                # Acted on once per pod instance, recorded in the job's status: an operator
                # restarting does not act again on an annotation it has handled.
                once = f"{uid}/{fault.device}/{fault.code}" if uid else None
                self._decide(ns, job_name, fault, once)

    def _pods_on(self, node: str) -> list[tuple[str, str, str, str]]:
        """(namespace, job, pod, uid) of the jobs' pods bound to ``node``."""
        pods = self.core.list_pod_for_all_namespaces(
            label_selector=self.POD_LABEL, field_selector=f"spec.nodeName={node}"
        ).items
        out = []
        for p in pods:
            meta = p.metadata.to_dict() if p.metadata else {}
            owner = self.owner_of({"ownerReferences": meta.get("owner_references") or []})
            if owner is not None and (p.spec is None or p.spec.node_name == node):
                out.append((meta["namespace"], owner, meta["name"], meta.get("uid") or ""))
        return out

    def _job(self, ns: str, name: str) -> dict[str, Any] | None:
        try:
            got = self.custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)
            assert isinstance(got, dict)
            return got
        except ApiException as e:
            if e.status == 404:
                return None  # the job is gone: its pods go with it
            raise

    def _recreate(
        self, ns: str, job_name: str, pod_name: str, avoid: tuple[str, ...] | None = None
    ) -> None:
        body = self._job(ns, job_name)
        if body is None:
            return
        p = job_plan(job_spec(body))
        pod = next(pp for pp in p.pods if pp.name == pod_name)
        if avoid is None:
            avoid = tuple((body.get("status") or {}).get("avoidNodes") or ())
        self._create_pod(ns, pod_manifest(body, p, pod, avoid))

    def _still_lost(self, ns: str, lost: PodLost) -> bool:
        """Whether the pod is lost now, not only in the event: a replayed event must not count
        twice (a failed pod already marked for replacement, a deleted one already back)."""
        try:
            pod = self.core.read_namespaced_pod(lost.pod, ns)
        except ApiException as e:
            if e.status == 404:
                return lost.loss is Loss.DELETED
            raise
        annotations = (pod.metadata and pod.metadata.annotations) or {}
        if REPLACING in annotations:
            return False
        if lost.loss is Loss.DELETED:
            return False
        if lost.loss is Loss.NODE_NOT_READY:
            return True
        return bool(pod.status and pod.status.phase == "Failed")

    def _lost(self, ns: str, job_name: str, lost: PodLost) -> None:
        if not self._still_lost(ns, lost):
            return
        self._decide(ns, job_name, pod_fault(lost, self.codes, time.time()))

    def _decide(self, ns: str, job_name: str, fault: Fault, once: str | None = None) -> None:
        with self.lock:
            body = self._job(ns, job_name)
            if body is None:
                return
            status = body.get("status") or {}
            if status.get("phase") == "Failed":
                return
            job = job_spec(body)
            names = tuple(pod.name for pod in job_plan(job).pods)
            if fault.pod not in names:
                return
            handled = list(status.get("deviceFaults") or [])
            if once is not None:
                if once in handled:
                    return
                handled.append(once)
            key = (ns, job_name)
            state = self.states.get(key) or state_from_status(status)
            avoided = tuple(status.get("avoidNodes") or ())
            out = decide(state, fault, job.fault_handling, names, avoided, time.time())
            self.states[key] = out.state
            conditions = list(status.get("conditions") or [])
            budgets = status_of(out.state)
            match out.action:
                case None:
                    log.info("%s/%s: %s", ns, job_name, out.reason)
                    self._patch_status(ns, job_name, {"budgets": budgets, "deviceFaults": handled})
                case GiveUp(reason=reason, message=message):
                    self._status(
                        ns,
                        job_name,
                        "Failed",
                        conditions,
                        condition("Failed", reason, message),
                        budgets=budgets,
                        deviceFaults=handled,
                    )
                    self._give_up(ns, job_name)
                case ReplacePods() as action:
                    attempt = int(status.get("reschedules", 0)) + 1
                    message = (
                        f"{fault.detail}: {action.level.value} #{attempt} replaces "
                        f"{', '.join(action.pods)} ({out.reason})"
                    )
                    self._status(
                        ns,
                        job_name,
                        "Rescheduling",
                        conditions,
                        condition("Rescheduled", action.level.value, message),
                        reschedules=attempt,
                        budgets=budgets,
                        deviceFaults=handled,
                        avoidNodes=list(action.avoid_nodes),
                    )
                    self._replace(ns, job_name, attempt, action)

    def _replace(self, ns: str, job_name: str, attempt: int, action: ReplacePods) -> None:
        """Carry out a rescheduling: the pods are this operator's to delete and create."""
        r = Replacement(
            action.level is Level.JOB, action.pods, action.grace_period_s, action.avoid_nodes
        )
        carry_out(KubePods(self, ns, job_name, attempt, action.avoid_nodes), r)

    def _give_up(self, ns: str, job_name: str) -> None:
        """The job failed: its pods stay, for their logs, as a failed Job's do."""

    def _maybe_running(self, ns: str, job_name: str) -> None:
        body = self._job(ns, job_name)
        if body is None:
            return
        status = body.get("status") or {}
        if status.get("phase") not in ("Created", "Rescheduling"):
            return
        planned = set(status.get("pods") or [])
        selector = f"{self.POD_LABEL}={job_name}"
        pods = self.core.list_namespaced_pod(ns, label_selector=selector).items
        running = {
            p.metadata.name for p in pods if p.metadata and p.status and p.status.phase == "Running"
        }
        if planned and planned <= running:
            message = f"{len(planned)} pod(s) running"
            conditions = list(status.get("conditions") or [])
            key = (ns, job_name)
            with self.lock:
                state = self.states.get(key) or state_from_status(status)
                state = recovered(state, job_spec(body).fault_handling, time.time())
                self.states[key] = state
            self._status(
                ns,
                job_name,
                "Running",
                conditions,
                condition("Running", "PodsRunning", message),
                budgets=status_of(state),
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
        self._patch_status(ns, job_name, status)

    def _patch_status(self, ns: str, job_name: str, status: dict[str, Any]) -> None:
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


class KubePods:
    """The Kubernetes side of :class:`unbroken.scheduler.backend.PodBackend` for one job."""

    def __init__(
        self, op: Operator, ns: str, job_name: str, attempt: int, lost_nodes: tuple[str, ...]
    ) -> None:
        self.op, self.ns, self.job_name, self.attempt = op, ns, job_name, attempt
        self.lost_nodes = lost_nodes

    def stop_pods(self, pods: tuple[str, ...], grace_s: float | None) -> None:
        """Mark each pod as being replaced (its deletion event then creates it again rather
        than counting as a fault) and delete it with the grace period; at once on a lost node,
        whose kubelet cannot confirm a graceful stop (the pod would stay terminating)."""
        mark = {"metadata": {"annotations": {REPLACING: str(self.attempt)}}}
        for pod in pods:
            try:
                patched = self.op.core.patch_namespaced_pod(pod, self.ns, mark)
                node = patched.spec.node_name if patched.spec else None
                grace = 0 if node in self.lost_nodes else int(grace_s or 0)
                self.op.core.delete_namespaced_pod(pod, self.ns, grace_period_seconds=grace)
            except ApiException as e:
                if e.status != 404:  # gone already: start_pods creates it
                    raise

    def start_pods(self, pods: tuple[str, ...], avoid_nodes: tuple[str, ...]) -> None:
        """Create the pods that are gone; one still terminating is created by its deletion
        event (:meth:`Operator._recreate`), with the same ``avoid_nodes`` from the status."""
        for pod in pods:
            try:
                self.op.core.read_namespaced_pod(pod, self.ns)
            except ApiException as e:
                if e.status != 404:
                    raise
                self.op._recreate(self.ns, self.job_name, pod, avoid_nodes)


def _job_owner(meta: dict[str, Any]) -> str | None:
    """The name of the AscendJob that owns the object, if one does."""
    owners = meta.get("ownerReferences") or meta.get("owner_references") or []
    owner = next((o for o in owners if o.get("kind") == "AscendJob"), None)
    return None if owner is None else str(owner["name"])
