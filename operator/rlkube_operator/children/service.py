"""The headless Service of a role: stable DNS names for its pods."""

from __future__ import annotations

from typing import Any

from rlkube_api.names import RENDEZVOUS_PORT, child_name
from rlkube_api.rljob import RLJob
from rlkube_operator.children.labels import role_labels, role_selector
from rlkube_operator.children.topology import PodRole


def headless_service(job: RLJob, role: PodRole) -> dict[str, Any]:
    name = child_name(job.metadata.name or "", role.name)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": job.metadata.namespace, "labels": role_labels(job, role.name)},
        "spec": {
            "clusterIP": "None",
            # Rendezvous needs the names before the pods are Ready.
            "publishNotReadyAddresses": True,
            "selector": role_selector(job, role.name),
            "ports": [{"name": "rendezvous", "port": RENDEZVOUS_PORT, "targetPort": RENDEZVOUS_PORT}],
        },
    }
