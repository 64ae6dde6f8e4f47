"""The real node's network (issue 28): created for real, reachable, removed without a trace."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from rlkube_e2e.node import netns
from rlkube_e2e.node.network import node_network

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None, reason="needs root and iproute2")


def test_the_node_reaches_the_host_over_its_own_link_and_leaves_nothing() -> None:
    # An index far from the ones a running cluster's nodes would take.
    net = node_network(201)
    netns.remove(net)
    assert netns.leftovers(net) == []
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
    assert netns.leftovers(net) == []
