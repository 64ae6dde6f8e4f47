"""rlkube_trainer.reward.remote against a real HTTP server on 127.0.0.1 (http.server in a thread)
that fails, stalls and recovers as each test scripts it: retries on connection errors, timeouts,
429 and 5xx only; the concurrency limit; headers, literal and from a Secret's variable."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from rlkube_api.config import RewardConfig
from rlkube_api.config.reward import RemoteVerifierConfig
from rlkube_trainer.reward.function import CallFailed, RewardFunctionError
from rlkube_trainer.reward.remote import RemoteVerifier
from rlkube_trainer.reward.scoring import FAILED_METRIC, RewardInput, build_reward_scorer


class Verifier(ThreadingHTTPServer):
    """Answers each request with the next scripted action ("ok" once the script is spent): an
    HTTP status to fail with, "stall" (answers after 1 s), or "ok" ({"score": 1 if the solution
    is the ground truth}, after `delay`)."""

    daemon_threads = True
    request_queue_size = 64  # the listen backlog: concurrent connections wait, none is refused

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.script: list[int | str] = []
        self.delay = 0.0
        self.requests: list[tuple[dict[str, str], dict[str, Any]]] = []
        self.in_flight = self.most_in_flight = 0
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/score"


class Handler(BaseHTTPRequestHandler):
    server: Verifier

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        server = self.server
        with server.lock:
            server.requests.append((dict(self.headers), body))
            action = server.script.pop(0) if server.script else "ok"
            server.in_flight += 1
            server.most_in_flight = max(server.most_in_flight, server.in_flight)
        try:
            if action == "stall":
                time.sleep(1.0)
            elif isinstance(action, int):
                self.send_error(action, "scripted failure")
                return
            time.sleep(server.delay)
            answer = json.dumps({"score": float(body["solution_str"] == body["ground_truth"])}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up on a stalled request
            pass
        finally:
            with server.lock:
                server.in_flight -= 1

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def verifier(monkeypatch: pytest.MonkeyPatch) -> Iterator[Verifier]:
    monkeypatch.setenv("no_proxy", "127.0.0.1")
    server = Verifier()
    thread = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def client(url: str, **settings: Any) -> RemoteVerifier:
    config = RemoteVerifierConfig.model_validate({"url": url, "backoffSeconds": 0.01, **settings})
    return RemoteVerifier.from_config(config, environ={})


CALL = {"data_source": "toy", "solution_str": "4", "ground_truth": "4", "extra_info": {"row": 0}}


def test_5xx_and_429_are_retried_until_the_server_recovers(verifier: Verifier) -> None:
    verifier.script = [503, 429, 500]
    assert client(verifier.url, retries=3).request(CALL) == {"score": 1.0}
    assert len(verifier.requests) == 4
    assert verifier.requests[0][1] == CALL


def test_a_4xx_is_final_and_names_the_row(verifier: Verifier) -> None:
    verifier.script = [400]
    scorer = build_reward_scorer(RewardConfig.model_validate({"remote": {"url": verifier.url, "backoffSeconds": 0.01}}))
    with pytest.raises(RewardFunctionError) as failure:
        scorer.score([RewardInput("toy", "4", "4")])
    assert str(failure.value).startswith(
        f"remote verifier {verifier.url} on batch row 0 (data_source 'toy') answered HTTP 400 scripted failure"
    )
    assert len(verifier.requests) == 1


def test_a_stalled_request_times_out_and_is_retried(verifier: Verifier) -> None:
    verifier.script = ["stall"]
    assert client(verifier.url, timeoutSeconds=0.2, retries=1).request(CALL) == {"score": 1.0}
    assert len(verifier.requests) == 2


def test_attempts_spent_score_zero_under_on_failure_zero(verifier: Verifier) -> None:
    verifier.script = [502, 502, 502]
    config = {"url": verifier.url, "retries": 2, "backoffSeconds": 0.01, "maxConcurrent": 1}
    scorer = build_reward_scorer(RewardConfig.model_validate({"remote": config, "onFailure": "zero"}))
    result = scorer.score([RewardInput("toy", "4", "4"), RewardInput("toy", "4", "4")])
    assert result.scores == [0.0, 1.0]
    assert result.extra[FAILED_METRIC] == [1.0, 0.0]


def test_connection_refused_is_retried_then_reported(verifier: Verifier) -> None:
    url = verifier.url
    verifier.shutdown()
    verifier.server_close()
    outcome = client(url, retries=2).request(CALL)
    assert isinstance(outcome, CallFailed)
    assert (
        outcome.why
        == f"failed 3 attempts at {url}, the last with ConnectionRefusedError: [Errno 111] Connection refused"
    )


def test_requests_stay_within_max_concurrent_and_answers_keep_row_order(verifier: Verifier) -> None:
    verifier.delay = 0.05
    calls = [{**CALL, "solution_str": str(i % 3)} for i in range(8)]
    calls = [{**c, "ground_truth": "1"} for c in calls]
    answers = client(verifier.url, maxConcurrent=2)(calls, True)
    assert answers == [{"score": float(i % 3 == 1)} for i in range(8)]
    assert verifier.most_in_flight == 2


def test_headers_literal_and_from_the_secrets_variable(verifier: Verifier) -> None:
    config = RemoteVerifierConfig.model_validate(
        {
            "url": verifier.url,
            "headers": {"X-Task": "math"},
            "secretHeaders": [{"header": "Authorization", "secret": "verifier-token", "key": "token"}],
        }
    )
    RemoteVerifier.from_config(config, environ={"RLKUBE_REWARD_HEADER_0": "Bearer s3cret"}).request(CALL)
    headers = verifier.requests[0][0]
    assert (headers["X-Task"], headers["Authorization"]) == ("math", "Bearer s3cret")
    with pytest.raises(
        RewardFunctionError, match=r"secretHeaders\[0\] \(Authorization\): RLKUBE_REWARD_HEADER_0 is not set"
    ):
        RemoteVerifier.from_config(config, environ={})
