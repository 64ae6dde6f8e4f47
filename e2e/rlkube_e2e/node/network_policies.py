"""The real node's NetworkPolicy agent: kube-network-policies, as a DaemonSet runs it.

The CNI bridge enforces no NetworkPolicy, so each node runs the agent beside kube-proxy, in
the node's network namespace, under `supervise`. Its nftables rules (table
`inet kube-network-policies`) hand the first packet of every new connection to or from a
pod that a policy selects to an nfqueue, where the agent lets it through or drops it; a
dropped connection times out. While the agent is down those packets wait in the queue and
are dropped (it fails closed), until its supervisor has started it again.

The agent reads the API as a pod does (`rest.InClusterConfig`): the ServiceAccount token and
CA at `/var/run/secrets/kubernetes.io/serviceaccount`, which is the node's private /run (its
state dir's `run/`), and the server from `KUBERNETES_SERVICE_HOST` and `_PORT`. Its
ServiceAccount may only list and watch pods, namespaces and NetworkPolicies (the project's
own install manifest), granted once per cluster.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from rlkube_e2e.kubeapi import ApiError, KubeApi

NAME = "kube-network-policies"
NAMESPACE = "kube-system"
# nftables' name for the agent's rules; present once it has synced the API and loaded them.
TABLE = ("inet", NAME)
# A node may stay up for days (`e2e/cluster up`); the token only lists and watches.
TOKEN_SECONDS = 365 * 24 * 3600
SERVICE_ACCOUNT_DIR = Path("secrets/kubernetes.io/serviceaccount")  # under the node's /run


def rbac_objects() -> list[tuple[str, dict[str, Any]]]:
    """(collection path, object) for the agent's ServiceAccount, ClusterRole and binding."""
    account = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": NAME, "namespace": NAMESPACE}}
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": NAME},
        "rules": [
            {"apiGroups": [""], "resources": ["pods", "namespaces"], "verbs": ["list", "watch"]},
            {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"], "verbs": ["list", "watch"]},
        ],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": NAME},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": NAME},
        "subjects": [{"kind": "ServiceAccount", "name": NAME, "namespace": NAMESPACE}],
    }
    rbac = "/apis/rbac.authorization.k8s.io/v1"
    return [
        (f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts", account),
        (f"{rbac}/clusterroles", role),
        (f"{rbac}/clusterrolebindings", binding),
    ]


def grant_and_issue_token(api: KubeApi) -> str:
    """The agent's RBAC (created if missing: every node of a cluster shares it) and a token
    for its ServiceAccount."""
    for collection, body in rbac_objects():
        status, text = api.request("POST", collection, body)
        if status not in (201, 409):  # 409: an earlier node granted it
            raise ApiError(status, "creating the network policy agent's RBAC", text)
    request = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {"expirationSeconds": TOKEN_SECONDS},
    }
    path = f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/{NAME}/token"
    return str(api.call("POST", path, request)["status"]["token"])


def write_service_account(run_dir: Path, token: str, ca_cert: Path) -> None:
    """The files a pod's ServiceAccount volume holds, where the agent looks for them."""
    directory = run_dir / SERVICE_ACCOUNT_DIR
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "ca.crt").write_bytes(ca_cert.read_bytes())
    token_file = directory / "token"
    token_file.touch(mode=0o600)
    token_file.write_text(token)


@dataclass(frozen=True)
class AgentInputs:
    binary: Path
    node_name: str
    server: str  # the apiserver's URL, as the node's own daemons reach it


def agent_command(inputs: AgentInputs) -> list[str]:
    """The agent's command line. Without NRI (pod IPs from the runtime before the API has
    them): the node's containerd serves no NRI socket, so the agent finds none, says so once
    and learns pod IPs from the API a moment after a pod starts. (Its `--disable-nri` would
    say the same, but v0.8.0 never reads the flag.) Its metrics stay on the node's loopback."""
    server = urlsplit(inputs.server)
    return [
        "env",
        f"KUBERNETES_SERVICE_HOST={server.hostname}",
        f"KUBERNETES_SERVICE_PORT={server.port or 443}",
        str(inputs.binary),
        f"--hostname-override={inputs.node_name}",
        "--metrics-bind-address=127.0.0.1:9080",
        "--v=2",
    ]


def rules_loaded(nft: list[str]) -> bool:
    """Whether the agent's table is in place (`nft` runs nft in the node's network namespace);
    a slow answer is "not yet"."""
    try:
        return (
            subprocess.run([*nft, "list", "table", *TABLE], capture_output=True, check=False, timeout=10).returncode
            == 0
        )
    except subprocess.TimeoutExpired:
        return False
