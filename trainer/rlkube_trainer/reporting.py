"""How the driver tells the outside world how training goes.

- Progress for `kubectl get rljob`: the driver merge-patches the `rlkube.dev/progress`
  annotation of its own pod (the controller pod); the operator already watches that pod
  and copies the JSON into the RLJob's status.progress. The operator's Role allows
  exactly get/patch on that one pod, so nothing here needs broader rights.
- Step metrics for Prometheus (`DriverMetrics`): verl's names with '/' turned into '_'
  under the `rlkube_` prefix, so `critic/score/mean` is `rlkube_critic_score_mean`.
- A `/healthz` endpoint for the role pods' probes (`HealthServer`).

The Kubernetes client is plain urllib + ssl on purpose: the trainer image should not
need the kubernetes package (and its dependency tree) for one PATCH every few seconds.
Reporting is best effort: no failure here may stop or slow down training for long.
"""

from __future__ import annotations

import base64
import http.client
import json
import logging
import math
import numbers
import os
import re
import ssl
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Protocol

import yaml
from prometheus_client import CollectorRegistry, Gauge, start_http_server

from rlkube_api.names import ANNOTATION_PROGRESS, DRIVER_METRICS_PORT, Env

log = logging.getLogger("rlkube.trainer.reporting")

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
FIELD_MANAGER = "rlkube-trainer"
METRIC_PREFIX = "rlkube_"


# --- progress payload ------------------------------------------------------------------------


def _finite(value: Any) -> float | None:
    # NaN/inf are not JSON; the operator would have to write them into the RLJob status,
    # which the API server rejects. A missing value is better than a broken status.
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def rfc3339_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def progress_payload(
    step: int,
    total_steps: int | None,
    metrics: Mapping[str, Any],
    last_checkpoint_step: int | None,
) -> dict[str, Any]:
    """The annotation's JSON, with the wire names of `rlkube_api.rljob.Progress`.

    Keys without a value are left out rather than sent as null: the operator validates
    the report into `Progress`, where every field but `step` is optional.
    """
    payload: dict[str, Any] = {"step": int(step)}
    if total_steps is not None:
        payload["totalSteps"] = int(total_steps)
    reward = _finite(metrics.get("critic/score/mean"))
    if reward is not None:
        payload["rewardMean"] = reward
    throughput = _finite(metrics.get("perf/throughput"))
    if throughput is not None:
        payload["tokensPerSecondPerGPU"] = throughput
    if last_checkpoint_step is not None:
        payload["lastCheckpointStep"] = int(last_checkpoint_step)
    payload["updatedAt"] = rfc3339_now()
    return payload


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


@dataclass(frozen=True)
class ApiServer:
    """Where the Kubernetes API is and how to authenticate to it.

    `token_file` is re-read on every request: projected ServiceAccount tokens rotate
    (kubelet refreshes the file about hourly), so a token cached at start-up would
    start failing with 401 after the first rotation.
    """

    url: str
    ssl_context: ssl.SSLContext
    token: str | None = None
    token_file: Path | None = None

    def bearer_token(self) -> str | None:
        if self.token_file is not None:
            return self.token_file.read_text().strip()
        return self.token

    @classmethod
    def in_cluster(cls, env: Mapping[str, str] | None = None, sa_dir: Path = SERVICE_ACCOUNT_DIR) -> ApiServer:
        """The API server as a pod sees it (what client-go's rest.InClusterConfig does)."""
        env = os.environ if env is None else env
        host, port = env["KUBERNETES_SERVICE_HOST"], env["KUBERNETES_SERVICE_PORT"]
        if ":" in host:  # IPv6 literal
            host = f"[{host}]"
        context = ssl.create_default_context(cafile=str(sa_dir / "ca.crt"))
        return cls(f"https://{host}:{port}", context, token_file=sa_dir / "token")

    @classmethod
    def from_kubeconfig(cls, path: Path | str, context: str | None = None, token: str | None = None) -> ApiServer:
        """The cluster and user of a kubeconfig context (default: current-context).

        Supports embedded `*-data` fields and file paths, client certificates and tokens.
        With `token` given, the kubeconfig's user is ignored and only the token is sent:
        tests act as a ServiceAccount that way (a client certificate would win over the
        token in the API server's authenticator chain, so it must not be loaded).
        """
        path = Path(path)
        config = yaml.safe_load(path.read_text()) or {}
        context_name = context or config.get("current-context")
        contexts = {c["name"]: c.get("context") or {} for c in config.get("contexts") or []}
        if context_name not in contexts:
            raise ValueError(f"{path}: no context {context_name!r}")
        ctx = contexts[context_name]
        clusters = {c["name"]: c.get("cluster") or {} for c in config.get("clusters") or []}
        users = {u["name"]: u.get("user") or {} for u in config.get("users") or []}
        cluster = clusters.get(ctx.get("cluster"))
        if cluster is None:
            raise ValueError(f"{path}: context {context_name!r} names no known cluster")
        user = {} if token is not None else users.get(ctx.get("user"), {})
        base = path.parent

        def pem(data_key: str, file_key: str, where: Mapping[str, Any]) -> bytes | None:
            if where.get(data_key):
                return base64.b64decode(where[data_key])
            if where.get(file_key):
                return (base / str(where[file_key])).read_bytes()  # relative to the kubeconfig
            return None

        ssl_context = make_ssl_context(
            ca_pem=pem("certificate-authority-data", "certificate-authority", cluster),
            client_cert_pem=pem("client-certificate-data", "client-certificate", user),
            client_key_pem=pem("client-key-data", "client-key", user),
            insecure=bool(cluster.get("insecure-skip-tls-verify")),
        )
        token_file = base / str(user["tokenFile"]) if user.get("tokenFile") else None
        return cls(
            str(cluster["server"]).rstrip("/"), ssl_context, token=token or user.get("token"), token_file=token_file
        )


