"""The operator's API contract, run in-process against kmock's Kubernetes emulator: an AscendJob
becomes the planned pods (name, env, labels, ports, owner) and a Service; a failed pod, a node
gone NotReady and a device fault in a node's annotation are decided by the local engine's policy
and carried out as the job's rung; a bad job gets a Failed condition and no pods; the status says
so. A Volcano job's failed pod is decided by the same policy and carried out through Volcano (the
pod deleted for its controller to make again, or a RestartJob / TerminateJob bus command)."""

from __future__ import annotations

import asyncio
import base64
import json
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

kopf = pytest.importorskip("kopf")
kmock = pytest.importorskip("kmock")
kubernetes = pytest.importorskip("kubernetes")

from unbroken.operator import Plan, kube, plan  # noqa: E402
from unbroken.operator.__main__ import registry_for  # noqa: E402
from unbroken.operator.reschedule import DEVICE_HEALTH  # noqa: E402
from unbroken.operator.resource import REPLACING  # noqa: E402
from unbroken.spec import load_cluster, load_job  # noqa: E402

pytestmark = pytest.mark.component

SEED = Path(__file__).resolve().parents[2] / "fixtures" / "seed"
JOBS = kmock.resource("mindxdl.gitee.com", "v1", "ascendjobs")
PODS = kmock.resource("", "v1", "pods")
SERVICES = kmock.resource("", "v1", "services")
SECRETS = kmock.resource("", "v1", "secrets")
CONFIGMAPS = kmock.resource("", "v1", "configmaps")
NODES = kmock.resource("", "v1", "nodes")
VCJOBS = kmock.resource("batch.volcano.sh", "v1alpha1", "jobs")
COMMANDS = kmock.resource("bus.volcano.sh", "v1alpha1", "commands")
NS = "team-a"


@asynccontextmanager
async def operator_on_kmock() -> AsyncIterator[Any]:
    """kmock serving the job, pod and service resources, and the operator running on it."""
    async with kmock.KubernetesEmulator() as k8s, kmock.Server(k8s):
        k8s.resources["mindxdl.gitee.com/v1/ascendjobs"] = kmock.ResourceInfo(
            kind="AscendJob",
            namespaced=True,
            subresources={"status"},
            verbs={"list", "watch", "get", "patch", "create"},
        )
        k8s.resources["v1/pods"] = kmock.ResourceInfo(
            kind="Pod",
            namespaced=True,
            subresources={"status"},
            verbs={"list", "watch", "get", "patch", "create", "delete"},
        )
        k8s.resources["v1/nodes"] = kmock.ResourceInfo(
            kind="Node", namespaced=False, verbs={"list", "watch", "get", "patch", "create"}
        )
        k8s.resources["v1/services"] = kmock.ResourceInfo(
            kind="Service", namespaced=True, verbs={"list", "get", "create"}
        )
        k8s.resources["v1/secrets"] = kmock.ResourceInfo(
            kind="Secret", namespaced=True, verbs={"get", "create"}
        )
        k8s.resources["v1/configmaps"] = kmock.ResourceInfo(
            kind="ConfigMap", namespaced=True, verbs={"get", "create"}
        )
        # Volcano's job and bus command resources (its CRDs, and its controller, are not here:
        # the tests make a Volcano job's pods as its controller would).
        k8s.resources["batch.volcano.sh/v1alpha1/jobs"] = kmock.ResourceInfo(
            kind="Job", namespaced=True, verbs={"list", "watch", "get", "patch", "create"}
        )
        k8s.resources["bus.volcano.sh/v1alpha1/commands"] = kmock.ResourceInfo(
            kind="Command", namespaced=True, verbs={"list", "get", "create"}
        )
        # What kopf's discovery waits for (it lists and watches them when scanning is on).
        k8s.resources["v1/namespaces"] = kmock.ResourceInfo(
            kind="Namespace", namespaced=False, verbs={"list", "watch"}
        )
        k8s.resources["apiextensions.k8s.io/v1/customresourcedefinitions"] = kmock.ResourceInfo(
            kind="CustomResourceDefinition", namespaced=False, verbs={"list", "watch"}
        )
        config = kubernetes.client.Configuration(host=str(k8s.url).rstrip("/"))
        api = kubernetes.client.ApiClient(config)
        registry = registry_for(api)
        url = str(k8s.url).rstrip("/")

        @kopf.on.login(registry=registry)
        def login(**_: Any) -> Any:
            return kopf.ConnectionInfo(server=url)

        settings = kopf.OperatorSettings()
        settings.posting.enabled = False
        settings.scanning.disabled = True
        settings.watching.reconnect_backoff = 0.1
        # kmock has no resourceVersion, so kopf cannot see its own patch arrive; without these
        # its per-object workers linger for the default 5 s on every stop.
        settings.persistence.consistency_timeout = 0.1
        settings.queueing.exit_timeout = 0.1
        settings.queueing.idle_timeout = 0.5
        # The operator runs on its own loop in a thread, as an embedded kopf does: on stopping,
        # kopf waits for every task of its loop, and the server's tasks are not its own.
        stop, ready = threading.Event(), threading.Event()

        def serve() -> None:
            asyncio.run(
                kopf.operator(
                    registry=registry,
                    settings=settings,
                    clusterwide=True,
                    standalone=True,
                    stop_flag=stop,
                    ready_flag=ready,
                )
            )

        thread = threading.Thread(target=serve, name="kopf")
        thread.start()
        loop = asyncio.get_running_loop()
        try:
            assert await loop.run_in_executor(None, ready.wait, 10), "the operator did not start"
            yield k8s
        finally:
            stop.set()
            await loop.run_in_executor(None, thread.join, 10)
            api.close()
            assert not thread.is_alive(), "the operator did not stop"


