"""The code interpreter's sandbox in a pod as the multi-turn example runs it: the
trainer image as its non-root user, in a namespace that enforces the restricted Pod Security
Standard, with the Localhost seccomp profile `examples/seccomp/rlkube-sandbox.json` that the
README asks users to put on their nodes (the real nodes here hold it, as a node image would:
`rlkube_e2e.node.node.SECCOMP_PROFILES`).

With the profile, model-written code runs, and the hostile cases (an infinite loop, a fork
bomb, a 10 GB allocation, reading /etc/passwd, opening a socket) are each contained with a
tool error. With the containers' RuntimeDefault profile, the sandbox cannot make its network
namespace and refuses to run code at all rather than run it unconfined: the profile is what
makes the difference."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest

from tests.e2e.real_node_kit import wait_phase

if TYPE_CHECKING:
    from rlkube_e2e.testing import Kubectl
    from tests.e2e.real_node_kit import RealCluster

pytestmark = [pytest.mark.cluster, pytest.mark.e2e]

PROFILE = "profiles/rlkube-sandbox.json"
# What the pod runs: each case through the code interpreter's sandbox, one JSON line of results.
CASES = {
    "ordinary": "print(6 * 7)",
    "infinite_loop": "while True:\n    pass\n",
    "fork_bomb": "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
    "allocate_10gb": "x = bytearray(10 * 1024**3)\n",
    "read_etc_passwd": "print(open('/etc/passwd').read())",
    "open_socket": "import socket\nsocket.create_connection(('10.0.0.1', 443), timeout=2)\n",
}
SCRIPT = f"""
import json
from rlkube_trainer.rollout.agent.sandbox import SandboxLimits, run_python

limits = SandboxLimits(cpu_seconds=2, wall_seconds=5.0, memory_bytes=256 * 1024 * 1024)
results = {{}}
for name, code in {CASES!r}.items():
    r = run_python(code, limits)
    results[name] = {{"ok": r.ok, "stdout": r.stdout[:200], "error": r.error}}
print(json.dumps(results))
"""


def _run_pod(
    kubectl: Kubectl, cluster: RealCluster, namespace: str, name: str, profile: dict[str, str]
) -> dict[str, Any]:
    """The script in a pod of the trainer image under the restricted standard; its results."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "restartPolicy": "Never",
            "nodeSelector": {"rlkube.dev/pool": "real"},
            "securityContext": {"runAsNonRoot": True, "seccompProfile": profile},
            "containers": [
                {
                    "name": "sandbox",
                    "image": cluster.images["trainer-cpu"].ref,
                    "imagePullPolicy": "Never",
                    "command": ["python3", "-c", SCRIPT],
                    "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
                    "resources": {"limits": {"cpu": "1", "memory": "1Gi"}},
                }
            ],
        },
    }
    kubectl("apply", "-f", "-", input=json.dumps(pod))
    api = cluster.nodes[0].api()
    final = wait_phase(api, f"/api/v1/namespaces/{namespace}/pods/{name}", {"Succeeded", "Failed"}, 180)
    logs = kubectl("-n", namespace, "logs", name).stdout
    assert final["status"]["phase"] == "Succeeded", f"{json.dumps(final['status'])[:2000]}\n{logs[-3000:]}"
    result: dict[str, Any] = json.loads(logs.strip().splitlines()[-1])
    return result


def test_the_sandbox_holds_in_a_restricted_pod_with_the_localhost_profile(
    real_cluster: RealCluster, real_kubectl: Kubectl, real_namespace: str
) -> None:
    kubectl, namespace = real_kubectl, real_namespace
    kubectl("label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted")

    confined = _run_pod(
        kubectl, real_cluster, namespace, "localhost", {"type": "Localhost", "localhostProfile": PROFILE}
    )
    assert confined["ordinary"] == {"ok": True, "stdout": "42\n", "error": None}, confined
    for case in ("infinite_loop", "fork_bomb", "allocate_10gb", "read_etc_passwd", "open_socket"):
        outcome = confined[case]
        assert not outcome["ok"] and outcome["error"], (case, outcome)
        assert "sandbox unavailable" not in outcome["error"], (case, outcome)  # contained, not refused
    assert "MemoryError" in confined["allocate_10gb"]["error"], confined
    assert "PermissionError" in confined["read_etc_passwd"]["error"], confined
    assert "root:" not in confined["read_etc_passwd"]["stdout"], confined

    # RuntimeDefault refuses unshare: the sandbox says so instead of running the code unconfined.
    refused = _run_pod(kubectl, real_cluster, namespace, "runtime-default", {"type": "RuntimeDefault"})
    assert all(
        not outcome["ok"] and "sandbox unavailable" in (outcome["error"] or "") for outcome in refused.values()
    ), refused
