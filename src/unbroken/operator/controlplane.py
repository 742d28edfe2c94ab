"""A job's own control plane on Kubernetes: the process-level rungs in pods.

A job whose ladder has a process-level rung (``retry``, ``recover-in-place``, ``recover``,
``elastic-training``, ``dump``) needs an agent beside its ranks and a job manager that
orders them: what ``unbroken serve`` and ``unbroken launch --join`` are across hosts. On
Kubernetes the operator makes exactly that, and decides nothing itself for such a job:

- a Secret ``JOB-unbroken`` with the job's token (128 random bits), mounted read-only (0400);
- a ConfigMap ``JOB-unbroken`` with the job (``job.yaml``, as the operator read it) and its
  cluster (``cluster.yaml``: one node per host pod, the job's devices per node);
- the control-plane pod ``JOB-control``: ``unbroken serve`` on the pod's own address, port
  :data:`CONTROL_PORT`, with the Secret's token; it owns the policy, the ledger and the
  rendezvous stores, as ``unbroken serve`` does on a host. Its spec is its own, not the
  training template's: the job's image and that command, no host network, host path,
  privilege or service-account token, no capability, a read-only root file system with
  ``emptyDir`` volumes for the run directory and ``/tmp``, and requests for CPU and memory
  (:func:`control_pod`);
- one host pod ``JOB-node-I`` per node of the cluster (the job's pods and the spare ones),
  from the first training replica's template, running ``unbroken launch --join
  JOB-control.JOB.NAMESPACE.svc.cluster.local:PORT --node node-I`` (fully qualified): the
  control plane places the job's pods on these hosts and starts, restarts and moves their
  ranks (process-level rungs, and a lost host's pod onto a spare host).

The operator's part after that is a kubelet's: a host pod that fails or is deleted is made
again under the same name, and joins again as the same node; the job's phase follows the
control-plane pod (``Succeeded`` or ``Failed`` when ``unbroken serve`` ends). A job opts out
with the annotation ``unbroken.dev/control-plane: "off"`` (its process-level rungs are then
refused, as before, and the operator reschedules pods itself).

Pure: manifests from the job; :mod:`unbroken.operator.kube` creates them.
"""

from __future__ import annotations

import base64
import secrets
from typing import Any

import yaml

from unbroken.operator.plan import Plan
from unbroken.spec import JobSpec
from unbroken.spec.knobs import Framework, Strategy

#: Where ``unbroken serve`` listens in the control-plane pod.
CONTROL_PORT = 29400
#: The label that tells the control-plane pod (``control-plane``) from the host pods (``host``).
ROLE = "unbroken.dev/role"
CONTROL = "control-plane"
HOST = "host"
#: The annotation that keeps a job off this mode (value ``off``).
OPT_OUT = "unbroken.dev/control-plane"
TOKEN_DIR = "/etc/unbroken/token"
JOB_DIR = "/etc/unbroken/job"
RUN_DIR = "/var/lib/unbroken/runs"
#: What the control-plane pod asks for: the policy, the ledger and the rendezvous stores (a
#: store process imports torch) of one job; no device.
CONTROL_RESOURCES = {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"memory": "4Gi"}}
_PROCESS_LEVEL = frozenset(
    {
        Strategy.RETRY,
        Strategy.RECOVER_IN_PLACE,
        Strategy.RECOVER,
        Strategy.ELASTIC_TRAINING,
        Strategy.DUMP,
    }
)


def wanted(job: JobSpec) -> bool:
    """Whether the job gets its own control plane: a process-level rung, and no opt-out. A
    MindSpore job gets none: its ranks take ``retry`` and last words in their own processes
    (``unbroken.mindspore``, switched on by the pods' ``MS_ENABLE_TFT``), and cannot rejoin in a
    live process, so every other recovery is a restart of its pods, which the operator does."""
    if job.annotations.get(OPT_OUT, "").lower() == "off" or job.framework is Framework.MINDSPORE:
        return False
    return bool(_PROCESS_LEVEL & set(job.fault_handling.strategies))


