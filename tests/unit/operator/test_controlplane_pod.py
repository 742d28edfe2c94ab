"""The control-plane pod of a job on Kubernetes is made of its own minimal spec: whatever the
training template asks for its host pods (host network, privilege, host paths, a service
account), the pod that runs ``unbroken serve`` gets none of it."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from unbroken.operator import controlplane
from unbroken.operator.resource import job_plan, job_spec

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[3]
OWNER = {"apiVersion": "mindxdl.gitee.com/v1", "kind": "AscendJob", "name": "j", "uid": "u"}


def privileged_job() -> dict[str, Any]:
    """The Kubernetes example's job, its training template given every host-level field a
    training pod on devices may carry."""
    body: dict[str, Any] = yaml.safe_load((ROOT / "examples/kubernetes/recover.yaml").read_text())
    body["metadata"]["uid"] = "uid-example"
    for replica in body["spec"]["replicaSpecs"].values():
        template = replica["template"]
        template["metadata"] = {"labels": {"app": "train"}}
        spec = template["spec"]
        spec.update(
            hostNetwork=True,
            hostPID=True,
            hostIPC=True,
            serviceAccountName="trainer",
            nodeSelector={"accelerator": "npu"},
            imagePullSecrets=[{"name": "registry"}],
            volumes=[{"name": "driver", "hostPath": {"path": "/usr/local/Ascend/driver"}}],
            initContainers=[{"name": "prep", "image": "prep:1", "command": ["true"]}],
        )
        (container,) = spec["containers"]
        container["securityContext"] = {"privileged": True, "capabilities": {"add": ["SYS_ADMIN"]}}
        container["volumeMounts"] = [{"name": "driver", "mountPath": "/usr/local/Ascend/driver"}]
        container["resources"]["limits"] = {"huawei.com/Ascend910": 2}
    return body


def pods(body: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    the_plan = job_plan(job_spec(body))
    _, hosts = controlplane.names(body["metadata"]["name"], the_plan.cluster.nodes)
    control = controlplane.control_pod(body, the_plan, OWNER)
    return control, [controlplane.host_pod(body, the_plan, h, OWNER) for h in hosts]


def walk(value: Any, path: str = "") -> list[tuple[str, Any]]:
    """Every (dotted path, value) in ``value``."""
    out = [(path, value)]
    if isinstance(value, dict):
        for k, v in value.items():
            out += walk(v, f"{path}.{k}" if path else str(k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += walk(v, f"{path}[{i}]")
    return out


def test_the_control_plane_pod_has_none_of_the_templates_privileged_fields() -> None:
    body = privileged_job()
    original = copy.deepcopy(body)
    control, hosts = pods(body)
    spec = control["spec"]
    keys = {path.rsplit(".", 1)[-1] for path, _ in walk(spec)}
    for field in (
        "hostNetwork",
        "hostPID",
        "hostIPC",
        "hostPath",
        "serviceAccountName",
        "nodeSelector",
        "initContainers",
        "add",
    ):
        assert field not in keys, f"the control-plane pod has {field}"
    assert spec["automountServiceAccountToken"] is False
    (container,) = spec["containers"]
    sc = container["securityContext"]
    assert sc["privileged"] is False and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["readOnlyRootFilesystem"] is True
    assert spec["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}}
    # What it runs: the job's image, `unbroken serve`, and the job's files and token.
    assert container["image"] == "unbroken-train:0.1.0"
    assert container["imagePullPolicy"] == "IfNotPresent"
    assert container["command"][:2] == ["unbroken", "serve"]
    assert spec["imagePullSecrets"] == [{"name": "registry"}]
    # Requests for CPU and memory, no device.
    assert set(container["resources"]["requests"]) == {"cpu", "memory"}
    assert set(container["resources"]["limits"]) == {"memory"}
    # Writable: the run directory and /tmp, as emptyDir volumes; everything else read-only.
    by_name = {v["name"]: v for v in spec["volumes"]}
    writable = {
        m["mountPath"]: by_name[m["name"]]
        for m in container["volumeMounts"]
        if not m.get("readOnly")
    }
    assert writable == {
        controlplane.RUN_DIR: {"name": "unbroken-runs", "emptyDir": {}},
        "/tmp": {
            "name": "tmp",
            "emptyDir": {},
        },
    }
    assert {m["mountPath"] for m in container["volumeMounts"] if m.get("readOnly")} == {
        controlplane.JOB_DIR,
        controlplane.TOKEN_DIR,
    }
    assert control["metadata"]["labels"][controlplane.ROLE] == controlplane.CONTROL
    # The host pods still get the template (they hold the devices), and the job is unchanged.
    assert all(h["spec"]["hostNetwork"] is True for h in hosts)
    assert body == original


def test_the_control_plane_pod_is_valid_for_the_readme_version() -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    import re

    version = re.findall(r"Kubernetes (1\.\d+)\b", (ROOT / "README.md").read_text())[0]
    control, _ = pods(privileged_job())
    assert kubernetes_validate.validate(control, version, strict=True) == version
