"""The cluster's DNS: CoreDNS with its kubernetes plugin, on the cluster link's host address.

One CoreDNS per cluster serves every real node's pods (the kubelet's `clusterDNS`): Service
names, headless StatefulSet pod names (`<pod>.<service>.<namespace>.svc.cluster.local`),
and the host's resolver for everything else. It runs beside the control plane rather than
as a pod, as the apiserver does here, so it needs no image of its own.
"""

from __future__ import annotations

from pathlib import Path

CLUSTER_DOMAIN = "cluster.local"


def corefile(address: str, kubeconfig: Path, context: str) -> str:
    return f"""{CLUSTER_DOMAIN}:53 in-addr.arpa:53 ip6.arpa:53 {{
    bind {address}
    errors
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        kubeconfig {kubeconfig} {context}
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 5
    }}
    cache 5
}}
.:53 {{
    bind {address}
    errors
    forward . /etc/resolv.conf
    cache 30
}}
"""
