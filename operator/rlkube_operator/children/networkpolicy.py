"""The job's NetworkPolicy (spec.networkPolicy.enabled, on by default): ingress to its pods
only from its own pods, and to the driver's metrics port also from the monitoring namespace.
The operator needs no rule: it reaches the pods only through the API server. The kubelet's
probes come from the pod's own node, which NetworkPolicies always let through."""

from __future__ import annotations

from typing import Any

from rlkube_api.names import DRIVER_METRICS_PORT, LABEL_JOB
from rlkube_api.rljob import RLJob
from rlkube_operator.children.labels import job_labels

# Set on every namespace by the API server (Kubernetes 1.22+).
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"


def network_policy_name(job: str) -> str:
    return f"{job}-network"


def network_policies(job: RLJob) -> list[dict[str, Any]]:
    """[] unless the spec asks for one."""
    spec = job.spec.network_policy
    if not spec.enabled:
        return []
    name = job.metadata.name or ""
    own_pods = {"podSelector": {"matchLabels": {LABEL_JOB: name}}}
    return [
        {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": {
                "name": network_policy_name(name),
                "namespace": job.metadata.namespace,
                "labels": job_labels(job),
            },
            "spec": {
                **own_pods,
                "policyTypes": ["Ingress"],
                "ingress": [
                    # Every port, not only rendezvous, Ray (6379), weight sync and metrics: after the
                    # rendezvous NCCL and gloo connect ranks on ephemeral ports, and so do Ray's
                    # raylets and workers. What matters is who connects: the job's pods only.
                    {"from": [own_pods]},
                    {
                        "from": [
                            {"namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: spec.metrics_namespace}}}
                        ],
                        "ports": [{"protocol": "TCP", "port": DRIVER_METRICS_PORT}],
                    },
                ],
            },
        }
    ]
