"""Pod template overrides on a real node (the package's, from the trainer image): a Secret's value reaches
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
    from tests.e2e.real_node_kit import RealCluster

pytestmark = [pytest.mark.cluster, pytest.mark.e2e]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tiny-cpu.yaml"
SECRET_VALUE = "sk-from-the-secret"
SIDECAR = """
import json, os, time
print("RESULT " + json.dumps({"key": open("/run/wandb/api-key").read()}), flush=True)
time.sleep(3600)
"""


def _children(namespace: str, image: str) -> list[dict[str, Any]]:
    """The job's ConfigMap, Secret, RBAC and the actor's Service and StatefulSet, unowned
    (no RLJob exists, so an ownerReference would have them garbage-collected)."""
    body = yaml.safe_load(EXAMPLE.read_text())
    body["metadata"] = {"name": "tpl", "namespace": namespace, "uid": "00000000-0000-0000-0000-000000000000"}
    spec = body["spec"]
    spec.pop("volumes")
    # Checkpoints must be on a volume the API accepts as shared; this pod never writes one.
    spec["checkpoint"]["volume"] = {"emptyDir": {}}
    spec["image"], spec["imagePullPolicy"] = image, "Never"
    spec["roles"] = {"actor": {"replicas": 1, "gpusPerReplica": 0, "pool": {"nodeSelector": {POOL_LABEL: "real"}}}}
    spec["podTemplate"] = {
        "env": [{"name": "WANDB_API_KEY", "valueFrom": {"secretKeyRef": {"name": "wandb", "key": "api-key"}}}],
        "volumes": [{"name": "wandb", "secret": {"secretName": "wandb"}}],
        "sidecars": [
            {
                "name": "probe",
                "image": image,
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


def test_a_pod_on_a_real_node_sees_the_secret(
    real_cluster: RealCluster, real_kubectl: Kubectl, real_namespace: str
) -> None:
    kubectl, namespace = real_kubectl, real_namespace
    kubectl("create", "secret", "generic", "wandb", f"--from-literal=api-key={SECRET_VALUE}", "-n", namespace)
    kubectl("create", "configmap", "tiny-reward", "--from-literal=reward.py=", "-n", namespace)
    kubectl(
        "apply",
        "-n",
        namespace,
        "-f",
        "-",
        input=json.dumps(
            {"apiVersion": "v1", "kind": "List", "items": _children(namespace, real_cluster.images["trainer-cpu"].ref)}
        ),
    )

    # What the kubelet started the trainer container with: its first process's command line
    # and environment. (With no driver to join it may exit and be restarted meanwhile: retried.)
    script = (
        "import json; read = lambda n: open('/proc/1/' + n, 'rb').read().decode().split(chr(0)); "
        "print(json.dumps([read('cmdline'), read('environ')]))"
    )

    def trainer_process() -> tuple[list[str], list[str]] | None:
        result = kubectl(
            "exec", "tpl-actor-0", "-c", "trainer", "-n", namespace, "--", "python", "-c", script, check=False
        )
        if result.returncode != 0:
            return None
        argv, environ = json.loads(result.stdout)
        return argv, environ

    argv, environ = wait_for(trainer_process, "an exec into the trainer container", 180)
    assert f"WANDB_API_KEY={SECRET_VALUE}" in environ
    assert Path(argv[0]).name == "rlkube-trainer" or Path(argv[1]).name == "rlkube-trainer", argv

    # What the sidecar, a process of the same pod, read from the Secret volume.
    def sidecar_result() -> dict[str, Any] | None:
        logs = kubectl("logs", "tpl-actor-0", "-c", "probe", "-n", namespace, check=False).stdout
        lines = [line for line in logs.splitlines() if line.startswith("RESULT ")]
        return json.loads(lines[0].removeprefix("RESULT ")) if lines else None

    assert wait_for(sidecar_result, "the sidecar's RESULT line", 120) == {"key": SECRET_VALUE}
