"""The operator for the seed's Volcano form: ``batch.volcano.sh/v1alpha1`` ``Job``s whose pods
Volcano's own controller creates, restarts and deletes.

Only jobs that declare the seed's fault handling (the ``fault-scheduling`` label) are handled;
every other Volcano job is left alone. The job is read with the parser ``unbroken plan`` uses
(a job it refuses is marked ``Failed`` with the parser's message and nothing else is done), and
its pods' events, the NotReady nodes under them and the device faults in their nodes'
``unbroken.dev/device-health`` annotations become faults for the same policy as an
``AscendJob``'s (:class:`unbroken.operator.kube.Operator`, whose handlers this class reuses). What
differs is who owns the pods, so how a decision is carried out:

- **Pod-level rescheduling** (``ReschedulePods``): the pods are marked
  (``unbroken.dev/replacing``) and deleted with the job's grace period; Volcano's controller
  creates each again from its task's template, under the same name.
- **Job-level rescheduling** (``RescheduleJob``): a Volcano bus ``Command`` (``bus.volcano.sh/
  v1alpha1``, action ``RestartJob``) aimed at the job: Volcano stops every pod and starts the job
  again, as ``vcctl job restart`` asks it to.
- **No rung left** (``FailJob``): a ``TerminateJob`` command; Volcano ends the job's pods.

The operator's record of the job (phase, conditions, rescheduling count, the policy's budgets,
the isolated nodes, the device faults already acted on) is the JSON value of the job's
``unbroken.dev/state`` annotation: a Volcano job's ``status`` is its controller's to write.

Not done for Volcano jobs, because Volcano, not the operator, creates their pods: the plan's
environment (``MASTER_ADDR``, ``NODE_RANK``, the recovery variables) is not injected, so the
job's templates must set what the training needs (Volcano gives each pod ``VC_TASK_INDEX`` and
the job's hosts); and a node the policy isolates is not kept out of Volcano's placement (its
device plugin's health and the node's conditions are what Volcano's scheduler reads).
"""

from __future__ import annotations

import json
import logging
from typing import Any

import kopf
import kubernetes
from kubernetes.client.exceptions import ApiException

from unbroken.operator.kube import Operator
from unbroken.operator.reschedule import Level, Loss, PodLost, ReplacePods
from unbroken.operator.resource import REPLACING, condition, job_plan, job_spec
from unbroken.spec import SpecError

log = logging.getLogger(__name__)

VC_GROUP = "batch.volcano.sh"
VC_VERSION = "v1alpha1"
VC_PLURAL = "jobs"
BUS_GROUP = "bus.volcano.sh"
BUS_VERSION = "v1alpha1"
BUS_PLURAL = "commands"
#: The operator's record of a Volcano job (JSON), in place of an AscendJob's status.
STATE = "unbroken.dev/state"
#: The label Volcano's controller puts on every pod of a job (its value: the job's name).
VC_JOB_LABEL = "volcano.sh/job-name"
#: The seed's switch of fault handling: a Volcano job without it is not the operator's.
HANDLED = "fault-scheduling"


def _vc_owner(meta: dict[str, Any]) -> str | None:
    """The name of the Volcano job that owns the object, if one does."""
    owners = meta.get("ownerReferences") or meta.get("owner_references") or []
    for o in owners:
        api = str(o.get("apiVersion") or o.get("api_version") or "")
        if o.get("kind") == "Job" and api.startswith(f"{VC_GROUP}/"):
            return str(o["name"])
    return None


