"""The `kubernetes` Service for pods: a TCP forwarder from the service IP to the apiserver.

The apiserver listens on 127.0.0.1 only, which a pod's network namespace cannot
reach. The service IP (10.96.0.1, in the apiserver's certificate) sits on the
host's bridge, and this forwarder relays connections from it to the apiserver.
It listens on the apiserver's own port rather than 443: two clusters on one
host have different apiserver ports, so their forwarders never share a socket,
while two nodes of one cluster share theirs through SO_REUSEPORT.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading

log = logging.getLogger(__name__)


class Forwarder:
    def __init__(self, listen: tuple[str, int], target: tuple[str, int]) -> None:
        self.listen = listen
        self.target = target
        self._server: socket.socket | None = None
        self._connections: set[socket.socket] = set()
        self._lock = threading.Lock()

    def start(self) -> None:
        server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        server.bind(self.listen)
        server.listen(128)
        self._server = server
        threading.Thread(target=self._accept, args=(server,), name="apiserver-forwarder", daemon=True).start()

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            # shutdown() wakes the thread blocked in accept(); close() alone does not.
            with contextlib.suppress(OSError):
                server.shutdown(socket.SHUT_RDWR)
            server.close()
        with self._lock:
            connections, self._connections = self._connections, set()
        for connection in connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)
            connection.close()

    def _accept(self, server: socket.socket) -> None:
        while True:
            try:
                client, _ = server.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=10)
            except OSError as error:
                log.warning("forwarder: cannot reach the apiserver at %s:%d: %s", *self.target, error)
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                self._connections |= {client, upstream}
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
            sink.shutdown(socket.SHUT_WR)
        except OSError:
            # Either side reset: make sure the other side sees it too.
            with contextlib.suppress(OSError):
                sink.shutdown(socket.SHUT_RDWR)
        finally:
            with self._lock:
                done = source in self._connections and sink not in self._connections
                self._connections.discard(source)
            if done:
                source.close()
                sink.close()
