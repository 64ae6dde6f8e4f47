"""The node's API client: the repo's small REST client, plus kubeconfig reading and watches."""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import socket
import threading
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from rlkube_e2e.errors import ClusterError
from rlkube_e2e.kubeapi import ApiError, Credentials, KubeApi


@dataclass(frozen=True)
class ClusterAccess:
    server: str
    credentials: Credentials

    @property
    def ca_cert(self) -> bytes:
        return self.credentials.ca_cert.read_bytes()


def read_kubeconfig(kubeconfig: Path, credentials_dir: Path) -> ClusterAccess:
    """The current context's server and client certificate, written as files for ssl.

    Only client-certificate users are supported: that is what the local cluster's
    admin kubeconfig holds.
    """
    try:
        config = yaml.safe_load(kubeconfig.read_text())
        context_name = config["current-context"]
        context = next(c["context"] for c in config["contexts"] if c["name"] == context_name)
        cluster = next(c["cluster"] for c in config["clusters"] if c["name"] == context["cluster"])
        user = next(u["user"] for u in config["users"] if u["name"] == context["user"])
    except (OSError, yaml.YAMLError, KeyError, StopIteration, TypeError) as error:
        raise ClusterError(f"{kubeconfig}: not a usable kubeconfig ({error!r})") from None
    credentials_dir.mkdir(parents=True, exist_ok=True)
    credentials_dir.chmod(0o700)
    files = {}
    for name, data_key, file_key, section in (
        ("ca.crt", "certificate-authority-data", "certificate-authority", cluster),
        ("client.crt", "client-certificate-data", "client-certificate", user),
        ("client.key", "client-key-data", "client-key", user),
    ):
        path = credentials_dir / name
        if data_key in section:
            path.write_bytes(base64.b64decode(section[data_key]))
        elif file_key in section:
            path.write_bytes((kubeconfig.parent / section[file_key]).read_bytes())
        else:
            raise ClusterError(f"{kubeconfig}: the current context has no {data_key} (client certificates only)")
        path.chmod(0o600)
        files[name] = path
    return ClusterAccess(str(cluster["server"]), Credentials(files["ca.crt"], files["client.crt"], files["client.key"]))


class NodeApi(KubeApi):
    """KubeApi with watches; `close()` ends the watch in progress, from any thread, and refuses new ones."""

    def __init__(self, access: ClusterAccess, timeout: float = 15.0) -> None:
        super().__init__(access.server, access.credentials, timeout)
        self._watch_socket: socket.socket | None = None
        self._closed = False
        self._lock = threading.Lock()

    def watch(self, path: str, params: dict[str, str], timeout_seconds: int = 300) -> Iterator[dict[str, Any]]:
        """Yield watch events until the server ends the watch (after `timeout_seconds`) or `close()`."""
        query = urllib.parse.urlencode({**params, "watch": "1", "timeoutSeconds": str(timeout_seconds)})
        # The socket timeout outlasts the server's, so a silent connection ends the watch too.
        connection = http.client.HTTPSConnection(
            self.host, self.port, context=self._context, timeout=timeout_seconds + 30
        )
        try:
            connection.request("GET", f"{path}?{query}", headers={"Accept": "application/json"})
            with self._lock:
                if self._closed:
                    return
                self._watch_socket = connection.sock
            response = connection.getresponse()
            if response.status != 200:
                raise ApiError(response.status, response.reason, response.read().decode(errors="replace"))
            while line := response.readline():
                if line.strip():
                    yield json.loads(line)
        finally:
            with self._lock:
                self._watch_socket = None
            connection.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._watch_socket is not None:
                with contextlib.suppress(OSError):
                    self._watch_socket.shutdown(socket.SHUT_RDWR)
