"""A remote verifier: a reward computed by an HTTP endpoint, one POST per response.

The request body is the JSON object of a reward function's arguments (data_source,
solution_str, ground_truth, extra_info); the answer is what a reward function returns, as JSON
(a number, or an object with a "score"). Requests run on `max_concurrent` threads: the work is
the endpoint's, the driver only waits. A connection error, a timeout, HTTP 429 or 5xx is retried
with exponential backoff (a server restarting, overloaded or shedding load); any other 4xx is
the request's own fault and final.
"""

from __future__ import annotations

import http.client
import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from typing import Any

from rlkube_api.config.reward import RemoteVerifierConfig
from rlkube_api.names import REWARD_HEADER_ENV_PREFIX
from rlkube_trainer.reward.function import Call, CallFailed, RewardFunctionError

# The longest Retry-After a server may ask for before the backoff's own wait applies instead.
MAX_RETRY_AFTER_SECONDS = 60.0
_BODY_SHOWN = 200  # characters of an error answer put into the message


def secret_header_values(config: RemoteVerifierConfig, environ: Mapping[str, str]) -> dict[str, str]:
    """The headers of reward.remote.secretHeaders, from the variables the operator sets from
    their Secrets (RLKUBE_REWARD_HEADER_<index>)."""
    values = {}
    for index, header in enumerate(config.secret_headers or []):
        name = f"{REWARD_HEADER_ENV_PREFIX}{index}"
        if name not in environ:
            raise RewardFunctionError(
                f"reward.remote.secretHeaders[{index}] ({header.header}): {name} is not set; in an RLJob the "
                f"operator sets it from Secret {header.secret} key {header.key}, elsewhere set it yourself"
            )
        values[header.header] = environ[name]
    return values


class RemoteVerifier:
    """Calls the endpoint for each row; `__call__` runs a batch of rows as FunctionRewardScorer's `calls`."""

    def __init__(
        self,
        url: str,
        headers: Mapping[str, str] | None = None,
        timeout_seconds: float = 30.0,
        retries: int = 3,
        backoff_seconds: float = 1.0,
        max_concurrent: int = 8,
    ) -> None:
        self.url = url
        self.headers = {"Content-Type": "application/json", "Accept": "application/json", **(headers or {})}
        self.timeout_seconds = timeout_seconds
        self.retries = retries
        self.backoff_seconds = backoff_seconds
        self.max_concurrent = max_concurrent

    @classmethod
    def from_config(cls, config: RemoteVerifierConfig, environ: Mapping[str, str] | None = None) -> RemoteVerifier:
        headers = {**(config.headers or {}), **secret_header_values(config, os.environ if environ is None else environ)}
        return cls(
            config.url, headers, config.timeout_seconds, config.retries, config.backoff_seconds, config.max_concurrent
        )

    def __call__(self, calls: Sequence[Call], stop_on_failure: bool) -> list[Any]:
        """Each row's answer or CallFailed, in row order; with stop_on_failure the first failure
        leaves the rows not yet sent unsent (None)."""
        results: list[Any] = [None] * len(calls)
        with ThreadPoolExecutor(self.max_concurrent, thread_name_prefix="rlkube-remote-reward") as executor:
            futures: dict[Future[Any], int] = {executor.submit(self.request, c): row for row, c in enumerate(calls)}
            pending = set(futures)
            while pending:
                done, pending = wait_futures(pending, return_when=FIRST_COMPLETED)
                for future in done:
                    results[futures[future]] = future.result()
                if stop_on_failure and any(isinstance(results[futures[f]], CallFailed) for f in done):
                    # The step fails: the requests in flight are left to finish on their own.
                    executor.shutdown(wait=False, cancel_futures=True)
                    break
        return results

    def request(self, call: Call) -> Any:
        """One row's answer, or CallFailed once the attempts are spent or the failure is final."""
        body = json.dumps(call, default=_jsonable).encode()
        why, retry_after = "", None
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self._backoff(attempt, retry_after))
            retry_after = None
            request = urllib.request.Request(self.url, data=body, headers=self.headers, method="POST")
            try:
                with urllib.request.urlopen(request, timeout=self.timeout_seconds) as response:
                    answer = response.read()
            except urllib.error.HTTPError as err:
                detail = err.read()[:_BODY_SHOWN].decode(errors="replace")
                if err.code != 429 and err.code < 500:
                    return CallFailed(f"answered HTTP {err.code} {err.reason}: {detail}")
                why = f"HTTP {err.code} {err.reason}"
                asked = (err.headers.get("Retry-After") or "").strip() if err.headers else ""
                retry_after = float(asked) if asked.isdigit() else None
                continue
            except (urllib.error.URLError, TimeoutError, ConnectionError, http.client.HTTPException) as err:
                reason = err.reason if isinstance(err, urllib.error.URLError) else err
                why = f"{type(reason).__name__}: {reason}" if str(reason) else type(reason).__name__
                continue
            try:
                return json.loads(answer)
            except ValueError:
                return CallFailed(f"answered with no JSON: {answer[:_BODY_SHOWN].decode(errors='replace')!r}")
        return CallFailed(f"failed {self.retries + 1} attempts at {self.url}, the last with {why}")

    def _backoff(self, attempt: int, retry_after: float | None) -> float:
        """Doubling from backoff_seconds, or longer where the server asked (Retry-After, capped)."""
        wait = self.backoff_seconds * (1 << (attempt - 1))
        if retry_after is not None:
            wait = max(wait, min(retry_after, MAX_RETRY_AFTER_SECONDS))
        return wait


def _jsonable(value: Any) -> Any:
    # numpy arrays and scalars from parquet rows (ground_truth, extra_info).
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")