async def until(check: Callable[[], Any], what: str, timeout_s: float = 8.0) -> Any:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def live(k8s: Any, resource: Any, name: str) -> dict[str, Any] | None:
    key = (resource, NS, name)
    if key not in k8s.objects or k8s.objects[key].deleted:
        return None
    raw: dict[str, Any] = k8s.objects[key].raw
    return raw


def seed_job(name: str, **labels: str) -> dict[str, Any]:
    body: dict[str, Any] = yaml.safe_load((SEED / f"{name}.yaml").read_text())
    body["metadata"]["namespace"] = NS
    body["metadata"]["uid"] = f"uid-{name}"  # a real API server assigns it; kmock does not
    body["metadata"]["labels"].update(labels)
    return body


async def create(k8s: Any, body: dict[str, Any]) -> None:
    async with k8s.post(f"/apis/mindxdl.gitee.com/v1/namespaces/{NS}/ascendjobs", json=body) as r:
        assert r.status < 300, await r.text()


async def patch(k8s: Any, path: str, body: dict[str, Any]) -> None:
    async with k8s.patch(path, json=body) as r:
        assert r.status < 300, await r.text()


def expected_plan(name: str) -> Plan:
    """What ``unbroken plan`` says for the seed file itself."""
    job = load_job(SEED / f"{name}.yaml")
    return plan(job, load_cluster(None, job=job))


def run(scenario: Callable[[Any], Awaitable[None]]) -> None:
    async def main() -> None:
        async with operator_on_kmock() as k8s:
            await scenario(k8s)

    asyncio.run(main())


