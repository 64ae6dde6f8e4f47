"""`GET /healthz` for the role pods' liveness probes."""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class HealthServer:
    """`GET /healthz`: 200 "ok" while `check()` is true, else 503 (also when it raises).

    Port 0 binds a free port (see `.port`), which is what tests want.
    """

    def __init__(self, port: int, check: Callable[[], bool], host: str = "0.0.0.0") -> None:
        self._check = check
        self._server = ThreadingHTTPServer((host, port), self._handler())
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        check = self._check

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.split("?", 1)[0] != "/healthz":
                    self._send(404, "not found\n")
                    return
                try:
                    healthy = bool(check())
                    detail = "" if healthy else "unhealthy"
                except Exception as error:  # a broken check means unhealthy, not a dead server
                    healthy, detail = False, f"check failed: {error!r}"
                if healthy:
                    self._send(200, "ok\n")
                else:
                    self._send(503, f"{detail}\n")

            def _send(self, code: int, text: str) -> None:
                body = text.encode()
                self.send_response(code)
                self.send_header("Content-Type", "text/plain; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # probes every few seconds would flood the pod's log

        return Handler

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._server.serve_forever, name="rlkube-health", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join()
            self._thread = None
        self._server.server_close()
