"""The addresses of one real node and the CNI config of its pods.

Each node gets a network namespace of its own, a veth pair to a host bridge of its own, and
a pod range inside its namespace, so that kube-proxy's iptables rules and the CNI bridge
never touch the host's. Pure functions: the wiring that creates the links lives elsewhere.
"""

from __future__ import annotations

import ipaddress
import json
from dataclasses import dataclass

# Ranges chosen away from the usual 10.0/8 and 172.17/16 defaults of Docker and CNI, so a
# developer machine running either keeps its own routes. The Service range is the
# apiserver's (cluster.py passes the same one).
NODE_LINKS = ipaddress.IPv4Network("10.203.0.0/16")
POD_RANGES = ipaddress.IPv4Network("10.204.0.0/16")
MAX_NODES = 250


@dataclass(frozen=True)
class NodeNetwork:
    index: int
    netns: str
    host_bridge: str
    host_veth: str
    node_veth: str
    host_address: ipaddress.IPv4Interface
    node_address: ipaddress.IPv4Interface
    pod_cidr: ipaddress.IPv4Network
    pod_bridge: str


def node_network(index: int) -> NodeNetwork:
    """The names and addresses of node `index` (0-based); distinct nodes never share any."""
    if not 0 <= index < MAX_NODES:
        raise ValueError(f"node index {index} out of range 0..{MAX_NODES - 1}")
    link = list(NODE_LINKS.subnets(new_prefix=24))[index]
    pods = list(POD_RANGES.subnets(new_prefix=24))[index]
    # Interface names are at most 15 bytes (IFNAMSIZ - 1).
    return NodeNetwork(
        index=index,
        netns=f"rlkube-node{index}",
        host_bridge=f"rlkbr{index}",
        host_veth=f"rlkh{index}",
        node_veth="eth0",
        host_address=ipaddress.IPv4Interface(f"{link[1]}/{link.prefixlen}"),
        node_address=ipaddress.IPv4Interface(f"{link[2]}/{link.prefixlen}"),
        pod_cidr=pods,
        pod_bridge="cni0",
    )


def cni_conflist(network: NodeNetwork) -> str:
    """The bridge + host-local + portmap chain containerd's CRI gives each pod sandbox.

    ipMasq lets pods reach the apiserver on the host through the node's address; the rule it
    adds lives in the node's namespace, where containerd (and so the plugin) runs.
    """
    gateway = network.pod_cidr[1]
    config = {
        "cniVersion": "1.0.0",
        "name": "rlkube-pods",
        "plugins": [
            {
                "type": "bridge",
                "bridge": network.pod_bridge,
                "isGateway": True,
                "ipMasq": True,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": str(network.pod_cidr), "gateway": str(gateway)}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }
    return json.dumps(config, indent=2) + "\n"