def test_a_job_becomes_its_planned_pods_and_service() -> None:
    want = expected_plan("pod-rescheduling-pytorch")

    async def scenario(k8s: Any) -> None:
        await create(k8s, seed_job("pod-rescheduling-pytorch"))
        names = [p.name for p in want.pods]
        pods = [await until(lambda n=n: live(k8s, PODS, n), f"pod {n}") for n in names]
        job = await until(
            lambda: (
                (live(k8s, JOBS, "pod-rescheduling-pytorch") or {}).get("status", {}).get("phase")
                == "Created"
                and live(k8s, JOBS, "pod-rescheduling-pytorch")
            ),
            "status Created",
        )
        for got, planned in zip(pods, want.pods, strict=True):
            container = got["spec"]["containers"][0]
            env = {e["name"]: e["value"] for e in container["env"]}
            # The rank-0 pod's name as cluster DNS knows it: through the job's Service.
            assert env == {**planned.env, "MASTER_ADDR": f"{names[0]}.pod-rescheduling-pytorch"}
            assert got["spec"]["hostname"] == planned.name
            assert got["spec"]["subdomain"] == "pod-rescheduling-pytorch"
            assert {k: got["metadata"]["labels"][k] for k in planned.labels} == planned.labels
            assert [p["containerPort"] for p in container["ports"]] == [
                p.container_port for p in planned.ports
            ]
            assert got["spec"]["restartPolicy"] == "Never"
            (owner,) = got["metadata"]["ownerReferences"]
            assert owner["kind"] == "AscendJob" and owner["uid"] == job["metadata"]["uid"]
        assert pods[0]["spec"]["containers"][0]["env"]
        env0 = {e["name"]: e["value"] for e in pods[0]["spec"]["containers"][0]["env"]}
        assert env0["NODE_RANK"] == "0" and planned.env["MASTER_ADDR"] == names[0]
        service = await until(lambda: live(k8s, SERVICES, "pod-rescheduling-pytorch"), "service")
        assert service["spec"]["clusterIP"] == "None"
        assert service["spec"]["selector"] == {"job-name": "pod-rescheduling-pytorch"}
        assert job["status"]["pods"] == names
        (created,) = job["status"]["conditions"]
        assert (created["type"], created["reason"]) == ("Created", "PodsCreated")

    run(scenario)


def phase_of(k8s: Any, resource: Any, name: str) -> str | None:
    obj = live(k8s, resource, name)
    return None if obj is None else (obj.get("status") or {}).get("phase")


async def set_phase(k8s: Any, pod: str, phase: str, reason: str = "") -> None:
    status = {"phase": phase, **({"reason": reason} if reason else {})}
    await patch(k8s, f"/api/v1/namespaces/{NS}/pods/{pod}/status", {"status": status})


async def running_job(k8s: Any, body: dict[str, Any]) -> tuple[str, list[str]]:
    """Create the job, wait for its pods, mark them Running, wait for the job to say so."""
    name = body["metadata"]["name"]
    await create(k8s, body)
    job = await until(
        lambda: phase_of(k8s, JOBS, name) == "Created" and live(k8s, JOBS, name), "Created"
    )
    pods: list[str] = job["status"]["pods"]
    for pod in pods:
        await until(lambda pod=pod: live(k8s, PODS, pod), f"pod {pod}")
        await set_phase(k8s, pod, "Running")
    await until(lambda: phase_of(k8s, JOBS, name) == "Running", "Running")
    return name, pods


def test_a_failed_pod_is_replaced_alone_under_pod_rescheduling() -> None:
    async def scenario(k8s: Any) -> None:
        body = seed_job("pod-rescheduling-pytorch", **{"fault-retry-times": "2"})
        name, (master, worker) = await running_job(k8s, body)
        await set_phase(k8s, worker, "Failed", "Error")
        # The replacement is a new pod: no status yet (no kubelet here), same planned env.
        await until(
            lambda: live(k8s, PODS, worker) and phase_of(k8s, PODS, worker) is None, "new pod"
        )
        job = await until(
            lambda: phase_of(k8s, JOBS, name) == "Rescheduling" and live(k8s, JOBS, name),
            "Rescheduling",
        )
        assert job["status"]["reschedules"] == 1
        rescheduled = [c for c in job["status"]["conditions"] if c["type"] == "Rescheduled"]
        assert [c["reason"] for c in rescheduled] == ["pod-rescheduling"]
        assert f"{worker} failed" in rescheduled[0]["message"]
        assert phase_of(k8s, PODS, master) == "Running"  # the other pod was left alone
        want = expected_plan("pod-rescheduling-pytorch")
        (planned,) = [p for p in want.pods if p.name == worker]
        new = live(k8s, PODS, worker)
        assert new is not None
        got = {e["name"]: e["value"] for e in new["spec"]["containers"][0]["env"]}
        assert got == kube.cluster_env(want, planned)
        assert got["MASTER_ADDR"] == f"{master}.{name}"
        assert REPLACING not in (new["metadata"].get("annotations") or {})

    run(scenario)


