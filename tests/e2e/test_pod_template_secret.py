"""Pod template overrides on a node that runs pods for real: a Secret's value reaches
the trainer container's environment through `podTemplate.env[].valueFrom.secretKeyRef`,
and a sidecar from the template reads the same Secret from a volume the template adds.

The children are the operator's own builders' output (rlkube_operator.desired) for
one actor pod, applied without the operator: the operator's path to the API server is
tests/operator/test_overrides_cluster.py's; this is about what the pod then sees.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml

from rlkube_api.names import LABEL_ROLE
from rlkube_api.validation import parse_rljob
from rlkube_e2e.pools import POOL_LABEL
from rlkube_e2e.testing import Kubectl, wait_for
from rlkube_operator.desired import desired_children

if TYPE_CHECKING:
    from rlkube_e2e.procnode.node import ProcessNode

pytestmark = [pytest.mark.cluster, pytest.mark.e2e]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tiny-cpu.yaml"
SECRET_VALUE = "sk-from-the-secret"
SIDECAR = """
import json, os, time
print("RESULT " + json.dumps({"key": open("/run/wandb/api-key").read()}), flush=True)
time.sleep(3600)
"""


def _children(namespace: str) -> list[dict[str, Any]]:
    """The job's ConfigMap, Secret, RBAC and the actor's Service and StatefulSet, unowned
    (no RLJob exists, so an ownerReference would have them garbage-collected)."""
    body = yaml.safe_load(EXAMPLE.read_text())
    body["metadata"] = {"name": "tpl", "namespace": namespace, "uid": "00000000-0000-0000-0000-000000000000"}
    spec = body["spec"]
    spec.pop("volumes")
    spec["roles"] = {"actor": {"replicas": 1, "gpusPerReplica": 0, "pool": {"nodeSelector": {POOL_LABEL: "e2e-jobs"}}}}
    spec["podTemplate"] = {
        "env": [{"name": "WANDB_API_KEY", "valueFrom": {"secretKeyRef": {"name": "wandb", "key": "api-key"}}}],
        "volumes": [{"name": "wandb", "secret": {"secretName": "wandb"}}],
        "sidecars": [
            {
                "name": "probe",
                "image": "ignored",
                "command": ["python", "-c", SIDECAR],
                "volumeMounts": [{"name": "wandb", "mountPath": "/run/wandb", "readOnly": True}],
            }
        ],
    }
    job = parse_rljob(body)
    wanted = []
    for child in desired_children(job, "uid", 0, True, "ray-token"):
        child["metadata"].pop("ownerReferences")
        role = child["metadata"]["labels"].get(LABEL_ROLE)
        if child["kind"] in ("StatefulSet", "Service") and role != "actor":
            continue
        wanted.append(child)
    return wanted


def test_a_pod_on_the_process_node_sees_the_secret(process_node: ProcessNode, kubectl: Kubectl, namespace: str) -> None:
    kubectl("create", "secret", "generic", "wandb", f"--from-literal=api-key={SECRET_VALUE}", "-n", namespace)
    kubectl("create", "configmap", "tiny-reward", "--from-literal=reward.py=", "-n", namespace)
    kubectl(
        "apply",
        "-n",
        namespace,
        "-f",
        "-",
        input=json.dumps({"apiVersion": "v1", "kind": "List", "items": _children(namespace)}),
    )

    def pod_uid() -> str | None:
        result = kubectl("get", "pod", "tpl-actor-0", "-n", namespace, "-o", "jsonpath={.metadata.uid}", check=False)
        return result.stdout.strip() or None

    uid = wait_for(pod_uid, "pod tpl-actor-0", timeout=60)

    # What the kubelet started the trainer container with.
    spec_file = process_node.state_dir / "pods" / uid / "containers" / "trainer" / "spec.json"
    launched: dict[str, Any] = wait_for(
        lambda: json.loads(spec_file.read_text()) if spec_file.exists() else None, "the trainer's launch", 120
    )
    assert launched["env"]["WANDB_API_KEY"] == SECRET_VALUE
    assert Path(launched["argv"][0]).name == "rlkube-trainer"

    # What the sidecar, a process of the same pod, read from the Secret volume.
    def sidecar_result() -> dict[str, Any] | None:
        logs = kubectl("logs", "tpl-actor-0", "-c", "probe", "-n", namespace, check=False).stdout
        lines = [line for line in logs.splitlines() if line.startswith("RESULT ")]
        return json.loads(lines[0].removeprefix("RESULT ")) if lines else None

    assert wait_for(sidecar_result, "the sidecar's RESULT line", 120) == {"key": SECRET_VALUE}
