"""The addresses of a cluster's real nodes and the CNI config of their pods.

A cluster that runs real nodes owns one host bridge (its "link"), on which the host holds
the cluster's address (the apiserver and cluster DNS listen there) and every node of the
cluster has one address, through a veth from a network namespace of its own. Nodes reach
each other over that bridge (layer 2: the host forwards nothing) and each other's pods
through routes in their own namespaces; kube-proxy's iptables rules and the CNI bridge live
inside the node's namespace and never touch the host's. Pure functions: the wiring that
creates the links lives in `netns`.
"""

from __future__ import annotations

import ipaddress
import json
from dataclasses import dataclass

# Ranges chosen away from the usual 10.0/8 and 172.17/16 defaults of Docker and CNI, so a
# developer machine running either keeps its own routes, and away from the Service range
# (10.96/16), kwok's pod range (10.244/16) and the fake
# nodes' made-up InternalIPs (10.128/16 onwards, one /16 per pool).
CLUSTER_LINKS = ipaddress.IPv4Network("10.203.0.0/16")
POD_RANGES = ipaddress.IPv4Network("10.204.0.0/16")
NODES_PER_CLUSTER = 4
MAX_CLUSTERS = POD_RANGES.num_addresses // 256 // NODES_PER_CLUSTER


@dataclass(frozen=True)
class ClusterLink:
    """The host side of one cluster's node network."""

    index: int
    bridge: str
    host_address: ipaddress.IPv4Interface


@dataclass(frozen=True)
class NodeNetwork:
    link: ClusterLink
    index: int
    netns: str
    host_veth: str
    node_veth: str
    node_address: ipaddress.IPv4Interface
    pod_cidr: ipaddress.IPv4Network
    pod_bridge: str
    # Every other node slot's pod range and the node address that routes to it; a route to
    # a node that is not running leads nowhere, which is what a missing node means anyway.
    sibling_routes: tuple[tuple[ipaddress.IPv4Network, ipaddress.IPv4Address], ...]

    @property
    def host_address(self) -> ipaddress.IPv4Interface:
        return self.link.host_address

    @property
    def host_bridge(self) -> str:
        return self.link.bridge


def cluster_link(index: int) -> ClusterLink:
    if not 0 <= index < MAX_CLUSTERS:
        raise ValueError(f"cluster link index {index} out of range 0..{MAX_CLUSTERS - 1}")
    subnet = list(CLUSTER_LINKS.subnets(new_prefix=24))[index]
    # Interface names are at most 15 bytes (IFNAMSIZ - 1).
    return ClusterLink(index, f"rlkc{index}", ipaddress.IPv4Interface(f"{subnet[1]}/{subnet.prefixlen}"))


def _node_address(link: ClusterLink, node: int) -> ipaddress.IPv4Interface:
    return ipaddress.IPv4Interface(f"{link.host_address.network[node + 2]}/{link.host_address.network.prefixlen}")


def _pod_cidr(link: ClusterLink, node: int) -> ipaddress.IPv4Network:
    return list(POD_RANGES.subnets(new_prefix=24))[link.index * NODES_PER_CLUSTER + node]


def node_network(cluster_index: int, node_index: int) -> NodeNetwork:
    """The names and addresses of node `node_index` of the cluster on link `cluster_index`;
    no two (cluster, node) pairs share any."""
    link = cluster_link(cluster_index)
    if not 0 <= node_index < NODES_PER_CLUSTER:
        raise ValueError(f"node index {node_index} out of range 0..{NODES_PER_CLUSTER - 1}")
    siblings = tuple(
        (_pod_cidr(link, other), _node_address(link, other).ip)
        for other in range(NODES_PER_CLUSTER)
        if other != node_index
    )
    return NodeNetwork(
        link=link,
        index=node_index,
        netns=f"rlkube-c{cluster_index}n{node_index}",
        host_veth=f"rlkc{cluster_index}n{node_index}",
        node_veth="eth0",
        node_address=_node_address(link, node_index),
        pod_cidr=_pod_cidr(link, node_index),
        pod_bridge="cni0",
        sibling_routes=siblings,
    )


def cni_conflist(network: NodeNetwork) -> str:
    """The bridge + host-local + portmap chain containerd's CRI gives each pod sandbox.

    No masquerading: the host and the other nodes route every pod range, so a pod's address
    is what its peers see (Ray and torch.distributed advertise it), as on a flat pod network.
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
                "ipMasq": False,
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
