"""On Kubernetes a host pod joins its control plane by the fully qualified name of the
control-plane pod (attack a): a relative name (``JOB-control.JOB``) is looked up through the
pod's DNS search list first, where another name may answer."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from unbroken.operator import controlplane
from unbroken.operator.resource import job_plan, job_spec

pytestmark = pytest.mark.unit

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "kubernetes" / "recover.yaml"


def test_host_pods_join_the_control_plane_by_its_fully_qualified_name() -> None:
    body = yaml.safe_load(EXAMPLE.read_text())
    body["metadata"]["namespace"] = "team-a"
    body["metadata"]["uid"] = "u"
    p = job_plan(job_spec(body))
    owner = {"apiVersion": "v1", "kind": "AscendJob", "name": "x", "uid": "u"}
    name, ns = body["metadata"]["name"], body["metadata"]["namespace"]
    control, hosts = controlplane.names(name, p.cluster.nodes)
    for host in hosts:
        command = controlplane.host_pod(body, p, host, owner)["spec"]["containers"][0]["command"]
        address = command[command.index("--join") + 1]
        assert address == f"{control}.{name}.{ns}.svc.cluster.local:29400"
        assert address.endswith(".svc.cluster.local:29400")