def names(job_name: str, nodes: int) -> tuple[str, tuple[str, ...]]:
    """The control-plane pod's name and the host pods' names, in node order."""
    return f"{job_name}-control", tuple(f"{job_name}-node-{i}" for i in range(nodes))


def node_of(host_pod: str, job_name: str) -> str:
    """The node a host pod joins as (``JOB-node-3`` -> ``node-3``)."""
    return host_pod.removeprefix(f"{job_name}-")


def make_token() -> str:
    return secrets.token_hex(16)


def secret_manifest(body: dict[str, Any], token: str, owner: dict[str, Any]) -> dict[str, Any]:
    meta = body["metadata"]
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": f"{meta['name']}-unbroken",
            "namespace": meta["namespace"],
            "labels": {"job-name": meta["name"]},
            "ownerReferences": [owner],
        },
        "type": "Opaque",
        "data": {"token": base64.b64encode(f"{token}\n".encode()).decode()},
    }


def config_manifest(
    body: dict[str, Any], job_document: dict[str, Any], the_plan: Plan, owner: dict[str, Any]
) -> dict[str, Any]:
    meta = body["metadata"]
    cluster = {
        "nodes": the_plan.cluster.nodes,
        "devicesPerNode": the_plan.cluster.devices_per_node,
    }
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": f"{meta['name']}-unbroken",
            "namespace": meta["namespace"],
            "labels": {"job-name": meta["name"]},
            "ownerReferences": [owner],
        },
        "data": {
            "job.yaml": yaml.safe_dump(job_document, sort_keys=False),
            "cluster.yaml": yaml.safe_dump(cluster, sort_keys=False),
        },
    }


def _template(body: dict[str, Any], the_plan: Plan) -> dict[str, Any]:
    """The pod template of the first replica that trains (its image, resources, volumes)."""
    first = next(p for p in the_plan.pods if p.node_rank is not None)
    template: dict[str, Any] = body["spec"]["replicaSpecs"][first.replica_type.value]["template"]
    out: dict[str, Any] = yaml.safe_load(yaml.safe_dump(template))
    return out


def _volumes(job_name: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    volumes = [
        {"name": "unbroken-job", "configMap": {"name": f"{job_name}-unbroken"}},
        {
            "name": "unbroken-token",
            "secret": {"secretName": f"{job_name}-unbroken", "defaultMode": 0o400},
        },
    ]
    mounts = [
        {"name": "unbroken-job", "mountPath": JOB_DIR, "readOnly": True},
        {"name": "unbroken-token", "mountPath": TOKEN_DIR, "readOnly": True},
    ]
    return volumes, mounts


def _pod(
    body: dict[str, Any],
    the_plan: Plan,
    name: str,
    role: str,
    command: list[str],
    owner: dict[str, Any],
    extra_env: list[dict[str, Any]] | None = None,
    ports: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    meta = body["metadata"]
    job_name = meta["name"]
    template = _template(body, the_plan)
    spec: dict[str, Any] = template.get("spec") or {}
    spec["restartPolicy"] = "Never"  # a pod that ends is the operator's to make again
    spec["hostname"] = name
    spec["subdomain"] = job_name
    volumes, mounts = _volumes(job_name)
    spec["volumes"] = [*(spec.get("volumes") or []), *volumes]
    container = spec["containers"][0]
    container["command"] = command
    container.pop("args", None)
    container["env"] = [*(container.get("env") or []), *(extra_env or [])]
    container["volumeMounts"] = [*(container.get("volumeMounts") or []), *mounts]
    if ports:
        container["ports"] = ports
    else:
        container.pop("ports", None)
    for c in spec.get("initContainers", []) + spec["containers"]:
        for part in ("limits", "requests"):
            quantities = (c.get("resources") or {}).get(part) or {}
            for key, value in quantities.items():
                quantities[key] = str(value)
    tmeta = template.get("metadata") or {}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": meta["namespace"],
            "labels": {**(tmeta.get("labels") or {}), "job-name": job_name, ROLE: role},
            "ownerReferences": [owner],
        },
        "spec": spec,
    }


