"""The HTTP tool against a real local HTTP server: arguments as JSON or query, retries of a
flaky service, a timeout, no retry on a client error, secrets from the environment."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import pytest

from rlkube_trainer.rollout.agent.http_tool import HttpTool
from rlkube_trainer.rollout.agent.schemas import FunctionToolSchema

SCHEMA = FunctionToolSchema.model_validate(
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the corpus.",
            "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
        },
    }
)


class Service(BaseHTTPRequestHandler):
    calls: ClassVar[dict[str, int]] = {}  # per path, across requests

    def log_message(self, *_: Any) -> None:  # quiet
        return

    def _reply(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self._reply(200, {"path": self.path, "auth": self.headers.get("Authorization")})

    def do_POST(self) -> None:
        name = self.path.strip("/")
        Service.calls[name] = Service.calls.get(name, 0) + 1
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if name == "flaky" and Service.calls[name] <= 2:
            self._reply(503, {"error": "busy"})
        elif name == "slow":
            time.sleep(1.0)
            self._reply(200, {"late": True})
        elif name == "missing":
            self._reply(404, {"error": "no such index"})
        else:
            self._reply(200, {"hits": [body["query"].upper()]})


@pytest.fixture(scope="module")
def service() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Service)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def _call(config: dict[str, Any], query: str = "kv cache") -> tuple[str, dict[str, Any]]:
    response, reward, metrics = asyncio.run(HttpTool(config, SCHEMA).execute("id", {"query": query}))
    assert reward == 0.0
    return response.text or "", metrics


def test_the_arguments_go_as_json_and_the_body_comes_back(service: str) -> None:
    text, metrics = _call({"url": f"{service}/search"})
    assert json.loads(text) == {"hits": ["KV CACHE"]} and metrics["ok"] and metrics["attempts"] == 1


def test_get_sends_query_parameters_and_headers_from_the_environment(
    service: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SEARCH_TOKEN", "Bearer t0k3n")
    text, _ = _call({"url": f"{service}/q?k=5", "method": "GET", "headers_from_env": {"Authorization": "SEARCH_TOKEN"}})
    assert json.loads(text) == {"path": "/q?k=5&query=kv+cache", "auth": "Bearer t0k3n"}


def test_a_flaky_service_is_retried(service: str) -> None:
    text, metrics = _call({"url": f"{service}/flaky", "retries": 2, "backoff_seconds": 0.05})
    assert json.loads(text) == {"hits": ["KV CACHE"]} and metrics["attempts"] == 3


def test_a_slow_service_times_out_with_a_clear_error(service: str) -> None:
    start = time.perf_counter()
    text, metrics = _call({"url": f"{service}/slow", "timeout_seconds": 0.2, "retries": 1, "backoff_seconds": 0.05})
    assert text == "Error: timed out after 0.2 s (2 attempts)" and not metrics["ok"]
    assert time.perf_counter() - start < 1.5  # not the server's 2 x 1 s


def test_a_client_error_is_not_retried(service: str) -> None:
    text, metrics = _call({"url": f"{service}/missing", "retries": 3})
    assert text.startswith("Error: HTTP 404") and "no such index" in text and metrics["attempts"] == 1


def test_a_service_that_is_not_there_is_an_error_to_the_model() -> None:
    text, metrics = _call({"url": "http://127.0.0.1:9/none", "retries": 1, "backoff_seconds": 0.01})
    assert text.startswith("Error: ") and text.endswith("(2 attempts)") and not metrics["ok"]


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"url": "ftp://x"}, "url must be http"),
        ({"url": "http://x", "method": "PUT"}, "method must be GET or POST"),
        ({"url": "http://x", "timeout": 3}, "unknown keys ['timeout']"),
        ({"url": "http://x", "headers_from_env": {"Authorization": "RLKUBE_UNSET_VAR"}}, "RLKUBE_UNSET_VAR"),
    ],
)
def test_bad_config_is_refused_by_name(config: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        HttpTool(config, SCHEMA)
