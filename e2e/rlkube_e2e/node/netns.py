"""A cluster's host bridge, each node's network namespace and veth, and their removal.

Only the cluster's bridge (with its address), each node's host-side veth and one host route
per node (to its pods) are created on the host; a node's forwarding switch is its
namespace's own sysctl, not the host's. `leftovers` is what stop() and the tests use to
prove nothing is left.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from rlkube_e2e.node.network import MAX_CLUSTERS, ClusterLink, NodeNetwork, cluster_link

NETNS_DIR = Path("/run/netns")


class NetworkError(RuntimeError):
    """A command that sets up a node's network failed; the message names it."""


def _run(command: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, capture_output=True, text=True, check=False, timeout=30)


def _link_exists(name: str) -> bool:
    return _run(["ip", "link", "show", name]).returncode == 0


def claim_link(first: int = 0) -> ClusterLink:
    """Create the first free cluster bridge from `first` on and return it.

    Creating the bridge is the claim: `ip link add` fails when another cluster on this host
    holds the name, so two clusters starting at once never share a link.
    """
    for index in range(first, MAX_CLUSTERS):
        link = cluster_link(index)
        if _run(["ip", "link", "add", link.bridge, "type", "bridge"]).returncode != 0:
            continue
        for command in (
            ["ip", "addr", "add", str(link.host_address), "dev", link.bridge],
            ["ip", "link", "set", link.bridge, "up"],
        ):
            result = _run(command)
            if result.returncode != 0:
                remove_link(link)
                raise NetworkError(f"cluster link {link.bridge}: `{' '.join(command)}` failed: {result.stderr.strip()}")
        return link
    raise NetworkError(f"no free cluster link: bridges rlkc{first}..rlkc{MAX_CLUSTERS - 1} all exist")


def remove_link(link: ClusterLink) -> None:
    """Remove the cluster's bridge (its address and the routes through it go with it)."""
    _run(["ip", "link", "delete", link.bridge])


def link_leftovers(link: ClusterLink) -> list[str]:
    return [f"link {link.bridge}"] if _link_exists(link.bridge) else []


def setup_commands(net: NodeNetwork) -> list[list[str]]:
    inside = ["ip", "netns", "exec", net.netns]
    commands = [
        ["ip", "netns", "add", net.netns],
        ["ip", "link", "add", net.host_veth, "type", "veth", "peer", "name", net.node_veth, "netns", net.netns],
        ["ip", "link", "set", net.host_veth, "master", net.host_bridge, "up"],
        [*inside, "ip", "link", "set", "lo", "up"],
        [*inside, "ip", "addr", "add", str(net.node_address), "dev", net.node_veth],
        [*inside, "ip", "link", "set", net.node_veth, "up"],
        [*inside, "ip", "route", "add", "default", "via", str(net.host_address.ip)],
        # Per-namespace switch: the node routes for its pods, the host's stays as it was.
        [*inside, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1"],
        # The one host route the node needs: its pods, through its own address.
        ["ip", "route", "add", str(net.pod_cidr), "via", str(net.node_address.ip), "dev", net.host_bridge],
    ]
    commands += [
        [*inside, "ip", "route", "add", str(cidr), "via", str(gateway), "dev", net.node_veth]
        for cidr, gateway in net.sibling_routes
    ]
    return commands


def teardown_commands(net: NodeNetwork) -> list[list[str]]:
    # Deleting the netns destroys the veth's peer (and so the pair) and every link, rule and
    # route inside it. The host route goes through the shared bridge, so it is deleted by name.
    return [
        ["ip", "route", "delete", str(net.pod_cidr), "via", str(net.node_address.ip)],
        ["ip", "netns", "delete", net.netns],
        ["ip", "link", "delete", net.host_veth],
    ]


def create(net: NodeNetwork) -> None:
    """Create the node's namespace and veth on its cluster's bridge (which must exist)."""
    if not _link_exists(net.host_bridge):
        raise NetworkError(f"node network {net.netns}: the cluster's bridge {net.host_bridge} does not exist")
    for command in setup_commands(net):
        result = _run(command)
        if result.returncode != 0:
            remove(net)
            raise NetworkError(f"node network {net.netns}: `{' '.join(command)}` failed: {result.stderr.strip()}")


def remove(net: NodeNetwork) -> None:
    """Remove whatever of the node's network exists; absent parts are not errors."""
    for command in teardown_commands(net):
        _run(command)


def leftovers(net: NodeNetwork) -> list[str]:
    found = []
    if (NETNS_DIR / net.netns).exists():
        found.append(f"netns {net.netns}")
    if _link_exists(net.host_veth):
        found.append(f"link {net.host_veth}")
    routes = _run(["ip", "route", "show", str(net.pod_cidr)])
    if routes.stdout.strip():
        found.append(f"route {routes.stdout.strip()}")
    return found