def test_job_rescheduling_replaces_every_pod_until_the_retries_run_out() -> None:
    async def scenario(k8s: Any) -> None:
        body = seed_job("job-rescheduling", **{"fault-retry-times": "1"})
        name, pods = await running_job(k8s, body)
        await set_phase(k8s, pods[1], "Failed", "Error")
        for pod in pods:  # both replaced: neither keeps its Running status
            await until(
                lambda pod=pod: live(k8s, PODS, pod) and phase_of(k8s, PODS, pod) is None, pod
            )
        job = await until(
            lambda: (
                (live(k8s, JOBS, name) or {}).get("status", {}).get("reschedules") == 1
                and live(k8s, JOBS, name)
            ),
            "1 reschedule",
        )
        (resched,) = [c for c in job["status"]["conditions"] if c["type"] == "Rescheduled"]
        assert resched["reason"] == "job-rescheduling"
        # The second failure finds fault-retry-times spent: the job fails, the pod stays failed.
        await set_phase(k8s, pods[0], "Failed", "Error")
        job = await until(
            lambda: phase_of(k8s, JOBS, name) == "Failed" and live(k8s, JOBS, name), "Failed"
        )
        (failed,) = [c for c in job["status"]["conditions"] if c["type"] == "Failed"]
        assert failed["reason"] == "NoRungLeft"
        assert "fault-retry-times spent (1 of 1)" in failed["message"]
        assert phase_of(k8s, PODS, pods[0]) == "Failed"
        assert job["status"]["reschedules"] == 1

    run(scenario)


def test_a_bad_job_gets_a_failed_condition_naming_the_field_and_no_pods() -> None:
    async def scenario(k8s: Any) -> None:
        body = seed_job("job-rescheduling", **{"fault-scheduling": "sometimes"})
        name = body["metadata"]["name"]
        await create(k8s, body)
        job = await until(
            lambda: phase_of(k8s, JOBS, name) == "Failed" and live(k8s, JOBS, name), "Failed"
        )
        (failed,) = job["status"]["conditions"]
        assert (failed["type"], failed["reason"]) == ("Failed", "InvalidSpec")
        assert "fault-scheduling" in failed["message"] and "'sometimes'" in failed["message"]
        assert not [key for key in k8s.objects if key[0] == PODS]
        assert live(k8s, SERVICES, name) is None

    run(scenario)


def test_a_pod_deleted_by_someone_else_is_created_again() -> None:
    async def scenario(k8s: Any) -> None:
        body = seed_job("pod-rescheduling-pytorch")  # no fault-retry-times: deletions still count
        name, (master, worker) = await running_job(k8s, body)
        async with k8s.delete(f"/api/v1/namespaces/{NS}/pods/{master}") as r:
            assert r.status < 300, await r.text()
        await until(lambda: phase_of(k8s, PODS, master) is None and live(k8s, PODS, master), "back")
        job = await until(
            lambda: (
                (live(k8s, JOBS, name) or {}).get("status", {}).get("reschedules") == 1
                and live(k8s, JOBS, name)
            ),
            "1 reschedule",
        )
        (resched,) = [c for c in job["status"]["conditions"] if c["type"] == "Rescheduled"]
        assert resched["message"].startswith(f"{master} deleted: pod-rescheduling #1")
        assert phase_of(k8s, PODS, worker) == "Running"

    run(scenario)