def control_pod(body: dict[str, Any], the_plan: Plan, owner: dict[str, Any]) -> dict[str, Any]:
    """``unbroken serve`` on the pod's address, with the job, its cluster and its token, in a
    pod of its own making (:func:`_control_spec`): of the training template it takes only
    the first container's image (and pull policy), the pod's image pull secrets and labels."""
    job_name = body["metadata"]["name"]
    control, _ = names(job_name, the_plan.cluster.nodes)
    command = [
        "unbroken",
        "serve",
        f"{JOB_DIR}/job.yaml",
        "--cluster",
        f"{JOB_DIR}/cluster.yaml",
        "--listen",
        f"$(POD_IP):{CONTROL_PORT}",
        "--secret-file",
        f"{TOKEN_DIR}/token",
        "--run-dir",
        f"{RUN_DIR}/{job_name}",
    ]
    meta = body["metadata"]
    template = _template(body, the_plan)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": control,
            "namespace": meta["namespace"],
            "labels": {
                **((template.get("metadata") or {}).get("labels") or {}),
                "job-name": job_name,
                ROLE: CONTROL,
            },
            "ownerReferences": [owner],
        },
        "spec": _control_spec(template.get("spec") or {}, control, job_name, command),
    }


def _control_spec(
    template: dict[str, Any], name: str, job_name: str, command: list[str]
) -> dict[str, Any]:
    """The control-plane pod's spec. It runs the job manager, which needs no device, host
    resource or Kubernetes API: no host network, PID or IPC, no host path, no privilege or
    capability, no service-account token, a read-only root file system (the run directory and
    ``/tmp`` are ``emptyDir`` volumes). It runs as uid 0 with no capability: Kubernetes mounts a
    Secret's files as root's (an ``fsGroup`` would make the token group-readable, which
    ``unbroken serve --secret-file`` refuses), so a non-root user could not read the token."""
    first = template["containers"][0]
    volumes, mounts = _volumes(job_name)
    container: dict[str, Any] = {
        "name": "control-plane",
        "image": first["image"],
        "command": command,
        "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
        "ports": [{"name": "control", "containerPort": CONTROL_PORT, "protocol": "TCP"}],
        "volumeMounts": [
            *mounts,
            {"name": "unbroken-runs", "mountPath": RUN_DIR},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
        "resources": yaml.safe_load(yaml.safe_dump(CONTROL_RESOURCES)),
        "securityContext": {
            "privileged": False,
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsUser": 0,
            "capabilities": {"drop": ["ALL"]},
        },
    }
    if "imagePullPolicy" in first:
        container["imagePullPolicy"] = first["imagePullPolicy"]
    spec: dict[str, Any] = {
        "restartPolicy": "Never",  # a control plane that ends ends the job
        "hostname": name,
        "subdomain": job_name,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [container],
        "volumes": [
            *volumes,
            {"name": "unbroken-runs", "emptyDir": {}},
            {"name": "tmp", "emptyDir": {}},
        ],
    }
    if template.get("imagePullSecrets"):
        spec["imagePullSecrets"] = yaml.safe_load(yaml.safe_dump(template["imagePullSecrets"]))
    return spec


def host_pod(
    body: dict[str, Any], the_plan: Plan, name: str, owner: dict[str, Any]
) -> dict[str, Any]:
    """A host of the job's cluster: ``unbroken launch --join`` as the node the name says."""
    job_name = body["metadata"]["name"]
    control, _ = names(job_name, the_plan.cluster.nodes)
    command = [
        "unbroken",
        "launch",
        "--join",
        # Fully qualified: a relative name goes through the pod's DNS search list.
        f"{control}.{job_name}.{body['metadata']['namespace']}.svc.cluster.local:{CONTROL_PORT}",
        "--token-file",
        f"{TOKEN_DIR}/token",
        "--node",
        node_of(name, job_name),
        "--devices",
        str(the_plan.cluster.devices_per_node),
    ]
    return _pod(body, the_plan, name, HOST, command, owner)