def make_ssl_context(
    ca_pem: bytes | None = None,
    client_cert_pem: bytes | None = None,
    client_key_pem: bytes | None = None,
    insecure: bool = False,
) -> ssl.SSLContext:
    context = ssl.create_default_context(cadata=ca_pem.decode() if ca_pem else None)
    if insecure:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if client_cert_pem is not None and client_key_pem is not None:
        # ssl loads a certificate chain only from files. The key lives on disk only for
        # the moment it takes to load it, in a private directory, then it is gone.
        with tempfile.TemporaryDirectory(prefix="rlkube-tls-") as tmp:
            cert, key = Path(tmp) / "client.crt", Path(tmp) / "client.key"
            cert.write_bytes(client_cert_pem)
            key.touch(mode=0o600)
            key.write_bytes(client_key_pem)
            context.load_cert_chain(str(cert), str(key))
    return context


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
        api: ApiServer,
        namespace: str,
        pod: str,
        *,
        min_interval: float = 5.0,
        max_backoff: float = 60.0,
        timeout: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api = api
        self.namespace = namespace
        self.pod = pod
        self.min_interval = min_interval
        self.max_backoff = max_backoff
        self.timeout = timeout
        self._clock = clock
        self._lock = threading.Lock()
        self._next_allowed = -math.inf
        self._pending: dict[str, Any] | None = None
        self._failures = 0
        self._logged: set[str] = set()
        # Counters, for tests and debugging.
        self.attempts = 0
        self.successes = 0
        self.throttled = 0

    @classmethod
    def in_cluster(
        cls,
        env: Mapping[str, str] | None = None,
        sa_dir: Path = SERVICE_ACCOUNT_DIR,
        **kwargs: Any,
    ) -> PodAnnotationReporter:
        """The controller pod reporting on itself: RLKUBE_POD_NAME / RLKUBE_NAMESPACE
        (the operator injects both), the namespace falling back to the ServiceAccount's."""
        env = os.environ if env is None else env
        namespace = env.get(Env.NAMESPACE) or (sa_dir / "namespace").read_text().strip()
        return cls(ApiServer.in_cluster(env, sa_dir), namespace, env[Env.POD_NAME], **kwargs)

    @classmethod
    def from_kubeconfig(
        cls,
        path: Path | str,
        namespace: str,
        pod: str,
        *,
        context: str | None = None,
        token: str | None = None,
        **kwargs: Any,
    ) -> PodAnnotationReporter:
        return cls(ApiServer.from_kubeconfig(path, context, token), namespace, pod, **kwargs)

    @property
    def pod_url(self) -> str:
        ns, pod = (urllib.parse.quote(x, safe="") for x in (self.namespace, self.pod))
        return f"{self.api.url}/api/v1/namespaces/{ns}/pods/{pod}?fieldManager={FIELD_MANAGER}"

    def report(self, progress: Mapping[str, Any], *, force: bool = False) -> None:
        with self._lock:
            now = self._clock()
            if not force and now < self._next_allowed:
                # Keep only the newest; flush() sends it if no later report comes.
                self._pending = dict(progress)
                self.throttled += 1
                return
            self._pending = None
            if self._patch(progress):
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
        self.attempts += 1
        where = f"pod {self.namespace}/{self.pod}"
        try:
            value = json.dumps(progress, allow_nan=False, separators=(",", ":"))
            body = json.dumps({"metadata": {"annotations": {ANNOTATION_PROGRESS: value}}}).encode()
            headers = {"Content-Type": "application/merge-patch+json", "Accept": "application/json"}
            token = self.api.bearer_token()
            if token:
                headers["Authorization"] = f"Bearer {token}"
            request = urllib.request.Request(self.pod_url, data=body, headers=headers, method="PATCH")
            with urllib.request.urlopen(request, timeout=self.timeout, context=self.api.ssl_context) as response:
                response.read()
        except urllib.error.HTTPError as error:
            self._failed(f"http {error.code}", _http_error_message(error, where))
            return False
        except (urllib.error.URLError, OSError, http.client.HTTPException) as error:
            reason = error.reason if isinstance(error, urllib.error.URLError) else error
            self._failed(f"{type(reason).__name__}: {reason}", f"cannot reach the API server for {where}: {reason}")
            return False
        except ValueError as error:  # progress not JSON-serializable, or NaN in it
            self._failed(f"payload: {error}", f"progress for {where} is not valid JSON: {error}")
            return False
        except Exception as error:  # reporting must never break the training loop
            self._failed(f"{type(error).__name__}: {error}", f"reporting progress to {where} failed: {error!r}")
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