async def bind(k8s: Any, pod: str, node: str) -> None:
    """What the scheduler does: the pod runs on ``node``."""
    path = f"/api/v1/namespaces/{NS}/pods/{pod}"
    await patch(k8s, path, {"spec": {"nodeName": node}})


async def add_node(k8s: Any, node: str, ready: str = "True", **annotations: str) -> None:
    body = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": node, "annotations": annotations},
        "status": {"conditions": [{"type": "Ready", "status": ready}]},
    }
    async with k8s.post("/api/v1/nodes", json=body) as r:
        assert r.status < 300, await r.text()


def test_a_node_not_ready_replaces_its_pod_off_that_node() -> None:
    async def scenario(k8s: Any) -> None:
        # A node fault needs no fault-retry-times; the grace period does not apply on a lost
        # node (its kubelet cannot confirm a graceful stop): the pod is deleted at once.
        body = seed_job(
            "pod-rescheduling-pytorch",
            **{"fault-scheduling": "grace", "grace-over-time": "600"},
        )
        name, (master, worker) = await running_job(k8s, body)
        await bind(k8s, worker, "node-b")
        await add_node(k8s, "node-a")
        await add_node(k8s, "node-b", ready="Unknown")
        await until(lambda: live(k8s, PODS, worker) and phase_of(k8s, PODS, worker) is None, "new")
        new = live(k8s, PODS, worker)
        assert new is not None
        (term,) = new["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ]["nodeSelectorTerms"]
        assert {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["node-b"]} in (
            term["matchExpressions"]
        )
        job = await until(
            lambda: phase_of(k8s, JOBS, name) == "Rescheduling" and live(k8s, JOBS, name), "resched"
        )
        assert job["status"]["avoidNodes"] == ["node-b"]
        (resched,) = [c for c in job["status"]["conditions"] if c["type"] == "Rescheduled"]
        assert resched["reason"] == "pod-rescheduling"
        assert resched["message"].startswith(f"{worker} lost: node node-b not ready")
        deletes = [r for r in k8s if r.method == "DELETE" and r.name == worker]
        assert [r.params.get("gracePeriodSeconds") for r in deletes] == ["0"], deletes
        assert phase_of(k8s, PODS, master) == "Running"

    run(scenario)


def test_a_device_fault_in_the_node_annotation_reschedules_the_job() -> None:
    async def scenario(k8s: Any) -> None:
        body = seed_job("job-rescheduling")
        name, pods = await running_job(k8s, body)
        await bind(k8s, pods[0], "node-a")
        # A real API server gives each pod a uid; kmock does not.
        await patch(k8s, f"/api/v1/namespaces/{NS}/pods/{pods[0]}", {"metadata": {"uid": "u0"}})
        # 80E01801: the seed's HBM uncorrectable error, a stopping hardware fault.
        await add_node(k8s, "node-a", **{DEVICE_HEALTH: '{"3": "80E01801"}'})
        for pod in pods:
            await until(
                lambda pod=pod: live(k8s, PODS, pod) and phase_of(k8s, PODS, pod) is None, pod
            )
        job = await until(
            lambda: phase_of(k8s, JOBS, name) == "Rescheduling" and live(k8s, JOBS, name), "job"
        )
        (resched,) = [c for c in job["status"]["conditions"] if c["type"] == "Rescheduled"]
        assert resched["reason"] == "job-rescheduling"
        assert "device 3 80E01801" in resched["message"]
        assert job["status"]["budgets"]["hardwareReschedules"] == 1
        # Recorded per pod instance: an operator restarting does not act on it again.
        assert job["status"]["deviceFaults"] == ["u0/3/80E01801"]

    run(scenario)


# --- Volcano jobs ---------------------------------------------------------------------------


def vc_job(name: str, **labels: str) -> dict[str, Any]:
    """The seed's Volcano job, with ``labels`` changed (an empty value removes the label)."""
    body = seed_job(name)
    for key, value in labels.items():
        if value:
            body["metadata"]["labels"][key] = value
        else:
            del body["metadata"]["labels"][key]
    return body


def vc_state(k8s: Any, name: str) -> dict[str, Any]:
    job = live(k8s, VCJOBS, name) or {}
    text = (job.get("metadata", {}).get("annotations") or {}).get("unbroken.dev/state")
    return {} if not text else dict(json.loads(text))


async def volcano_makes_pods(k8s: Any, body: dict[str, Any], pods: list[str]) -> None:
    """What Volcano's controller does: the job's pods, labelled and owned by the job, Running."""
    name = body["metadata"]["name"]
    for pod in pods:
        manifest = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": pod,
                "namespace": NS,
                "labels": {"volcano.sh/job-name": name},
                "ownerReferences": [
                    {
                        "apiVersion": "batch.volcano.sh/v1alpha1",
                        "kind": "Job",
                        "name": name,
                        "uid": body["metadata"]["uid"],
                    }
                ],
            },
            "spec": {"containers": [{"name": "ascend", "image": "train:latest"}]},
        }
        async with k8s.post(f"/api/v1/namespaces/{NS}/pods", json=manifest) as r:
            assert r.status < 300, await r.text()
        await set_phase(k8s, pod, "Running")


