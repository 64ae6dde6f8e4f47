"""Pod networking on this host: one bridge, and per pod a network namespace with a veth pair.

Every process node on the host (of any cluster) shares the bridge, so pods on
different nodes reach each other as on one flat pod network. Each node owns a
/24 of the pod network (its "pod CIDR"), claimed through a file under
HOST_DIR, so two nodes never hand out the same address. The bridge's own
address is the pods' default gateway and the node's InternalIP; nothing is
routed beyond it (no NAT, no ip_forward), so pods reach the pod network and the
host's own addresses only.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import ipaddress
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from rlkube_e2e.errors import ClusterError

BRIDGE = "rlkbr0"
# Clear of kwok's pod CIDR (10.244.0.0/16), the service range (10.96.0.0/16) and
# the fake nodes' InternalIPs (10.128.0.0/9).
POD_NETWORK = ipaddress.IPv4Network("10.89.0.0/16")
GATEWAY = "10.89.0.1"
BLOCK_PREFIX = 24
# Shared by all process nodes on the host: address block claims and DNS files.
HOST_DIR = Path("/run/rlkube-procnode")
IP_COMMAND = shutil.which("ip") or "/usr/sbin/ip"


class NetworkError(ClusterError):
    """An `ip` command failed; its message says why."""


def ip(*args: str, stdin: str | None = None, ok_if: tuple[str, ...] = ()) -> str:
    """Run `ip ARGS`; raise NetworkError with its message unless it mentions one of `ok_if`."""
    result = subprocess.run([IP_COMMAND, *args], input=stdin, capture_output=True, text=True, check=False)
    if result.returncode != 0 and not any(text in result.stderr for text in ok_if):
        raise NetworkError(f"ip {' '.join(args)}: {result.stderr.strip() or f'exit code {result.returncode}'}")
    return result.stdout


def ensure_bridge(extra_addresses: tuple[str, ...] = ()) -> None:
    """Create the bridge with the gateway address (and `extra_addresses`, /32) unless it exists."""
    ip("link", "add", BRIDGE, "type", "bridge", ok_if=("File exists",))
    for address in (f"{GATEWAY}/{POD_NETWORK.prefixlen}", *(f"{extra}/32" for extra in extra_addresses)):
        ip("addr", "add", address, "dev", BRIDGE, ok_if=("File exists", "already assigned"))
    ip("link", "set", BRIDGE, "up")


def veth_name(netns: str) -> str:
    # Interface names have at most 15 characters; the host end is named after the netns.
    return "rlk" + hashlib.sha1(netns.encode()).hexdigest()[:11]


def create_pod_network(netns: str, address: str) -> None:
    """A network namespace `netns` with eth0 at `address` on the bridge, lo up, default route via the bridge."""
    veth = veth_name(netns)
    ip("netns", "add", netns)
    try:
        ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", netns)
        ip("link", "set", veth, "master", BRIDGE, "up")
        commands = [
            f"addr add {address}/{POD_NETWORK.prefixlen} dev eth0",
            "link set eth0 up",
            "link set lo up",
            f"route add default via {GATEWAY}",
        ]
        ip("-n", netns, "-batch", "-", stdin="\n".join(commands) + "\n")
    except NetworkError:
        delete_pod_network(netns)
        raise


# What `ip` says, depending on the moment, of a link that no longer exists.
GONE = ("Cannot find device", "No such device", "does not exist")


def delete_pod_network(netns: str) -> None:
    """Kill every process in `netns`, then delete it and its veth pair."""
    kill_processes(netns)
    ip("netns", "delete", netns, ok_if=("No such file",))
    # Normally gone with the namespace; a namespace still pinned somewhere would keep it. The
    # kernel removes the pair asynchronously after the namespace goes, so the delete can race that
    # removal and fail with another message: what counts is that the link is gone afterwards.
    veth = veth_name(netns)
    try:
        ip("link", "delete", veth, ok_if=GONE)
    except NetworkError:
        if link_exists(veth):
            raise


def link_exists(name: str) -> bool:
    try:
        ip("link", "show", name)
    except NetworkError as error:
        if any(text in str(error) for text in GONE):
            return False
        raise
    return True


def processes(netns: str) -> list[int]:
    output = ip("netns", "pids", netns, ok_if=("No such file", "Invalid argument"))
    return [int(pid) for pid in output.split()]


def kill_processes(netns: str, timeout: float = 5.0) -> list[int]:
    """SIGKILL every process in `netns` until none is left; returns those it found first."""
    found = processes(netns)
    deadline = time.monotonic() + timeout
    pids = found
    while pids and time.monotonic() < deadline:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)
        # Zombies of our own children stay listed until reaped, and they hold nothing.
        pids = [pid for pid in processes(netns) if not _zombie(pid)]
    return found


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def namespaces(prefix: str) -> list[str]:
    """Names of the network namespaces starting with `prefix`."""
    output = ip("netns", "list", ok_if=("No such file",))
    return [line.split()[0] for line in output.splitlines() if line.startswith(prefix)]


class AddressBlock:
    """The /24 of the pod network that one node hands out; claimed host-wide through a file."""

    def __init__(self, network: ipaddress.IPv4Network, claim: Path) -> None:
        self.network = network
        self._claim = claim
        self._used: set[str] = set()
        self._next = 0

    @classmethod
    def claim(cls, owner: str, netns_prefix: str) -> AddressBlock:
        """Claim a free block, or one whose claimant process is gone (its namespaces are deleted first)."""
        directory = HOST_DIR / "address-blocks"
        directory.mkdir(parents=True, exist_ok=True)
        record = {"pid": os.getpid(), "owner": owner, "netns_prefix": netns_prefix}
        with _locked(HOST_DIR / "address-blocks.lock"):
            blocks = list(POD_NETWORK.subnets(new_prefix=BLOCK_PREFIX))
            # Block 0 holds the gateway.
            for index, network in enumerate(blocks[1:], start=1):
                path = directory / str(index)
                previous = _read_claim(path)
                if previous is not None and _alive(previous.get("pid")):
                    if previous.get("owner") == owner and previous.get("pid") != os.getpid():
                        raise NetworkError(f"{owner} already runs (pid {previous.get('pid')}); stop it first")
                    if previous.get("owner") != owner:
                        continue
                stale_prefix = previous.get("netns_prefix") if previous is not None else None
                if isinstance(stale_prefix, str) and stale_prefix:
                    for netns in namespaces(stale_prefix):
                        delete_pod_network(netns)
                path.write_text(json.dumps(record) + "\n")
                return cls(network, path)
        raise NetworkError(f"no free /{BLOCK_PREFIX} left in {POD_NETWORK} (claims in {directory})")

    def allocate(self) -> str:
        # Round robin rather than lowest free: a just-freed address stays unused for a
        # while, so no neighbour's ARP cache still points it at the old pod's veth.
        hosts = list(self.network.hosts())
        for offset in range(len(hosts)):
            index = (self._next + offset) % len(hosts)
            address = str(hosts[index])
            if address not in self._used:
                self._used.add(address)
                self._next = index + 1
                return address
        raise NetworkError(f"no free pod address left in {self.network}")

    def release(self, address: str) -> None:
        self._used.discard(address)

    def close(self) -> None:
        with _locked(HOST_DIR / "address-blocks.lock"):
            record = _read_claim(self._claim)
            if record is not None and record.get("pid") == os.getpid():
                self._claim.unlink(missing_ok=True)


def _read_claim(path: Path) -> dict[str, object] | None:
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except ValueError:
        return {}
    return record if isinstance(record, dict) else {}


def _alive(pid: object) -> bool:
    if not isinstance(pid, int):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield
