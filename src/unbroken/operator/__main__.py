"""The operator's entry point: ``python -m unbroken.operator`` runs the handlers of both forms of
the seed's jobs, AscendJobs (:mod:`unbroken.operator.kube`) and Volcano jobs
(:mod:`unbroken.operator.volcano`), cluster-wide with the pod's service account (or the local
kubeconfig); ``deploy/kubernetes/`` holds the CRD, RBAC and Deployment.

- :func:`registry_for`: the kopf registry of both kinds' handlers, over one API client;
- :func:`main`: that registry run standalone, with kopf's liveness endpoint on
  ``127.0.0.1:``:data:`HEALTH_PORT`.
"""

from __future__ import annotations

import logging

import kopf
import kubernetes

from unbroken.operator import volcano
from unbroken.operator.kube import Operator

#: kopf's liveness endpoint, on 127.0.0.1 (deploy/kubernetes/30-operator.yaml probes it).
HEALTH_PORT = 8080


def registry_for(api: kubernetes.client.ApiClient) -> kopf.OperatorRegistry:
    """The handlers of both forms of the seed's jobs: AscendJobs and Volcano jobs."""
    registry = kopf.OperatorRegistry()
    Operator(api).register(registry)
    volcano.register(api, registry)
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
        # Loopback only: the pod's liveness probe runs inside the pod (an exec probe), so
        # nothing of the operator listens on the pod network.
        liveness_endpoint=f"http://127.0.0.1:{HEALTH_PORT}/healthz",
    )


if __name__ == "__main__":  # pragma: no cover
    main()
