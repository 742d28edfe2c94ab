"""The deployment manifests (deploy/kubernetes) are valid for the Kubernetes version the README
names, checked offline against that version's strict schemas; the seed's AscendJob examples are
accepted by the CRD's own schema, and malformed jobs are refused by it."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

kubernetes_validate = pytest.importorskip("kubernetes_validate")
jsonschema = pytest.importorskip("jsonschema")

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[3]
DEPLOY = ROOT / "deploy" / "kubernetes"
SEED = ROOT / "tests" / "fixtures" / "seed"


def _kubernetes_version() -> str:
    """The version the README's Kubernetes section names ("Kubernetes 1.NN")."""
    found = re.findall(r"Kubernetes (1\.\d+)\b", (ROOT / "README.md").read_text())
    assert found, "README.md names no Kubernetes version"
    return str(found[0])


def _manifests() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for path in sorted(DEPLOY.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                out.append((f"{path.name}:{doc['kind']}/{doc['metadata']['name']}", doc))
    return out


def _crd_schema() -> dict[str, Any]:
    crds = [d for _, d in _manifests() if d["kind"] == "CustomResourceDefinition"]
    (crd,) = [c for c in crds if c["spec"]["names"]["kind"] == "AscendJob"]
    (version,) = crd["spec"]["versions"]
    assert version["name"] == "v1" and crd["spec"]["group"] == "mindxdl.gitee.com"
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return schema


def _seed_jobs() -> list[Path]:
    return [p for p in sorted(SEED.glob("*.yaml")) if "kind: AscendJob" in p.read_text()]


def test_every_kind_is_deployed() -> None:
    kinds = sorted({d["kind"] for _, d in _manifests()})
    assert kinds == [
        "ClusterRole",
        "ClusterRoleBinding",
        "CustomResourceDefinition",
        "Deployment",
        "Namespace",
        "RoleBinding",
        "ServiceAccount",
    ]


@pytest.mark.parametrize("name,doc", _manifests(), ids=[n for n, _ in _manifests()])
def test_manifest_is_valid_for_the_readme_version(name: str, doc: dict[str, Any]) -> None:
    version = _kubernetes_version()
    assert kubernetes_validate.validate(doc, version, strict=True) == version


def test_a_bad_manifest_is_refused() -> None:
    """The check has teeth: a field the strict schema does not know fails it."""
    (_, deployment) = next((n, d) for n, d in _manifests() if d["kind"] == "Deployment")
    bad = copy.deepcopy(deployment)
    bad["spec"]["replica"] = 1
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, _kubernetes_version(), strict=True)