def command(body: dict[str, Any], action: str, name: str, message: str) -> dict[str, Any]:
    """A Volcano bus ``Command`` named ``name`` asking Volcano's controller to act on the job
    ``body``. The name is the decision's (the job, the action, the rescheduling's number): a
    decision carried out twice sends one command."""
    meta = body["metadata"]
    return {
        "apiVersion": f"{BUS_GROUP}/{BUS_VERSION}",
        "kind": "Command",
        "metadata": {
            "name": name,
            "namespace": meta["namespace"],
            "ownerReferences": [
                {
                    "apiVersion": f"{VC_GROUP}/{VC_VERSION}",
                    "kind": "Job",
                    "name": meta["name"],
                    "uid": meta["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "action": action,
        "target": {
            "apiVersion": f"{VC_GROUP}/{VC_VERSION}",
            "kind": "Job",
            "name": meta["name"],
            "uid": meta["uid"],
        },
        "reason": "UnbrokenPolicy",
        "message": message,
    }


class VolcanoOperator(Operator):
    """The handlers for Volcano jobs (see the module doc)."""

    POD_LABEL = VC_JOB_LABEL

    def __init__(self, api: kubernetes.client.ApiClient) -> None:
        super().__init__(api)
        #: Pods deleted by others, which Volcano is making again: not deleted a second time.
        self._gone: set[tuple[str, str]] = set()

    def owner_of(self, meta: dict[str, Any]) -> str | None:
        return _vc_owner(meta)

    def register(self, registry: kopf.OperatorRegistry) -> None:
        handled = {HANDLED: kopf.PRESENT}
        kopf.on.create(VC_GROUP, VC_VERSION, VC_PLURAL, registry=registry, labels=handled)(
            self.vcjob_created
        )
        kopf.on.event("", "v1", "pods", registry=registry, labels={VC_JOB_LABEL: kopf.PRESENT})(
            self.pod_event
        )
        kopf.on.event("", "v1", "nodes", registry=registry)(self.node_event)

    # --- the job ---

    def vcjob_created(self, body: kopf.Body, **_: Any) -> None:
        raw = dict(body)
        meta = raw["metadata"]
        ns, name = meta["namespace"], meta["name"]
        fresh = self._job(ns, name)
        if fresh is None or (fresh.get("status") or {}).get("phase"):
            return  # gone, or a replayed creation of a job already recorded
        try:
            job = job_spec(raw)
        except SpecError as e:
            self._patch_status(
                ns,
                name,
                {"phase": "Failed", "conditions": [condition("Failed", "InvalidSpec", str(e))]},
            )
            return
        pods = [pod.name for pod in job_plan(job).pods]
        self._patch_status(
            ns,
            name,
            {
                "phase": "Created",
                "reschedules": 0,
                "pods": pods,
                "conditions": [
                    condition("Created", "Watched", f"{len(pods)} pod(s) made by Volcano")
                ],
            },
        )

    # --- its pods ---

    def _deleted(self, ns: str, job_name: str, pod: str, node: str | None, ours: bool) -> None:
        if ours:
            return  # deleted by the operator to replace it: Volcano makes it again
        self._gone.add((ns, pod))
        try:
            self._lost(ns, job_name, PodLost(pod, Loss.DELETED, node=node))
        finally:
            self._gone.discard((ns, pod))

    def _still_lost(self, ns: str, lost: PodLost) -> bool:
        if lost.loss is Loss.DELETED:
            return True  # this instance is gone, whether or not Volcano made the next one yet
        return super()._still_lost(ns, lost)

    # --- the record, in an annotation ---

    def _job(self, ns: str, name: str) -> dict[str, Any] | None:
        try:
            got = self.custom.get_namespaced_custom_object(
                VC_GROUP, VC_VERSION, ns, VC_PLURAL, name
            )
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        assert isinstance(got, dict)
        if HANDLED not in (got.get("metadata", {}).get("labels") or {}):
            return None  # not a job of this operator
        text = (got["metadata"].get("annotations") or {}).get(STATE)
        try:
            got["status"] = json.loads(text) if text else {}
        except ValueError:
            log.warning("%s/%s: annotation %s is not JSON; starting afresh", ns, name, STATE)
            got["status"] = {}
        return got

    def _patch_status(self, ns: str, job_name: str, status: dict[str, Any]) -> None:
        body = self._job(ns, job_name)
        if body is None:
            return
        merged = {**(body.get("status") or {}), **status}
        patch = {"metadata": {"annotations": {STATE: json.dumps(merged, sort_keys=True)}}}
        self.custom.patch_namespaced_custom_object(
            VC_GROUP, VC_VERSION, ns, VC_PLURAL, job_name, patch
        )

    # --- carrying out the policy's decisions through Volcano ---

    def _replace(self, ns: str, job_name: str, attempt: int, action: ReplacePods) -> None:
        if action.level is Level.JOB:
            self._command(
                ns, job_name, "RestartJob", f"{attempt}", f"rescheduling #{attempt}: every pod"
            )
            return
        mark = {"metadata": {"annotations": {REPLACING: str(attempt)}}}
        for pod in action.pods:
            if (ns, pod) in self._gone:
                continue  # deleted already; Volcano is making it again
            try:
                self.core.patch_namespaced_pod(pod, ns, mark)
                self.core.delete_namespaced_pod(pod, ns, grace_period_seconds=action.grace_period_s)
            except ApiException as e:
                if e.status != 404:  # gone already: Volcano makes it again
                    raise

    def _give_up(self, ns: str, job_name: str) -> None:
        self._command(ns, job_name, "TerminateJob", "end", "no rung of the job's policy is left")

    def _command(self, ns: str, job_name: str, action: str, suffix: str, message: str) -> None:
        body = self._job(ns, job_name)
        if body is None:
            return
        name = f"{job_name}-{action.lower()}-{suffix}"
        self._create(
            lambda: self.custom.create_namespaced_custom_object(
                BUS_GROUP, BUS_VERSION, ns, BUS_PLURAL, command(body, action, name, message)
            )
        )


def register(api: kubernetes.client.ApiClient, registry: kopf.OperatorRegistry) -> None:
    """Add the Volcano job handlers to ``registry``."""
    VolcanoOperator(api).register(registry)
