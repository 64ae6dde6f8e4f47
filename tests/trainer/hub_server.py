"""A local HTTP server that speaks as much of the Hugging Face Hub's API as `huggingface_hub`
needs to resolve a revision and download a repo (HF_ENDPOINT / endpoint=): repo info at a
revision, and each file by commit. No internet, no weights: the repos are a few small files."""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlparse


class HubRepo:
    """A repo at one commit: `files` by path, reachable as `revision` or by its commit."""

    def __init__(self, repo_id: str, files: dict[str, bytes], revision: str = "main", kind: str = "models") -> None:
        self.repo_id, self.files, self.revision, self.kind = repo_id, files, revision, kind
        self.sha = hashlib.sha1(json.dumps({k: v.hex() for k, v in sorted(files.items())}).encode()).hexdigest()


class _Handler(BaseHTTPRequestHandler):
    repos: list[HubRepo]
    requests: list[str]

    def log_message(self, format: str, *args: object) -> None:  # quiet
        pass

    def _find(self, kind: str, repo_id: str, revision: str) -> HubRepo | None:
        return next(
            (r for r in self.repos if r.kind == kind and r.repo_id == repo_id and revision in (r.revision, r.sha)),
            None,
        )

    def _answer(self, body: bytes | None) -> None:
        path = unquote(urlparse(self.path).path).strip("/").split("/")
        auth = self.headers.get("Authorization")
        self.requests.append(f"{self.command} /{'/'.join(path)}" + (f" ({auth})" if auth else ""))
        headers: dict[str, str] = {}
        content = b""
        status = 404
        headers["X-Error-Code"] = "RepoNotFound"
        if path[0] == "api" and len(path) >= 6 and path[4] == "revision":
            repo = self._find(path[1], f"{path[2]}/{path[3]}", "/".join(path[5:]))
            if repo is not None:
                siblings = [{"rfilename": name, "size": len(data)} for name, data in sorted(repo.files.items())]
                content = json.dumps({"id": repo.repo_id, "sha": repo.sha, "siblings": siblings}).encode()
                status, headers = 200, {"Content-Type": "application/json"}
        elif path[0] == "api" and len(path) >= 6 and path[4] == "tree":
            repo = self._find(path[1], f"{path[2]}/{path[3]}", "/".join(path[5:]))
            if repo is not None:
                tree = [
                    {"type": "file", "path": name, "size": len(data), "oid": hashlib.sha1(data).hexdigest()}
                    for name, data in sorted(repo.files.items())
                ]
                content = json.dumps(tree).encode()
                status, headers = 200, {"Content-Type": "application/json"}
        else:
            kind = "datasets" if path[0] == "datasets" else "models"
            rest = path[1:] if kind == "datasets" else path
            if len(rest) >= 5 and rest[2] == "resolve":
                repo = self._find(kind, f"{rest[0]}/{rest[1]}", rest[3])
                name = "/".join(rest[4:])
                if repo is not None and name in repo.files:
                    content = repo.files[name]
                    status = 200
                    headers = {"X-Repo-Commit": repo.sha, "ETag": f'"{hashlib.sha256(content).hexdigest()}"'}
                elif repo is not None:
                    headers = {"X-Error-Code": "EntryNotFound", "X-Repo-Commit": repo.sha}
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(content)))
        self.end_headers()
        if body is None and self.command == "GET":
            self.wfile.write(content)

    def do_GET(self) -> None:
        self._answer(None)

    def do_HEAD(self) -> None:
        self._answer(b"")


@contextmanager
def hub_server(repos: list[HubRepo]) -> Iterator[tuple[str, list[str]]]:
    """The server's address and the requests it answered, while the block runs."""
    requests: list[str] = []
    handler = type("Handler", (_Handler,), {"repos": repos, "requests": requests})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", requests
    finally:
        server.shutdown()
        server.server_close()
