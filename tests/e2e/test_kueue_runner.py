"""How the Kueue runner scopes Kueue on the shared test cluster: no cluster, no Kueue
(test_kueue_cluster runs both). The manifests here are a made-up two-document stand-in in
the shape of Kueue's config/components/webhook/manifests.yaml."""

from __future__ import annotations

import base64
from pathlib import Path

import yaml

from rlkube_e2e.kueue import QUEUE_LABEL, kueue_config, webhook_configurations

LABEL = {"rlkube.dev/kueue-test": "abc"}
MANIFESTS = yaml.safe_dump_all(
    [
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": "mutating-webhook-configuration"},
            "webhooks": [
                {
                    "name": "mpod.kb.io",
                    "clientConfig": {"service": {"name": "webhook-service", "path": "/mutate--v1-pod"}},
                    "rules": [{"apiGroups": [""], "resources": ["pods"], "operations": ["CREATE"]}],
                },
                {
                    "name": "mjob.kb.io",
                    "clientConfig": {"service": {"name": "webhook-service", "path": "/mutate-batch-v1-job"}},
                    "rules": [{"apiGroups": ["batch"], "resources": ["jobs"], "operations": ["CREATE"]}],
                },
            ],
        },
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": "validating-webhook-configuration"},
            "webhooks": [
                {
                    "name": "vworkload.kb.io",
                    "clientConfig": {"service": {"name": "webhook-service", "path": "/validate-workload"}},
                    "rules": [{"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloads"], "operations": ["CREATE"]}],
                }
            ],
        },
    ]
)


def test_webhooks_call_kueue_by_url_and_see_only_the_labelled_namespaces() -> None:
    mutating, validating = webhook_configurations(MANIFESTS, "t", "https://127.0.0.1:9443", b"CA", LABEL)
    assert (mutating["metadata"]["name"], validating["metadata"]["name"]) == ("t-mutating", "t-validating")
    # Other integrations' webhooks (batch Jobs) are dropped: this Kueue serves pods and its own API.
    assert [w["name"] for w in mutating["webhooks"]] == ["mpod.kb.io"]
    (pods,) = mutating["webhooks"]
    (workloads,) = validating["webhooks"]
    for webhook, path in ((pods, "/mutate--v1-pod"), (workloads, "/validate-workload")):
        assert webhook["clientConfig"] == {
            "url": f"https://127.0.0.1:9443{path}",
            "caBundle": base64.b64encode(b"CA").decode(),
        }
        assert webhook["namespaceSelector"] == {"matchLabels": LABEL}
    # Only pods that name a queue ever reach the pod webhook.
    assert pods["objectSelector"] == {"matchExpressions": [{"key": QUEUE_LABEL, "operator": "Exists"}]}
    assert "objectSelector" not in workloads


def test_config_manages_only_labelled_namespaces_with_the_pod_integration() -> None:
    config = kueue_config(LABEL, 9443, Path("/certs"), 8081, 8443)
    assert config["apiVersion"] == "config.kueue.x-k8s.io/v1beta2"
    assert config["managedJobsNamespaceSelector"] == {"matchLabels": LABEL}
    assert config["manageJobsWithoutQueueName"] is False
    assert config["integrations"] == {"frameworks": ["pod"]}
    assert config["internalCertManagement"] == {"enable": False}
    assert config["webhook"] == {"host": "127.0.0.1", "port": 9443, "certDir": "/certs"}