def test_the_service_account_is_bound_to_the_role_the_deployment_uses() -> None:
    docs = {(d["kind"], d["metadata"]["name"]): d for _, d in _manifests()}
    ((_, sa_name),) = [k for k in docs if k[0] == "ServiceAccount"]
    sa = docs["ServiceAccount", sa_name]["metadata"]
    pod = docs["Deployment", "unbroken-operator"]["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == sa["name"]
    subject = {"kind": "ServiceAccount", "name": sa["name"], "namespace": sa["namespace"]}
    cluster_wide = docs["ClusterRoleBinding", "unbroken-operator"]
    assert cluster_wide["roleRef"]["name"] == "unbroken-operator"
    assert cluster_wide["subjects"] == [subject]
    per_namespace = docs["RoleBinding", "unbroken-operator-jobs"]
    assert per_namespace["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": "unbroken-operator-jobs",
    }
    assert per_namespace["subjects"] == [subject]
    assert ("ClusterRole", "unbroken-operator-jobs") in docs


def test_the_operator_writes_only_in_the_namespaces_it_is_given() -> None:
    """What the operator may do in every namespace is to read (watch jobs, their pods and
    nodes); creating pods, Secrets and the rest comes only with a RoleBinding in a namespace."""
    docs = {(d["kind"], d["metadata"]["name"]): d for _, d in _manifests()}
    cluster_wide = docs["ClusterRole", "unbroken-operator"]["rules"]
    verbs = {v for rule in cluster_wide for v in rule["verbs"]}
    assert verbs <= {"get", "list", "watch"}, verbs
    bound = [
        d
        for (kind, _), d in docs.items()
        if kind == "ClusterRoleBinding" and d["roleRef"]["name"] == "unbroken-operator-jobs"
    ]
    assert not bound, "the rights to write are bound cluster-wide"
    per_namespace = docs["ClusterRole", "unbroken-operator-jobs"]["rules"]
    pods = [r for r in per_namespace if "pods" in r["resources"]]
    assert pods and {"create", "delete"} <= {v for r in pods for v in r["verbs"]}


def test_seed_jobs_exist() -> None:
    assert len(_seed_jobs()) >= 10


@pytest.mark.parametrize("path", _seed_jobs(), ids=lambda p: p.stem)
def test_seed_job_is_accepted_by_the_crd_schema(path: Path) -> None:
    job = yaml.safe_load(path.read_text())
    jsonschema.validate(job, _crd_schema())


@pytest.mark.parametrize(
    "change,message",
    [
        (lambda j: j["spec"].pop("replicaSpecs"), "'replicaSpecs' is a required property"),
        (lambda j: j["spec"]["replicaSpecs"].update(Chief={}), "Additional properties"),
        (lambda j: j["spec"]["replicaSpecs"]["Worker"].update(replicas=0), "less than the"),
        (lambda j: j["spec"]["replicaSpecs"]["Master"].update(replicas="1"), "is not of type"),
    ],
)
def test_a_malformed_job_is_refused_by_the_crd_schema(change: Any, message: str) -> None:
    job = yaml.safe_load((SEED / "job-rescheduling.yaml").read_text())
    change(job)
    with pytest.raises(jsonschema.ValidationError, match=message):
        jsonschema.validate(job, _crd_schema())


def test_the_deployment_runs_a_module_that_exists() -> None:
    import importlib.util

    docs = {d["kind"]: d for _, d in _manifests()}
    (container,) = docs["Deployment"]["spec"]["template"]["spec"]["containers"]
    assert container["command"][:2] == ["python", "-m"]
    module = container["command"][2]
    assert module == "unbroken.operator"
    assert importlib.util.find_spec(f"{module}.__main__") is not None


def test_the_image_runs_what_the_deployment_runs() -> None:
    docs = {d["kind"]: d for _, d in _manifests()}
    (container,) = docs["Deployment"]["spec"]["template"]["spec"]["containers"]
    (cmd,) = re.findall(r"^CMD (.+)$", (ROOT / "deploy" / "Dockerfile").read_text(), re.M)
    assert yaml.safe_load(cmd) == container["command"]


def test_the_operator_listens_on_no_pod_port_and_probes_its_loopback() -> None:
    """Nothing of the operator is reachable on the pod network: no container port, and the
    liveness probe runs in the container against the endpoint kopf binds to 127.0.0.1."""
    entry = pytest.importorskip("unbroken.operator.__main__")
    (deployment,) = [d for _, d in _manifests() if d["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert "ports" not in container
    probe = container["livenessProbe"]
    assert "httpGet" not in probe and "tcpSocket" not in probe
    command = " ".join(probe["exec"]["command"])
    assert f"http://127.0.0.1:{entry.HEALTH_PORT}/healthz" in command


def test_a_jobs_own_control_plane_is_made_of_valid_objects() -> None:
    """The Kubernetes example's job has process-level rungs: the operator's Secret, ConfigMap,
    control-plane pod and host pods for it are valid for the README's Kubernetes version, and
    the ConfigMap's job is the example job as `unbroken serve` reads it."""
    from unbroken.operator import controlplane
    from unbroken.operator.resource import job_document, job_plan, job_spec
    from unbroken.spec import load_job, parse_job

    path = ROOT / "examples" / "kubernetes" / "recover.yaml"
    body = yaml.safe_load(path.read_text())
    jsonschema.validate(body, _crd_schema())
    body["metadata"]["uid"] = "uid-example"
    job = job_spec(body)
    assert controlplane.wanted(job)
    p = job_plan(job)
    owner = {
        "apiVersion": "mindxdl.gitee.com/v1",
        "kind": "AscendJob",
        "name": job.name,
        "uid": "u",
    }
    control, hosts = controlplane.names(job.name, p.cluster.nodes)
    docs = [
        controlplane.secret_manifest(body, controlplane.make_token(), owner),
        controlplane.config_manifest(body, job_document(body), p, owner),
        controlplane.control_pod(body, p, owner),
        *(controlplane.host_pod(body, p, h, owner) for h in hosts),
    ]
    version = _kubernetes_version()
    for doc in docs:
        assert kubernetes_validate.validate(doc, version, strict=True) == version
    assert [d["metadata"]["name"] for d in docs[2:]] == [control, *hosts]
    served = parse_job(docs[1]["data"]["job.yaml"], Path("job.yaml"))
    assert served.fault_handling == load_job(path).fault_handling
    assert served.world_size == 4 and p.cluster.nodes == 3


def test_a_mindspore_job_gets_no_control_plane_and_its_pods_run_msrun() -> None:
    """Its ranks take retry and last words in their own processes and cannot rejoin in a live
    process: the operator restarts its pods itself, each running its msrun line with the
    switches in MS_ENABLE_TFT."""
    from unbroken.operator import controlplane
    from unbroken.operator.resource import job_plan, job_spec

    path = ROOT / "examples" / "jobs" / "mindspore.yaml"
    body = yaml.safe_load(path.read_text())
    body["metadata"].update(uid="uid-ms", namespace="default")
    job = job_spec(body)
    assert not controlplane.wanted(job)
    pods = job_plan(job).pods
    assert [p.env["MS_ENABLE_TFT"] for p in pods] == ["{TTP:1,UCE:1,HCCE:1,RSC:1}"] * 2
    assert [p.env["MS_SCHED_HOST"] for p in pods] == ["ms-gpt-master-0"] * 2
