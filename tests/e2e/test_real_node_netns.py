"""The real node's network: created for real, reachable, removed without a trace."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from rlkube_e2e.node import mountns, netns
from rlkube_e2e.node.kubelet import KERNEL_DEFAULTS
from rlkube_e2e.node.network import MAX_CLUSTERS, node_network

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None, reason="needs root and iproute2")


def test_the_node_reaches_the_host_over_its_cluster_link_and_leaves_nothing() -> None:
    # Links far from the ones a running cluster would take first.
    link = netns.claim_link(first=MAX_CLUSTERS - 8)
    net = node_network(link.index, 1)
    forward_before = Path("/proc/sys/net/ipv4/ip_forward").read_text()
    try:
        netns.create(net)
        assert netns.leftovers(net), "create() made nothing that leftovers() sees"
        # A TCP connection from inside the node to a socket bound to the host bridge's address.
        with socket.create_server((str(net.host_address.ip), 0)) as server:
            port = server.getsockname()[1]
            connect = f"import socket; socket.create_connection(('{net.host_address.ip}', {port}), timeout=5)"
            client = ["ip", "netns", "exec", net.netns, sys.executable, "-c", connect]
            result = subprocess.run(client, capture_output=True, text=True, check=False, timeout=20)
            assert result.returncode == 0, result.stdout + result.stderr
        inside = subprocess.run(
            ["ip", "netns", "exec", net.netns, "sysctl", "-n", "net.ipv4.ip_forward"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        assert inside == "1"
        assert Path("/proc/sys/net/ipv4/ip_forward").read_text() == forward_before
    finally:
        netns.remove(net)
        netns.remove_link(link)
    assert netns.leftovers(net) == []
    assert netns.link_leftovers(link) == []


def test_a_node_needs_its_clusters_link() -> None:
    net = node_network(MAX_CLUSTERS - 1, 0)
    if netns.link_leftovers(net.link):
        pytest.skip(f"{net.host_bridge} is in use")
    with pytest.raises(netns.NetworkError, match=f"bridge {net.host_bridge} does not exist"):
        netns.create(net)
    assert netns.leftovers(net) == []


def test_inside_the_node_the_kubelets_sysctls_hold_its_values_and_the_hosts_do_not_change(tmp_path: Path) -> None:
    link = netns.claim_link(first=MAX_CLUSTERS - 8)
    net = node_network(link.index, 2)
    host_values = {key: (Path("/proc/sys") / key).read_text() for key in KERNEL_DEFAULTS}
    host_run = sorted(p.name for p in Path("/run").iterdir())
    try:
        netns.create(net)
        probe = "; ".join(f"cat /proc/sys/{key}" for key in KERNEL_DEFAULTS) + "; touch /run/node-marker; ls /run"
        result = subprocess.run(
            mountns.wrap(net.netns, tmp_path, ["sh", "-c", probe]),
            capture_output=True, text=True, check=False, timeout=30,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        lines = result.stdout.split()
        assert lines[: len(KERNEL_DEFAULTS)] == list(KERNEL_DEFAULTS.values())
        # The node's /run is its own: the host's entries are not there (util-linux's own
        # `mount` directory may be, written after the bind).
        assert "node-marker" in lines[len(KERNEL_DEFAULTS) :]
        assert not set(lines[len(KERNEL_DEFAULTS) :]) & (set(host_run) - {"mount"})
    finally:
        netns.remove(net)
        netns.remove_link(link)
    assert netns.leftovers(net) == []
    assert {key: (Path("/proc/sys") / key).read_text() for key in KERNEL_DEFAULTS} == host_values
    assert sorted(p.name for p in Path("/run").iterdir()) == host_run
    assert (tmp_path / "run" / "node-marker").exists()
