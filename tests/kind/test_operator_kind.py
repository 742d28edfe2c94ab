"""The operator against a real cluster (kind): the pods run, a pod whose processes fail is
replaced through the real API server's graceful deletion, and the retries run out.

Needs ``kubectl`` and a throwaway cluster whose context is named by ``UNBROKEN_KIND_CONTEXT``
(``kind create cluster --name unbroken`` then ``UNBROKEN_KIND_CONTEXT=kind-unbroken``); the test
applies the CRD from ``deploy/kubernetes``, runs the operator in-process with that context, and
deletes its namespace at the end. Without them it skips with the reason.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = [pytest.mark.kind, pytest.mark.e2e]

CONTEXT = os.environ.get("UNBROKEN_KIND_CONTEXT")
if not CONTEXT or shutil.which("kubectl") is None:
    pytest.skip(
        "needs a real cluster: set UNBROKEN_KIND_CONTEXT to a kind cluster's context and put "
        "kubectl on PATH (no API server can run where this suite usually runs)",
        allow_module_level=True,
    )

kopf = pytest.importorskip("kopf")
kubernetes = pytest.importorskip("kubernetes")

from unbroken.operator import kube  # noqa: E402
from unbroken.operator.__main__ import registry_for  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
IMAGE = "busybox:1.36"


def kubectl(*args: str) -> str:
    out = subprocess.run(
        ["kubectl", "--context", str(CONTEXT), *args], check=True, capture_output=True, text=True
    )
    return out.stdout


def until(check: Callable[[], Any], what: str, timeout_s: float = 180.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(1.0)


@pytest.fixture
def cluster() -> Iterator[tuple[Any, str]]:
    kubectl("apply", "-f", str(ROOT / "deploy" / "kubernetes" / "10-crd-ascendjob.yaml"))
    kubectl("wait", "--for=condition=Established", "crd/ascendjobs.mindxdl.gitee.com")
    ns = f"unbroken-kind-{uuid.uuid4().hex[:6]}"
    kubectl("create", "namespace", ns)
    api = kubernetes.config.new_client_from_config(context=CONTEXT)
    registry = registry_for(api)

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> Any:
        return kopf.login_via_client(**kwargs)

    kubernetes.config.load_kube_config(context=CONTEXT)
    stop, ready = threading.Event(), threading.Event()

    def serve() -> None:
        asyncio.run(
            kopf.operator(
                registry=registry,
                clusterwide=True,
                standalone=True,
                stop_flag=stop,
                ready_flag=ready,
            )
        )

    thread = threading.Thread(target=serve, name="kopf")
    thread.start()
    try:
        assert ready.wait(60), "the operator did not start"
        yield api, ns
    finally:
        stop.set()
        thread.join(60)
        kubectl("delete", "namespace", ns, "--wait=false")
        api.close()
        assert not thread.is_alive(), "the operator did not stop"


def test_a_failing_worker_is_replaced_until_fault_retry_times_runs_out(
    cluster: tuple[Any, str],
) -> None:
    api, ns = cluster
    body = yaml.safe_load((ROOT / "tests/fixtures/seed/pod-rescheduling-pytorch.yaml").read_text())
    body["metadata"]["labels"]["fault-retry-times"] = "2"
    for replica, script in (("Master", "sleep 3600"), ("Worker", "exit 1")):
        (container,) = body["spec"]["replicaSpecs"][replica]["template"]["spec"]["containers"]
        container.update(image=IMAGE, command=["sh", "-c", script], args=[])
        container.pop("resources")
    custom = kubernetes.client.CustomObjectsApi(api)
    core = kubernetes.client.CoreV1Api(api)
    custom.create_namespaced_custom_object(kube.GROUP, kube.VERSION, ns, kube.PLURAL, body)
    name = body["metadata"]["name"]

    def job() -> dict[str, Any]:
        got: dict[str, Any] = custom.get_namespaced_custom_object(
            kube.GROUP, kube.VERSION, ns, kube.PLURAL, name
        )
        return got

    until(lambda: _running(core, ns, f"{name}-master-0"), "the master pod running")
    final = until(lambda: job().get("status", {}).get("phase") == "Failed" and job(), "Failed")
    (failed,) = [c for c in final["status"]["conditions"] if c["type"] == "Failed"]
    # The policy's answer: pod level first; a failure while that recovery runs goes a rung
    # down (job level); the software budget then ends the job.
    assert failed["reason"] == "NoRungLeft"
    assert "fault-retry-times spent (2 of 2)" in failed["message"]
    assert final["status"]["reschedules"] == 2
    assert final["status"]["budgets"]["softwareReschedules"] == 2
    worker = core.read_namespaced_pod(f"{name}-worker-0", ns)
    env = {e.name: e.value for e in worker.spec.containers[0].env}
    assert env["NODE_RANK"] == "1" and env["MASTER_ADDR"] == f"{name}-master-0.{name}"


def _running(core: Any, ns: str, pod: str) -> Any:
    try:
        got = core.read_namespaced_pod(pod, ns)
    except kubernetes.client.exceptions.ApiException:
        return None
    return got if got.status and got.status.phase == "Running" else None