async def running_vc_job(k8s: Any, body: dict[str, Any]) -> tuple[str, list[str]]:
    name = body["metadata"]["name"]
    async with k8s.post(f"/apis/batch.volcano.sh/v1alpha1/namespaces/{NS}/jobs", json=body) as r:
        assert r.status < 300, await r.text()
    state = await until(
        lambda: vc_state(k8s, name).get("phase") == "Created" and vc_state(k8s, name), "Created"
    )
    pods: list[str] = state["pods"]
    await volcano_makes_pods(k8s, body, pods)
    await until(lambda: vc_state(k8s, name).get("phase") == "Running", "Running")
    return name, pods


def commands_of(k8s: Any) -> list[dict[str, Any]]:
    return [obj.raw for key, obj in k8s.objects.items() if key[0] == COMMANDS]


def test_a_volcano_jobs_failed_pod_is_deleted_for_volcano_to_make_again() -> None:
    async def scenario(k8s: Any) -> None:
        name, pods = await running_vc_job(k8s, vc_job("last-words-vcjob"))
        assert pods == ["last-words-master-0", "last-words-worker-0", "last-words-worker-1"]
        await set_phase(k8s, pods[2], "Failed", "Error")
        state = await until(
            lambda: vc_state(k8s, name).get("phase") == "Rescheduling" and vc_state(k8s, name),
            "Rescheduling",
        )
        assert state["reschedules"] == 1
        (resched,) = [c for c in state["conditions"] if c["type"] == "Rescheduled"]
        assert resched["reason"] == "pod-rescheduling"
        assert resched["message"].startswith(f"{pods[2]} failed")
        # Marked, then deleted with the job's grace period; Volcano (not here) makes it again.
        await until(lambda: live(k8s, PODS, pods[2]) is None, "the pod deleted")
        deletes = [r for r in k8s if r.method == "DELETE" and r.name == pods[2]]
        assert [r.params.get("gracePeriodSeconds") for r in deletes] == ["600"], deletes
        assert [phase_of(k8s, PODS, p) for p in pods[:2]] == ["Running", "Running"]
        assert not commands_of(k8s)
        # Volcano's new pod runs: the job is Running again.
        await volcano_makes_pods(k8s, vc_job("last-words-vcjob"), [pods[2]])
        await until(lambda: vc_state(k8s, name).get("phase") == "Running", "Running again")

    run(scenario)


