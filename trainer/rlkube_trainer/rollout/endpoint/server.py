"""The HTTP face of the endpoint: `/v1/chat/completions` and `/v1/completions` (non-streaming),
and `POST /v1/episodes/{id}/reward`.

Which episode a call belongs to is the path of the base URL the trainer hands the harness,
`http://HOST:PORT/episodes/{id}/v1`: an `openai` client built from `OPENAI_BASE_URL` tags every
call without knowing it. Every request carries the job's token as `Authorization: Bearer TOKEN`
(the client's api key, `OPENAI_API_KEY`); without it, 401. Continuations come from the engine the
rollout already holds, through the multi-turn episodes' `BatchingGenerator` (concurrent
episodes' calls share engine batches); sampling is the run's (temperature, top-p, ...): a
request's `max_tokens` may only lower the run's budget, its other sampling fields are not the
harness's to choose, since the trained log-probs are the run's behaviour policy.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import re
import threading
import time
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from transformers import PreTrainedTokenizerBase

from rlkube_trainer.rollout.agent.chat_format import TemplateChatFormat
from rlkube_trainer.rollout.agent.engine_adapter import BatchingGenerator, Engine
from rlkube_trainer.rollout.agent.episode import Message
from rlkube_trainer.rollout.agent.parser import get_parser
from rlkube_trainer.rollout.base import SamplingConfig
from rlkube_trainer.rollout.endpoint.recorder import Call, EpisodeRecord

_CALL = re.compile(r"^/episodes/([A-Za-z0-9_.-]+)/v1/(chat/completions|completions)$")
_REWARD = re.compile(r"^/v1/episodes/([A-Za-z0-9_.-]+)/reward$")


class RequestError(Exception):
    def __init__(self, status: HTTPStatus, message: str) -> None:
        super().__init__(message)
        self.status = status


class Endpoint:
    """The episodes open now and the engine behind them; `serve` starts the HTTP server."""

    def __init__(
        self,
        engine: Engine,
        tokenizer: PreTrainedTokenizerBase,
        sampling: SamplingConfig,
        token: str,
        model_name: str = "policy",
        tool_format: str = "hermes",
    ) -> None:
        self.tokenizer = tokenizer
        self.chat = TemplateChatFormat(tokenizer)
        self.parse = get_parser(tool_format)
        self.sampling = sampling
        self.token = token
        self.model_name = model_name
        self.records: dict[str, EpisodeRecord] = {}
        self._lock = threading.Lock()
        # Engine calls in flight (a killed harness's call runs on): waited for before the engine
        # is anyone else's (`drain`), since it serves one generation at a time.
        self._calls = threading.Condition()
        self._in_flight = 0
        self._closed = False
        self._loop = asyncio.new_event_loop()
        self._loop_thread = threading.Thread(target=self._loop.run_forever, name="endpoint-engine", daemon=True)
        self._loop_thread.start()
        self._generator = BatchingGenerator(engine, sampling)
        self._server: ThreadingHTTPServer | None = None

    # Episodes.
    def open(self, episode_id: str) -> None:
        with self._lock:
            self.records[episode_id] = EpisodeRecord(episode_id)

    def close_episode(self, episode_id: str) -> EpisodeRecord:
        """The episode's record; later calls for it get 404."""
        with self._lock:
            return self.records.pop(episode_id)

    def _record(self, episode_id: str) -> EpisodeRecord:
        record = self.records.get(episode_id)
        if record is None:
            raise RequestError(HTTPStatus.NOT_FOUND, f"no open episode {episode_id!r}")
        return record

    # Calls.
    def _generate(self, prompt_ids: list[int], max_tokens: int) -> tuple[list[int], list[float]]:
        with self._calls:
            if self._closed:
                raise RequestError(HTTPStatus.SERVICE_UNAVAILABLE, "the endpoint is closed: the batch is over")
            self._in_flight += 1
        try:
            future = asyncio.run_coroutine_threadsafe(self._generator(prompt_ids, max_tokens), self._loop)
            generation = future.result()
        finally:
            with self._calls:
                self._in_flight -= 1
                self._calls.notify_all()
        return list(generation.token_ids), list(generation.logprobs)

    def drain(self) -> None:
        """Wait until no engine call is in flight: a harness killed mid-call leaves its call
        running, and the engine serves one generation at a time."""
        with self._calls:
            self._calls.wait_for(lambda: self._in_flight == 0)

    def _budget(self, body: dict[str, Any]) -> int:
        asked = body.get("max_tokens") or body.get("max_completion_tokens")
        if asked is None:
            return self.sampling.max_tokens
        if not isinstance(asked, int) or asked < 1:
            raise RequestError(HTTPStatus.BAD_REQUEST, "max_tokens must be a positive integer")
        return min(asked, self.sampling.max_tokens)

    def chat_completion(self, episode_id: str, body: dict[str, Any]) -> dict[str, Any]:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise RequestError(HTTPStatus.BAD_REQUEST, "messages must be a non-empty list")
        tools = [t.get("function", t) for t in body.get("tools") or []]
        with self._lock:
            record = self._record(episode_id)
            prompt_ids = record.chat_prompt(messages, tools, self.chat)
        budget = self._budget(body)
        ids, logprobs = self._generate(prompt_ids, budget)
        text = str(self.tokenizer.decode(ids, skip_special_tokens=True))
        content, calls, _ = self.parse(text)
        message: Message = {"role": "assistant", "content": content}
        if calls:
            message["tool_calls"] = [
                {
                    "id": f"call_{episode_id}_{len(record.calls)}_{i}",
                    "type": "function",
                    "function": c.model_dump(include={"name", "arguments"}),
                }
                for i, c in enumerate(calls)
            ]
        with self._lock:
            record.add(Call(prompt_ids, ids, logprobs))
            record.messages = [*messages, message]
        finish = "tool_calls" if calls else self._finish(ids, budget)
        return self._reply(
            "chat.completion", episode_id, record, prompt_ids, ids, {"message": message, "finish_reason": finish}
        )

    def completion(self, episode_id: str, body: dict[str, Any]) -> dict[str, Any]:
        prompt = body.get("prompt")
        if not isinstance(prompt, str) or not prompt:
            raise RequestError(HTTPStatus.BAD_REQUEST, "prompt must be a non-empty string")

        def tokenize(text: str) -> list[int]:
            return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

        with self._lock:
            record = self._record(episode_id)
            prompt_ids = record.completion_prompt(prompt, tokenize)
        budget = self._budget(body)
        ids, logprobs = self._generate(prompt_ids, budget)
        text = str(self.tokenizer.decode(ids, skip_special_tokens=True))
        with self._lock:
            record.add(Call(prompt_ids, ids, logprobs))
            record.text = prompt + text
        choice = {"text": text, "finish_reason": self._finish(ids, budget), "logprobs": None}
        return self._reply("text_completion", episode_id, record, prompt_ids, ids, choice)

    def _finish(self, ids: list[int], budget: int) -> str:
        return "length" if len(ids) >= budget and ids[-1] != self.tokenizer.eos_token_id else "stop"

    def _reply(
        self,
        kind: str,
        episode_id: str,
        record: EpisodeRecord,
        prompt: list[int],
        ids: list[int],
        choice: dict[str, Any],
    ) -> dict[str, Any]:
        return {
            "id": f"{episode_id}-{len(record.calls)}",
            "object": kind,
            "created": int(time.time()),
            "model": self.model_name,
            "choices": [{"index": 0, **choice}],
            "usage": {
                "prompt_tokens": len(prompt),
                "completion_tokens": len(ids),
                "total_tokens": len(prompt) + len(ids),
            },
        }

    def report_reward(self, episode_id: str, body: dict[str, Any]) -> dict[str, Any]:
        reward = body.get("reward")
        if isinstance(reward, bool) or not isinstance(reward, int | float):
            raise RequestError(HTTPStatus.BAD_REQUEST, "reward must be a number")
        with self._lock:
            self._record(episode_id).reward = float(reward)
        return {"episode": episode_id, "reward": float(reward)}

    def authorized(self, header: str | None) -> bool:
        given = (header or "").removeprefix("Bearer ").strip()
        return bool(given) and hmac.compare_digest(given, self.token)

    def route(self, path: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
        if match := _CALL.match(path):
            episode, kind = match.groups()
            handler = self.chat_completion if kind == "chat/completions" else self.completion
            return lambda body: handler(episode, body)
        if match := _REWARD.match(path):
            episode = match.group(1)
            return lambda body: self.report_reward(episode, body)
        raise RequestError(HTTPStatus.NOT_FOUND, f"no route {path}")

    # The server.
    def serve(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Start serving in a thread; the base address (`http://HOST:PORT`)."""
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                try:
                    if not endpoint.authorized(self.headers.get("Authorization")):
                        raise RequestError(
                            HTTPStatus.UNAUTHORIZED, "a valid job token is required (Authorization: Bearer)"
                        )
                    handler = endpoint.route(self.path)
                    try:
                        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                    except json.JSONDecodeError as exc:
                        raise RequestError(HTTPStatus.BAD_REQUEST, f"the body is not JSON: {exc}") from None
                    self._send(HTTPStatus.OK, handler(body))
                except RequestError as exc:
                    self._send(exc.status, {"error": {"message": str(exc), "code": int(exc.status)}})
                except Exception as exc:  # the engine's error: this call fails, the server goes on
                    status = HTTPStatus.INTERNAL_SERVER_ERROR
                    self._send(status, {"error": {"message": f"{type(exc).__name__}: {exc}", "code": int(status)}})

            def _send(self, status: HTTPStatus, payload: dict[str, Any]) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:  # quiet: the trainer logs episodes
                pass

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, name="endpoint-http", daemon=True).start()
        return f"http://{host}:{self._server.server_port}"

    def close(self) -> None:
        """Stop serving; calls in flight finish first, later ones are refused (503)."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        with self._calls:
            self._closed = True
        self.drain()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._loop_thread.join(timeout=5)