def _http_error_message(error: urllib.error.HTTPError, where: str) -> str:
    try:
        status = json.loads(error.read() or b"{}")
        detail = str(status.get("message") or error.reason)
    except (ValueError, OSError, AttributeError):
        detail = str(error.reason)
    if error.code == 403:
        return (
            f"cannot patch {where} (403 Forbidden): the pod's ServiceAccount lacks 'patch' on this pod "
            f"(the operator's '<job>-progress' Role grants get/patch on the controller pod only; "
            f"check {Env.POD_NAME} and the pod's serviceAccountName): {detail}"
        )
    if error.code == 401:
        return f"cannot patch {where} (401 Unauthorized): the token was rejected (expired or not mounted?): {detail}"
    if error.code == 404:
        return f"cannot patch {where} (404 Not Found): no such pod; check {Env.POD_NAME}/{Env.NAMESPACE}: {detail}"
    return f"cannot patch {where} ({error.code} {error.reason}): {detail}"


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
    try:
        reporter = PodAnnotationReporter.in_cluster(env, sa_dir)
    except (OSError, KeyError) as error:  # ssl.SSLError is an OSError
        log.warning("cannot set up progress reporting (%s): progress is not reported", error)
        return NullReporter()
    log.info("reporting progress to pod %s/%s", reporter.namespace, reporter.pod)
    return reporter


# --- Prometheus ------------------------------------------------------------------------------

_INVALID = re.compile(r"[^a-zA-Z0-9_]")


def prometheus_name(metric: str) -> str:
    """`critic/score/mean` -> `rlkube_critic_score_mean`. Colons are valid in Prometheus
    names but reserved for recording rules, so they become '_' as well."""
    return METRIC_PREFIX + _INVALID.sub("_", metric)


def metrics_port_from_env(env: Mapping[str, str] | None = None) -> int:
    env = os.environ if env is None else env
    value = env.get(Env.METRICS_PORT)
    return int(value) if value else DRIVER_METRICS_PORT


class DriverMetrics:
    """The driver's step metrics as Gauges, in a registry of its own (no process/GC
    collectors of the default registry mixed in, and tests can make several)."""

    STEP = "rlkube_trainer_step"
    TOTAL_STEPS = "rlkube_trainer_total_steps"

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._step = Gauge(self.STEP, "Last completed training step.", registry=self.registry)
        self._total_steps = Gauge(self.TOTAL_STEPS, "Training steps in the run.", registry=self.registry)
        self._gauges: dict[str, Gauge] = {}  # metric name -> gauge
        # Prometheus name -> metric name, to catch two names that map to one series.
        self._owners: dict[str, str] = {self.STEP: "", self.TOTAL_STEPS: ""}
        self._skipped: set[str] = set()  # names refused for a clash: warned about once
        self._lock = threading.Lock()
        self._server: Any = None

    def update(self, step: int, metrics: Mapping[str, Any], total_steps: int | None = None) -> None:
        with self._lock:
            for name, value in metrics.items():
                number = _number(value)
                if number is None:
                    continue  # not a number (a string tag, a list): nothing to plot
                gauge = self._gauge(name)
                if gauge is not None:
                    gauge.set(number)
            self._step.set(step)
            if total_steps is not None:
                self._total_steps.set(total_steps)

    def _gauge(self, name: str) -> Gauge | None:
        gauge = self._gauges.get(name)
        if gauge is not None or name in self._skipped:
            return gauge
        prom = prometheus_name(name)
        owner = self._owners.get(prom)
        if owner is not None:
            # Another metric (or a built-in) already owns this series; alternating values
            # from two sources would make both unreadable, so the newcomer is dropped.
            log.warning("metric %r maps to %s, already used by %r: not exported", name, prom, owner or prom)
            self._skipped.add(name)
            return None
        gauge = Gauge(prom, f"verl metric {name}", registry=self.registry)
        self._owners[prom] = name
        self._gauges[name] = gauge
        return gauge

    def serve(self, port: int, addr: str = "0.0.0.0") -> None:
        """Serve /metrics on `port`; 0 means do not serve (like the operator's --metrics-port)."""
        if port == 0:
            return
        try:
            self._server, _thread = start_http_server(port, addr=addr, registry=self.registry)
        except OSError as error:
            # A busy port (e.g. two local runs on one machine) must not stop the training:
            # the same numbers go to metrics.jsonl and the progress reports.
            log.warning(
                "driver metrics not served: port %d: %s (set %s to another port)", port, error, Env.METRICS_PORT
            )

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def _number(value: Any) -> float | None:
    # numbers.Real covers numpy scalars too (numpy registers them), not only float/int.
    return float(value) if isinstance(value, numbers.Real) else None


# --- health endpoint -------------------------------------------------------------------------


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
