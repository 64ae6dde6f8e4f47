"""The real node's NetworkPolicy agent: its command line, grant and credentials, without a
cluster (it enforcing policies on the real nodes is tests/e2e/test_real_node_job.py)."""

from __future__ import annotations

import stat
from pathlib import Path

from rlkube_e2e.node import network_policies
from rlkube_e2e.node.network_policies import AgentInputs, agent_command, rbac_objects, write_service_account


def test_the_agent_reaches_the_apiserver_the_node_uses_as_its_node() -> None:
    command = agent_command(AgentInputs(Path("/cache/kube-network-policies"), "real-0", "https://10.201.0.1:6443"))
    assert command[:4] == [
        "env",
        "KUBERNETES_SERVICE_HOST=10.201.0.1",
        "KUBERNETES_SERVICE_PORT=6443",
        "/cache/kube-network-policies",
    ]
    assert "--hostname-override=real-0" in command
    # Fails closed: packets it has not judged are dropped, not let through.
    assert not any(arg.startswith("--fail-open") for arg in command)


def test_the_agent_may_only_list_and_watch_pods_namespaces_and_network_policies() -> None:
    objects = {body["kind"]: body for _, body in rbac_objects()}
    rules = objects["ClusterRole"]["rules"]
    assert {verb for rule in rules for verb in rule["verbs"]} == {"list", "watch"}
    assert {r for rule in rules for r in rule["resources"]} == {"pods", "namespaces", "networkpolicies"}
    [subject] = objects["ClusterRoleBinding"]["subjects"]
    assert subject == {"kind": "ServiceAccount", "name": network_policies.NAME, "namespace": network_policies.NAMESPACE}


def test_its_token_sits_where_a_pods_service_account_volume_puts_it(tmp_path: Path) -> None:
    ca = tmp_path / "ca.crt"
    ca.write_text("CA")
    write_service_account(tmp_path / "run", "TOKEN", ca)
    # The node's /run is its state dir's run/: /var/run/secrets/kubernetes.io/serviceaccount inside.
    directory = tmp_path / "run" / "secrets" / "kubernetes.io" / "serviceaccount"
    assert (directory / "token").read_text() == "TOKEN" and (directory / "ca.crt").read_text() == "CA"
    assert stat.S_IMODE((directory / "token").stat().st_mode) == 0o600
