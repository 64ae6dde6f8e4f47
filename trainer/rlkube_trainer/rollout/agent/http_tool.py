"""The built-in HTTP tool: the model's arguments go to a user's service (retrieval, search, a
calculator behind an API) and the response body comes back as the tool's message.

Usable from a tool config (`class_name: rlkube_trainer.tools.HttpTool`) with the tool's own
schema (the arguments the service takes). Each call has a timeout; connection errors, timeouts
and the retryable statuses are retried with a growing pause; every failure becomes a clear
message to the model, never an exception in the rollout. Secrets (an API key) come from the
pod's environment (`headers_from_env`), so they stay in a Kubernetes Secret.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from rlkube_trainer.rollout.agent.schemas import FunctionToolSchema, ToolResponse
from rlkube_trainer.rollout.agent.tools import BaseTool, ToolResult

RETRYABLE = (408, 429, 500, 502, 503, 504)


@dataclass(frozen=True)
class HttpToolConfig:
    """The `config` block of the tool's entry (verl's tool config format)."""

    url: str
    method: str = "POST"  # POST sends the arguments as a JSON body, GET as query parameters
    timeout_seconds: float = 10.0
    retries: int = 2  # attempts after the first
    backoff_seconds: float = 0.5  # doubled after each failed attempt
    headers: dict[str, str] = field(default_factory=dict)
    headers_from_env: dict[str, str] = field(default_factory=dict)  # header -> environment variable
    retry_on: tuple[int, ...] = RETRYABLE

    def __post_init__(self) -> None:
        scheme = urllib.parse.urlsplit(self.url).scheme
        if scheme not in ("http", "https"):
            raise ValueError(f"http tool: url must be http(s)://..., got {self.url!r}")
        if self.method not in ("GET", "POST"):
            raise ValueError(f"http tool: method must be GET or POST, got {self.method!r}")
        if self.timeout_seconds <= 0 or self.retries < 0 or self.backoff_seconds < 0:
            raise ValueError("http tool: timeout_seconds must be > 0, retries and backoff_seconds >= 0")
        missing = [name for name in self.headers_from_env.values() if name not in os.environ]
        if missing:
            raise ValueError(f"http tool: headers_from_env names unset environment variables {missing}")

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> HttpToolConfig:
        known = set(cls.__dataclass_fields__)
        unknown = set(config) - known - {"type"}
        if unknown:
            raise ValueError(f"http tool config: unknown keys {sorted(unknown)}; known are {sorted(known)}")
        values = {k: v for k, v in config.items() if k in known}
        if "retry_on" in values:
            values["retry_on"] = tuple(int(code) for code in values["retry_on"])
        return cls(**values)


@dataclass(frozen=True)
class Reply:
    text: str
    ok: bool
    attempts: int
    status: int | None


def call_service(config: HttpToolConfig, arguments: dict[str, Any]) -> Reply:
    """One tool call, retried as configured; blocking (the tool runs it in a thread)."""
    headers = {"Accept": "application/json, text/plain", **config.headers}
    headers |= {header: os.environ[variable] for header, variable in config.headers_from_env.items()}
    url, body = config.url, None
    if config.method == "GET":
        url += ("&" if urllib.parse.urlsplit(url).query else "?") + urllib.parse.urlencode(arguments)
    else:
        body = json.dumps(arguments).encode()
        headers["Content-Type"] = "application/json"
    pause, failure, status = config.backoff_seconds, "", None
    for attempt in range(1, config.retries + 2):
        request = urllib.request.Request(url, data=body, headers=headers, method=config.method)
        try:
            with urllib.request.urlopen(request, timeout=config.timeout_seconds) as response:
                return Reply(response.read().decode(errors="replace"), True, attempt, response.status)
        except urllib.error.HTTPError as error:
            status = error.code
            failure = f"HTTP {error.code} {error.reason}: {error.read().decode(errors='replace')[:200]}".strip()
            if error.code not in config.retry_on:
                return Reply(f"Error: {failure}", False, attempt, status)
        except (TimeoutError, urllib.error.URLError, ConnectionError) as error:
            reason = getattr(error, "reason", error)
            failure = f"timed out after {config.timeout_seconds} s" if isinstance(reason, TimeoutError) else str(reason)
        if attempt <= config.retries:
            time.sleep(pause)
            pause *= 2
    return Reply(f"Error: {failure} ({config.retries + 1} attempts)", False, config.retries + 1, status)


class HttpTool(BaseTool):
    def __init__(self, config: dict[str, Any], tool_schema: FunctionToolSchema) -> None:
        super().__init__(config, tool_schema)
        self.service = HttpToolConfig.from_config(config)

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any) -> ToolResult:
        start = time.perf_counter()
        reply = await asyncio.to_thread(call_service, self.service, parameters)
        metrics = {"ok": reply.ok, "attempts": reply.attempts, "latency_s": time.perf_counter() - start}
        return ToolResponse(text=reply.text), 0.0, metrics
