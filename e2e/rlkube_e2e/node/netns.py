"""The node's network namespace, its veth to a host bridge of its own, and their removal.

Only links, addresses and one route that belong to the node are created on the host; the
node's forwarding switch is the namespace's own sysctl, not the host's. `leftovers` is what
stop() and the tests use to prove nothing is left.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from rlkube_e2e.node.network import NodeNetwork

NETNS_DIR = Path("/run/netns")


def setup_commands(net: NodeNetwork) -> list[list[str]]:
    inside = ["ip", "netns", "exec", net.netns]
    return [
        ["ip", "netns", "add", net.netns],
        ["ip", "link", "add", net.host_bridge, "type", "bridge"],
        ["ip", "addr", "add", str(net.host_address), "dev", net.host_bridge],
        ["ip", "link", "set", net.host_bridge, "up"],
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


def teardown_commands(net: NodeNetwork) -> list[list[str]]:
    # Deleting the netns destroys the veth's peer (and so the pair) and every link, rule and
    # route inside it; the bridge's removal takes the host route with it.
    return [
        ["ip", "netns", "delete", net.netns],
        ["ip", "link", "delete", net.host_veth],
        ["ip", "link", "delete", net.host_bridge],
    ]


def create(net: NodeNetwork) -> None:
    for command in setup_commands(net):
        result = subprocess.run(command, capture_output=True, text=True, check=False, timeout=30)
        if result.returncode != 0:
            remove(net)
            raise RuntimeError(f"node network {net.netns}: `{' '.join(command)}` failed: {result.stderr.strip()}")


def remove(net: NodeNetwork) -> None:
    """Remove whatever of the node's network exists; absent parts are not errors."""
    for command in teardown_commands(net):
        subprocess.run(command, capture_output=True, check=False, timeout=30)


def _link_exists(name: str) -> bool:
    return subprocess.run(["ip", "link", "show", name], capture_output=True, check=False).returncode == 0


def leftovers(net: NodeNetwork) -> list[str]:
    found = []
    if (NETNS_DIR / net.netns).exists():
        found.append(f"netns {net.netns}")
    found += [f"link {name}" for name in (net.host_bridge, net.host_veth) if _link_exists(name)]
    routes = subprocess.run(["ip", "route", "show", str(net.pod_cidr)], capture_output=True, text=True, check=False)
    if routes.stdout.strip():
        found.append(f"route {routes.stdout.strip()}")
    return found
