"""The slice of the kubelet's HTTPS API that `kubectl logs` goes through.

The apiserver serves `pods/log` by calling the node's kubelet endpoint (the
Node's InternalIP and `status.daemonEndpoints.kubeletEndpoint.Port`) at
`/containerLogs/<namespace>/<pod>/<container>`. This server answers that, and
`/healthz`; exec, attach and port-forward are not offered (404). Callers must
present a client certificate signed by the cluster's CA: the local apiserver
uses its admin certificate (--kubelet-client-certificate), so pods on the bridge
cannot read each other's logs through it.
"""

from __future__ import annotations

import datetime
import http.server
import logging
import ssl
import sys
import threading
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path

from rlkube_e2e.pki import self_signed_server_cert
from rlkube_e2e.procnode import logs
from rlkube_e2e.procnode.logs import LogRequestError, LogSource

TRUE = ("true", "1")


# (namespace, pod, container, previous) -> the log, or LogRequestError saying why there is none.
LogLookup = Callable[[str, str, str, bool], LogSource]


def parse_query(query: dict[str, list[str]], now: datetime.datetime) -> tuple[logs.LogQuery, bool]:
    """The kubelet's containerLogs options, and `previous`; LogRequestError(400) naming a bad one."""

    def one(name: str) -> str | None:
        values = query.get(name)
        return values[-1] if values else None

    def number(name: str, minimum: int) -> int | None:
        raw = one(name)
        if raw is None:
            return None
        try:
            value = int(raw)
        except ValueError:
            raise LogRequestError(400, f"{name}: {raw!r} is not an integer") from None
        if value < minimum:
            raise LogRequestError(400, f"{name}: must be at least {minimum}, got {value}")
        return value

    since: datetime.datetime | None = None
    since_seconds = number("sinceSeconds", 1)
    if since_seconds is not None:
        since = now - datetime.timedelta(seconds=since_seconds)
    raw_time = one("sinceTime")
    if raw_time is not None:
        if since is not None:
            raise LogRequestError(400, "sinceSeconds and sinceTime: at most one may be given")
        try:
            since = datetime.datetime.fromisoformat(raw_time)
        except ValueError:
            raise LogRequestError(400, f"sinceTime: {raw_time!r} is not an RFC 3339 time") from None
        if since.tzinfo is None:
            raise LogRequestError(400, f"sinceTime: {raw_time!r} has no time zone")
    options = logs.LogQuery(
        follow=(one("follow") or "").lower() in TRUE,
        timestamps=(one("timestamps") or "").lower() in TRUE,
        tail_lines=number("tailLines", 0),
        limit_bytes=number("limitBytes", 1),
        since=since,
    )
    return options, (one("previous") or "").lower() in TRUE


class KubeletServer:
    """HTTPS on `host`:<ephemeral port> (`port` once started), for the apiserver only."""

    def __init__(self, host: str, lookup: LogLookup, client_ca: Path, cert_dir: Path, log: logging.Logger) -> None:
        self.host = host
        self._lookup = lookup
        self._client_ca = client_ca
        self._cert_dir = cert_dir
        self._log = log
        self._server: http.server.ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("the kubelet server is not started")
        return int(self._server.server_address[1])

    def start(self) -> None:
        self._cert_dir.mkdir(parents=True, exist_ok=True)
        cert, key = self._cert_dir / "kubelet.crt", self._cert_dir / "kubelet.key"
        self_signed_server_cert(cert, key, "rlkube-process-node", [self.host])
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        context.load_verify_locations(self._client_ca)
        context.verify_mode = ssl.CERT_REQUIRED
        server = _Server((self.host, 0), _handler(self._lookup, self._log))
        server.log = self._log
        server.socket = context.wrap_socket(server.socket, server_side=True, do_handshake_on_connect=False)
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, name="kubelet-api", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    log = logging.getLogger(__name__)

    def handle_error(self, request: object, client_address: object) -> None:
        # A refused handshake (no client certificate) is expected, not a traceback on stderr.
        self.log.info("kubelet API: request from %s failed: %r", client_address, sys.exc_info()[1])


def _handler(lookup: LogLookup, log: logging.Logger) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        # HTTP/1.0: the body ends when the connection closes, which is what a followed log needs.
        protocol_version = "HTTP/1.0"

        def setup(self) -> None:
            # The TLS handshake happens in this request's thread, not in the accepting one.
            connection = self.request
            assert isinstance(connection, ssl.SSLSocket)
            connection.settimeout(30)
            connection.do_handshake()  # a refused client ends here: _Server.handle_error logs it
            connection.settimeout(None)
            super().setup()

        def log_message(self, format: str, *args: object) -> None:
            log.info("kubelet API: " + format, *args)

        def do_GET(self) -> None:
            url = urllib.parse.urlsplit(self.path)
            parts = url.path.strip("/").split("/")
            if url.path == "/healthz":
                self._send(200, [b"ok"])
                return
            if len(parts) != 4 or parts[0] != "containerLogs":
                self._send(404, [b"the process node serves /containerLogs/<namespace>/<pod>/<container> only\n"])
                return
            _, namespace, pod, container = parts
            try:
                query, previous = parse_query(urllib.parse.parse_qs(url.query), datetime.datetime.now(datetime.UTC))
                source = lookup(namespace, pod, container, previous)
            except LogRequestError as error:
                self._send(error.status, [f"{error}\n".encode()])
                return
            self._send(200, logs.read(source.path, query, source.running))

        def _send(self, status: int, body: Iterator[bytes] | list[bytes]) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "text/plain; charset=utf-8")
            self.end_headers()
            try:
                for chunk in body:
                    self.wfile.write(chunk)
                    self.wfile.flush()
            except (TimeoutError, BrokenPipeError, ConnectionResetError):
                pass  # the client went away (kubectl logs -f interrupted)

    return Handler
