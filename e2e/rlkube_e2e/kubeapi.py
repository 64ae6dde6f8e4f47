"""A minimal Kubernetes REST client on the standard library.

`up` needs only a handful of calls (readyz, create nodes, list nodes); doing them
over `http.client` keeps the CLI free of the kubernetes package and its import time.
Tests use the real kubernetes client through the pytest fixtures instead.
"""

from __future__ import annotations

import http.client
import json
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit


class ApiError(Exception):
    def __init__(self, status: int, reason: str, body: str) -> None:
        super().__init__(f"HTTP {status} {reason}: {body[:300]}")
        self.status = status


@dataclass(frozen=True)
class Credentials:
    ca_cert: Path
    client_cert: Path
    client_key: Path


class KubeApi:
    def __init__(self, server: str, credentials: Credentials, timeout: float = 10.0) -> None:
        parts = urlsplit(server)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 443
        self.timeout = timeout
        self._context = ssl.create_default_context(cafile=str(credentials.ca_cert))
        self._context.load_cert_chain(str(credentials.client_cert), str(credentials.client_key))

    def request(
        self, method: str, path: str, body: object = None, content_type: str = "application/json"
    ) -> tuple[int, str]:
        """Send one request; connection errors propagate as OSError."""
        connection = http.client.HTTPSConnection(self.host, self.port, context=self._context, timeout=self.timeout)
        try:
            headers = {"Accept": "application/json"}
            payload = None
            if body is not None:
                payload = json.dumps(body).encode()
                headers["Content-Type"] = content_type
            connection.request(method, path, body=payload, headers=headers)
            response = connection.getresponse()
            return response.status, response.read().decode(errors="replace")
        finally:
            connection.close()

    def call(self, method: str, path: str, body: object = None, content_type: str = "application/json") -> Any:
        status, text = self.request(method, path, body, content_type)
        if not 200 <= status < 300:
            raise ApiError(status, http.client.responses.get(status, ""), text)
        return json.loads(text) if text else None

    def get(self, path: str) -> Any:
        return self.call("GET", path)

    def merge_patch(self, path: str, body: object) -> Any:
        return self.call("PATCH", path, body, "application/merge-patch+json")
