"""kube-proxy's config and flags for one real node: Services inside the node's namespace.

kube-proxy runs in the node's network namespace, so the iptables rules it writes for
ClusterIPs (the `kubernetes` Service and the operator's) are the node's, never the host's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlkube_e2e.node.network import POD_RANGES


@dataclass(frozen=True)
class KubeProxyInputs:
    node_name: str
    node_ip: str
    kubeconfig: Path


def kube_proxy_config(inputs: KubeProxyInputs) -> dict[str, Any]:
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(inputs.kubeconfig)},
        "mode": "iptables",
        "hostnameOverride": inputs.node_name,
        "bindAddress": inputs.node_ip,
        "clusterCIDR": str(POD_RANGES),
        "healthzBindAddress": "127.0.0.1:10256",
        "metricsBindAddress": "127.0.0.1:10249",
        "iptables": {
            # The pods of one node share its CNI bridge; without br_netfilter (a host-wide
            # module) a reply from a Service's backend on the same bridge would skip the
            # un-DNAT. Masquerading all Service traffic sends every reply back through the node.
            "masqueradeAll": True,
            # route_localnet would be set in the node's namespace only, but nothing here
            # needs NodePorts on loopback.
            "localhostNodePorts": False,
        },
        # Zero: leave the kernel's conntrack settings alone (nf_conntrack_max is host-wide).
        "conntrack": {
            "maxPerCore": 0,
            "min": 0,
            "tcpEstablishedTimeout": "0s",
            "tcpCloseWaitTimeout": "0s",
        },
    }


def write_kube_proxy_config(path: Path, inputs: KubeProxyInputs) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(kube_proxy_config(inputs), indent=2) + "\n")


def kube_proxy_args(kube_proxy: Path, config: Path) -> list[str]:
    return [str(kube_proxy), f"--config={config}", "--v=1"]