def test_a_volcano_job_is_restarted_then_terminated_by_bus_commands() -> None:
    async def scenario(k8s: Any) -> None:
        body = vc_job("last-words-vcjob", **{"pod-rescheduling": "", "fault-retry-times": "1"})
        name, pods = await running_vc_job(k8s, body)
        await set_phase(k8s, pods[1], "Failed", "Error")
        (restart,) = await until(lambda: commands_of(k8s), "a RestartJob command")
        assert restart["action"] == "RestartJob"
        assert restart["metadata"]["name"] == f"{name}-restartjob-1"
        assert restart["target"] == {
            "apiVersion": "batch.volcano.sh/v1alpha1",
            "kind": "Job",
            "name": name,
            "uid": body["metadata"]["uid"],
        }
        state = vc_state(k8s, name)
        assert state["phase"] == "Rescheduling" and state["reschedules"] == 1
        # Volcano restarts every pod (not here): a second failure finds the retries spent.
        await set_phase(k8s, pods[0], "Failed", "Error")
        await until(lambda: len(commands_of(k8s)) == 2, "a TerminateJob command")
        assert [c["action"] for c in commands_of(k8s)] == ["RestartJob", "TerminateJob"]
        state = vc_state(k8s, name)
        (failed,) = [c for c in state["conditions"] if c["type"] == "Failed"]
        assert state["phase"] == "Failed" and failed["reason"] == "NoRungLeft"
        assert "fault-retry-times spent (1 of 1)" in failed["message"]
        assert not [r for r in k8s if r.method == "DELETE"]  # the pods are Volcano's to stop

    run(scenario)


def test_volcano_jobs_without_fault_scheduling_are_left_alone_and_bad_ones_are_failed() -> None:
    async def scenario(k8s: Any) -> None:
        other = vc_job("last-words-vcjob", **{"fault-scheduling": ""})
        other["metadata"]["name"] = "not-ours"
        bad = vc_job("last-words-vcjob", **{"fault-retry-times": "many"})
        for body in (other, bad):
            path = f"/apis/batch.volcano.sh/v1alpha1/namespaces/{NS}/jobs"
            async with k8s.post(path, json=body) as r:
                assert r.status < 300, await r.text()
        state = await until(lambda: vc_state(k8s, "last-words"), "the bad job's record")
        (failed,) = state["conditions"]
        assert state["phase"] == "Failed" and failed["reason"] == "InvalidSpec"
        assert "fault-retry-times" in failed["message"] and "'many'" in failed["message"]
        await volcano_makes_pods(k8s, other, ["not-ours-worker-0"])
        await set_phase(k8s, "not-ours-worker-0", "Failed", "Error")
        await asyncio.sleep(1.0)
        assert vc_state(k8s, "not-ours") == {}
        assert live(k8s, PODS, "not-ours-worker-0") is not None and not commands_of(k8s)

    run(scenario)


# --- a job with its own control plane ---------------------------------------------------------


