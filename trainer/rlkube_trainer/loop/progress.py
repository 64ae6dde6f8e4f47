"""Progress for `kubectl get rljob`: the driver merge-patches the `rlkube.dev/progress`
annotation of its own pod (the controller pod); the operator already watches that pod
and copies the JSON into the RLJob's status.progress. The operator's Role allows exactly
get/patch on that one pod, so nothing here needs broader rights.

Reporting is best effort: no failure here may stop or slow down training for long.
The kubernetes client is imported where a report is set up: runs outside a cluster
(a laptop, a benchmark host) never load it.
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from rlkube_api.durations import short_duration
from rlkube_api.names import ANNOTATION_PROGRESS, Env
from rlkube_api.rljob import Progress
from rlkube_trainer.loop.async_training.schedule import ROLLOUT_WEIGHT_VERSION

if TYPE_CHECKING:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

log = logging.getLogger("rlkube.trainer.progress")

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
FIELD_MANAGER = "rlkube-trainer"


# --- progress payload ------------------------------------------------------------------------


def _finite(value: Any) -> float | None:
    # NaN/inf are not JSON; the operator would have to write them into the RLJob status,
    # which the API server rejects. A missing value is better than a broken status.
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _rfc3339(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def _whole(value: Any) -> int | None:
    finite = _finite(value)
    return None if finite is None else int(finite)


def progress_payload(
    step: int,
    total_steps: int | None,
    metrics: Mapping[str, Any],
    last_checkpoint_step: int | None,
    val_score: float | None = None,
    val_step: int | None = None,
    seconds_per_step: float | None = None,
    attempt: int | None = None,
) -> dict[str, Any]:
    """The annotation's JSON: a `rlkube_api.rljob.Progress` on the wire. With the mean step
    time so far, the estimated completion time of the run.

    Keys without a value are left out rather than sent as null: the operator validates
    the report into `Progress`, where every field but `step` is optional.
    """
    has_val = val_step is not None and _finite(val_score) is not None
    now = datetime.now(UTC)
    percent = eta = remaining = None
    if total_steps:
        percent = min(100.0, 100.0 * step / total_steps)
        pace = _finite(seconds_per_step)
        if pace is not None:
            left = pace * max(0, total_steps - step)
            eta, remaining = _rfc3339(now + timedelta(seconds=left)), short_duration(left)
    progress = Progress(
        step=int(step),
        total_steps=None if total_steps is None else int(total_steps),
        reward_mean=_finite(metrics.get("critic/score/mean")),
        tokens_per_second_per_gpu=_finite(metrics.get("perf/throughput")),
        last_checkpoint_step=None if last_checkpoint_step is None else int(last_checkpoint_step),
        val_score=_finite(val_score) if has_val else None,
        val_step=int(val_step) if has_val and val_step is not None else None,
        percent_done=percent,
        estimated_completion_time=eta,
        time_remaining=remaining,
        rollout_weight_version=_whole(metrics.get(ROLLOUT_WEIGHT_VERSION)),
        staleness=_whole(metrics.get("training/off_policy/trajectory_staleness/max")),
        updated_at=_rfc3339(now),
        attempt=attempt,
    )
    return progress.to_wire()


# --- reporters -------------------------------------------------------------------------------


class ProgressReporter(Protocol):
    def report(self, progress: Mapping[str, Any], *, force: bool = False) -> None:
        """Publish `progress` (see `progress_payload`); `force` skips the throttle (final report)."""

    def flush(self) -> None:
        """Publish the last report the throttle held back, if any."""


class NullReporter:
    """Local runs: there is no pod to annotate."""

    def report(self, progress: Mapping[str, Any], *, force: bool = False) -> None:
        pass

    def flush(self) -> None:
        pass


def in_cluster_api(env: Mapping[str, str] | None = None, sa_dir: Path = SERVICE_ACCOUNT_DIR) -> client.ApiClient:
    """The API server as a pod sees it (the kubernetes client's in-cluster config).

    The token file is read again before every request: projected ServiceAccount tokens
    rotate (kubelet refreshes the file about hourly), so a token cached at start-up would
    start failing with 401 after the first rotation."""
    from kubernetes import client  # noqa: PLC0415
    from kubernetes.config.incluster_config import InClusterConfigLoader  # noqa: PLC0415

    configuration = client.Configuration()
    loader = InClusterConfigLoader(  # type: ignore[no-untyped-call]
        token_filename=str(sa_dir / "token"),
        cert_filename=str(sa_dir / "ca.crt"),
        environ=os.environ if env is None else env,
    )
    loader.load_and_set(configuration)  # type: ignore[no-untyped-call]

    def reread_token(c: client.Configuration) -> None:
        c.api_key["BearerToken"] = "bearer " + (sa_dir / "token").read_text().strip()

    configuration.refresh_api_key_hook = reread_token  # type: ignore[assignment]
    return client.ApiClient(configuration)


def pod_core_api(
    env: Mapping[str, str], sa_dir: Path | None = None, api: client.ApiClient | None = None
) -> client.CoreV1Api | None:
    """The core API as this pod's ServiceAccount reaches it (or through `api`, given in tests);
    None outside a pod with a mounted token, where there is nothing to record on."""
    from kubernetes import client  # noqa: PLC0415

    if api is None:
        sa_dir = sa_dir or SERVICE_ACCOUNT_DIR
        if not (sa_dir / "token").is_file():
            return None
        api = in_cluster_api(env, sa_dir)
    return client.CoreV1Api(api)


def kubeconfig_api(path: Path | str, context: str | None = None) -> client.ApiClient:
    """The cluster and user of a kubeconfig context (the kubernetes client's loader)."""
    from kubernetes import config  # noqa: PLC0415

    api: client.ApiClient = config.new_client_from_config(config_file=str(path), context=context)  # type: ignore[no-untyped-call]
    return api


FINAL_REPORT_WAITS = (1.0, 2.0)


class PodAnnotationReporter:
    """Merge-patches `rlkube.dev/progress` on one pod, at most once per `min_interval` seconds.

    Synchronous on purpose: a PATCH to a healthy API server takes milliseconds and
    steps take seconds or more, and a report that is known to have landed (or failed)
    when `report` returns keeps the final report and the tests simple. What bounds the
    cost when the API server is unreachable is the request timeout plus a backoff:
    after consecutive failures the next attempt waits up to `max_backoff` seconds.

    Nothing raises out of `report`: failures are logged once per distinct error (until
    a report succeeds again), so a 403 does not print a warning every step.
    """

    def __init__(
        self,
        api: client.ApiClient,
        namespace: str,
        pod: str,
        *,
        min_interval: float = 5.0,
        max_backoff: float = 60.0,
        timeout: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        from kubernetes import client  # noqa: PLC0415

        # One try per report: the throttle and backoff below decide when to try again. (The
        # client's connection pool takes its retries when it is made, hence a new client.)
        configuration = api.configuration
        configuration.retries = 0
        self.api = client.ApiClient(configuration)
        self.core = client.CoreV1Api(self.api)
        self.namespace = namespace
        self.pod = pod
        self.min_interval = min_interval
        self.max_backoff = max_backoff
        self.timeout = timeout
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.Lock()
        self._next_allowed = -math.inf
        self._pending: dict[str, Any] | None = None
        self._failures = 0
        self._logged: set[str] = set()
        # Counters, for tests and debugging.
        self.attempts = 0
        self.successes = 0
        self.throttled = 0

    def report(self, progress: Mapping[str, Any], *, force: bool = False) -> None:
        with self._lock:
            now = self._clock()
            if not force and now < self._next_allowed:
                # Keep only the newest; flush() sends it if no later report comes.
                self._pending = dict(progress)
                self.throttled += 1
                return
            self._pending = None
            # A forced report is the run's last word (its final step): worth a few tries, a
            # second apart and then two, against an API server busy for a moment.
            landed = self._patch(progress)
            for wait in FINAL_REPORT_WAITS if force else ():
                if landed:
                    break
                self._sleep(wait)
                landed = self._patch(progress)
            if landed:
                self._failures = 0
                self._next_allowed = now + self.min_interval
            else:
                self._failures += 1
                backoff = self.min_interval * 2 ** (self._failures - 1)
                self._next_allowed = now + min(max(backoff, self.min_interval), self.max_backoff)

    def flush(self) -> None:
        with self._lock:
            pending = self._pending
        if pending is not None:
            self.report(pending, force=True)

    def _patch(self, progress: Mapping[str, Any]) -> bool:
        from kubernetes.client.exceptions import ApiException  # noqa: PLC0415

        self.attempts += 1
        where = f"pod {self.namespace}/{self.pod}"
        try:
            value = json.dumps(progress, allow_nan=False, separators=(",", ":"))
            self.core.patch_namespaced_pod(
                self.pod,
                self.namespace,
                {"metadata": {"annotations": {ANNOTATION_PROGRESS: value}}},
                field_manager=FIELD_MANAGER,
                _request_timeout=self.timeout,
                _content_type="application/merge-patch+json",
            )
        except ApiException as error:
            self._failed(f"http {error.status}", _http_error_message(error, where))
            return False
        except ValueError as error:  # progress not JSON-serializable, or NaN in it
            self._failed(f"payload: {error}", f"progress for {where} is not valid JSON: {error}")
            return False
        except Exception as error:  # unreachable (urllib3 errors) or anything else: never break training
            reason = _root_cause(error)
            self._failed(f"{type(reason).__name__}: {reason}", f"cannot reach the API server for {where}: {reason}")
            return False
        if self._logged:
            log.info("reporting progress to %s works again", where)
            self._logged.clear()
        self.successes += 1
        return True

    def _failed(self, key: str, message: str) -> None:
        if key in self._logged:
            log.debug("%s", message)
            return
        self._logged.add(key)
        log.warning("%s (logged once; training continues)", message)


def _root_cause(error: BaseException) -> BaseException:
    reason = getattr(error, "reason", None)
    return reason if isinstance(reason, BaseException) else error


def _http_error_message(error: ApiException, where: str) -> str:
    try:
        detail = str(json.loads(error.body or "{}").get("message") or error.reason)
    except (ValueError, AttributeError):
        detail = str(error.reason)
    if error.status == 403:
        return (
            f"cannot patch {where} (403 Forbidden): the pod's ServiceAccount lacks 'patch' on this pod "
            f"(the operator's '<job>-progress' Role grants get/patch on the controller pod only; "
            f"check {Env.POD_NAME} and the pod's serviceAccountName): {detail}"
        )
    if error.status == 401:
        return f"cannot patch {where} (401 Unauthorized): the token was rejected (expired or not mounted?): {detail}"
    if error.status == 404:
        return f"cannot patch {where} (404 Not Found): no such pod; check {Env.POD_NAME}/{Env.NAMESPACE}: {detail}"
    return f"cannot patch {where} ({error.status} {error.reason}): {detail}"


def reporter_from_env(env: Mapping[str, str] | None = None, sa_dir: Path = SERVICE_ACCOUNT_DIR) -> ProgressReporter:
    """In a pod with a mounted ServiceAccount token and RLKUBE_POD_NAME: report to the pod;
    anywhere else (a laptop, CI): a NullReporter."""
    env = os.environ if env is None else env
    in_cluster = bool(env.get("KUBERNETES_SERVICE_HOST") and env.get("KUBERNETES_SERVICE_PORT"))
    if not in_cluster or not (sa_dir / "token").is_file():
        return NullReporter()
    if not env.get(Env.POD_NAME):
        log.warning("in a pod but %s is not set: progress is not reported", Env.POD_NAME)
        return NullReporter()
    from kubernetes.config import ConfigException  # noqa: PLC0415

    try:
        namespace = env.get(Env.NAMESPACE) or (sa_dir / "namespace").read_text().strip()
        reporter = PodAnnotationReporter(in_cluster_api(env, sa_dir), namespace, env[Env.POD_NAME])
    except (OSError, KeyError, ConfigException) as error:
        log.warning("cannot set up progress reporting (%s): progress is not reported", error)
        return NullReporter()
    log.info("reporting progress to pod %s/%s", reporter.namespace, reporter.pod)
    return reporter
