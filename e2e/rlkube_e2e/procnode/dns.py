"""Name resolution for pods: an /etc/hosts file per namespace instead of a DNS server.

Each file is bind-mounted read-only over /etc/hosts in every pod of its
namespace and rewritten in place (same inode: bind mounts follow the inode)
whenever a pod gets or loses an address; glibc reads /etc/hosts at every
lookup. A pod with hostname and subdomain (a StatefulSet pod behind its
headless Service) gets the names CoreDNS would give it: `<host>.<subdomain>.<ns>.svc.cluster.local`
and the shorter forms that the search path `<ns>.svc.cluster.local svc.cluster.local cluster.local` resolves,
plus its bare hostname (gloo and NCCL resolve their own hostname to pick an
interface). Other namespaces' pods are listed by their `.svc` names only.

The files live in a directory shared by all process nodes of one cluster on
this host, with the entries of all of them in one list, so pods on different
nodes resolve each other. A file lock serialises writers.
"""

from __future__ import annotations

import contextlib
import fcntl
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CLUSTER_DOMAIN = "cluster.local"
# Pods resolve nothing beyond the hosts file: a loopback nameserver answers with
# "connection refused" at once instead of timing out.
RESOLV_CONF = (
    "nameserver 127.0.0.1\nsearch {namespace}.svc.{domain} svc.{domain} {domain}\noptions ndots:5 attempts:1\n"
)


@dataclass(frozen=True)
class Entry:
    uid: str
    node: str
    namespace: str
    address: str
    names: tuple[str, ...]

    def line(self) -> str:
        return "\t".join([self.uid, self.node, self.namespace, self.address, " ".join(self.names)])

    @classmethod
    def parse(cls, line: str) -> Entry | None:
        parts = line.rstrip("\n").split("\t")
        if len(parts) != 5:
            return None
        return cls(parts[0], parts[1], parts[2], parts[3], tuple(parts[4].split()))


def hostname(pod: Mapping[str, Any]) -> str:
    return str(pod["spec"].get("hostname") or pod["metadata"]["name"])


def pod_names(pod: Mapping[str, Any]) -> tuple[str, ...]:
    host = hostname(pod)
    subdomain = pod["spec"].get("subdomain")
    if not subdomain:
        return (host,)
    namespace = pod["metadata"]["namespace"]
    qualified = f"{host}.{subdomain}.{namespace}"
    return (f"{qualified}.svc.{CLUSTER_DOMAIN}", f"{qualified}.svc", qualified, f"{host}.{subdomain}", host)


def resolv_conf(namespace: str) -> str:
    return RESOLV_CONF.format(namespace=namespace, domain=CLUSTER_DOMAIN)


def render(namespace: str, entries: Sequence[Entry], service_ip: str) -> str:
    api_names = [f"kubernetes.default.svc.{CLUSTER_DOMAIN}", "kubernetes.default.svc", "kubernetes.default"]
    if namespace == "default":
        api_names.append("kubernetes")
    lines = [
        f"# /etc/hosts of namespace {namespace} on rlkube process nodes (rewritten in place, do not edit)",
        "127.0.0.1\tlocalhost",
        "::1\tlocalhost ip6-localhost ip6-loopback",
        f"{service_ip}\t{' '.join(api_names)}",
    ]
    for entry in entries:
        names = entry.names if entry.namespace == namespace else tuple(n for n in entry.names if ".svc" in n)
        if names:
            lines.append(f"{entry.address}\t{' '.join(names)}")
    return "\n".join(lines) + "\n"


class PodDns:
    """The shared hosts files of one cluster, kept in `directory`, written on behalf of `node`."""

    def __init__(self, directory: Path, node: str, service_ip: str) -> None:
        self.directory = directory
        self.node = node
        self.service_ip = service_ip

    def hosts_file(self, namespace: str) -> Path:
        with self._locked() as entries:
            self._render_all(entries, {namespace})
        return self._path(namespace)

    def publish(self, pod: Mapping[str, Any], address: str) -> None:
        metadata = pod["metadata"]
        entry = Entry(metadata["uid"], self.node, metadata["namespace"], address, pod_names(pod))
        with self._locked() as entries:
            entries[:] = [e for e in entries if e.uid != entry.uid] + [entry]
            self._save(entries, {entry.namespace})

    def withdraw(self, uid: str) -> None:
        with self._locked() as entries:
            entries[:] = [e for e in entries if e.uid != uid]
            self._save(entries)

    def withdraw_node(self) -> None:
        """Drop every entry of this node (at start: leftovers of a previous run; at stop)."""
        with self._locked() as entries:
            entries[:] = [e for e in entries if e.node != self.node]
            self._save(entries)

    def remove_if_unused(self) -> None:
        """Delete the directory once no pod of any node of this cluster has an entry (the last node stopped)."""
        with self._locked() as entries:
            if entries:
                return
            for path in self.directory.iterdir():
                path.unlink()
        with contextlib.suppress(OSError):
            self.directory.rmdir()
            self.directory.parent.rmdir()

    def _path(self, namespace: str) -> Path:
        return self.directory / f"hosts-{namespace}"

    def _save(self, entries: list[Entry], extra: set[str] | None = None) -> None:
        _write_in_place(self.directory / "entries", "".join(entry.line() + "\n" for entry in entries))
        self._render_all(entries, extra or set())

    def _render_all(self, entries: list[Entry], extra: set[str]) -> None:
        namespaces = {path.name.removeprefix("hosts-") for path in self.directory.glob("hosts-*")} | extra
        for namespace in sorted(namespaces):
            _write_in_place(self._path(namespace), render(namespace, entries, self.service_ip))

    @contextlib.contextmanager
    def _locked(self) -> Iterator[list[Entry]]:
        self.directory.mkdir(parents=True, exist_ok=True)
        with (self.directory / ".lock").open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            path = self.directory / "entries"
            text = path.read_text() if path.exists() else ""
            entries = [entry for line in text.splitlines() if (entry := Entry.parse(line)) is not None]
            yield entries


def _write_in_place(path: Path, text: str) -> None:
    # Never replace the file: pods see it through bind mounts of this inode.
    with contextlib.suppress(FileExistsError), path.open("x"):
        pass
    with path.open("r+") as handle:
        if handle.read() == text:
            return
        handle.seek(0)
        handle.write(text)
        handle.truncate()