def test_a_job_with_process_level_rungs_gets_its_control_plane_and_host_pods() -> None:
    """``recover`` needs agents: the operator makes the job's control plane (``unbroken serve``
    with the job, its cluster and a token from a Secret) and one host pod per node of the
    cluster joining it; a host pod that fails is made again; the job ends with the control
    plane."""

    async def scenario(k8s: Any) -> None:
        body = seed_job("process-recover")
        name = body["metadata"]["name"]
        await create(k8s, body)
        job = await until(
            lambda: phase_of(k8s, JOBS, name) == "Created" and live(k8s, JOBS, name), "Created"
        )
        control, hosts = f"{name}-control", [f"{name}-node-{i}" for i in range(3)]
        assert job["status"]["pods"] == [control, *hosts]  # 2 pods of the job, 1 spare host
        (created,) = job["status"]["conditions"]
        assert created["reason"] == "ControlPlaneCreated"
        secret = await until(lambda: live(k8s, SECRETS, f"{name}-unbroken"), "the Secret")
        token = base64.b64decode(secret["data"]["token"]).decode().strip()
        assert len(token) == 32 and int(token, 16) >= 0
        # ... and the job's certificate authority beside it (mutual TLS on the control channel)
        ca = base64.b64decode(secret["data"]["ca.crt"]).decode()
        key = base64.b64decode(secret["data"]["ca.key"]).decode()
        assert ca.startswith("-----BEGIN CERTIFICATE-----") and "PRIVATE KEY" in key
        config = await until(lambda: live(k8s, CONFIGMAPS, f"{name}-unbroken"), "the ConfigMap")
        # The job as the operator read it, which `unbroken serve` reads the same way.
        served = load_job_text(config["data"]["job.yaml"])
        assert served.name == name and served.world_size == 4
        assert yaml.safe_load(config["data"]["cluster.yaml"]) == {
            "nodes": 3,
            "devicesPerNode": 2,
        }
        pod = await until(lambda: live(k8s, PODS, control), "the control-plane pod")
        (c,) = pod["spec"]["containers"]
        assert c["command"][:2] == ["unbroken", "serve"]
        assert c["command"][c["command"].index("--listen") + 1] == "$(POD_IP):29400"
        assert c["command"][c["command"].index("--secret-file") + 1] == "/etc/unbroken/token/token"
        # The control plane holds no device, and gets none of the template's host-level fields.
        assert set(c["resources"]["requests"]) == {"cpu", "memory"}
        assert pod["spec"]["automountServiceAccountToken"] is False
        assert c["securityContext"]["readOnlyRootFilesystem"] is True
        assert pod["metadata"]["labels"]["unbroken.dev/role"] == "control-plane"
        for i, host in enumerate(hosts):
            got = await until(lambda host=host: live(k8s, PODS, host), host)
            (h,) = got["spec"]["containers"]
            assert h["command"] == [
                "unbroken",
                "launch",
                "--join",
                f"{control}.{name}.{body['metadata']['namespace']}.svc.cluster.local:29400",
                "--token-file",
                "/etc/unbroken/token/token",
                "--node",
                f"node-{i}",
                "--devices",
                "2",
            ]
            assert "args" not in h and h["image"] == "train:latest"
            assert (got["spec"]["hostname"], got["spec"]["subdomain"]) == (host, name)
            (token_volume,) = [v for v in got["spec"]["volumes"] if "secret" in v]
            assert token_volume["secret"] == {"secretName": f"{name}-unbroken", "defaultMode": 256}
        for pod_name in (control, *hosts):
            await set_phase(k8s, pod_name, "Running")
        await until(lambda: phase_of(k8s, JOBS, name) == "Running", "Running")
        # A host that fails is made again under its name: it joins as the same node.
        await set_phase(k8s, hosts[1], "Failed", "Error")
        await until(
            lambda: live(k8s, PODS, hosts[1]) and phase_of(k8s, PODS, hosts[1]) is None, "new"
        )
        job = await until(
            lambda: (
                (live(k8s, JOBS, name) or {}).get("status", {}).get("reschedules") == 1
                and live(k8s, JOBS, name)
            ),
            "1 host replaced",
        )
        (resched,) = [c for c in job["status"]["conditions"] if c["type"] == "Rescheduled"]
        assert resched["reason"] == "HostPodReplaced"
        assert [phase_of(k8s, PODS, h) for h in (hosts[0], hosts[2])] == ["Running", "Running"]
        # The operator decided nothing for the job's pods: no planned pod was made.
        assert live(k8s, PODS, f"{name}-master-0") is None
        await set_phase(k8s, control, "Succeeded")
        await until(lambda: phase_of(k8s, JOBS, name) == "Succeeded", "Succeeded")

    run(scenario)


def load_job_text(text: str) -> Any:
    from unbroken.spec import parse_job

    return parse_job(text, Path("job.yaml"))
