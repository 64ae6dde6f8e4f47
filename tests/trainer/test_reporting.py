"""The driver's reporting: the progress annotation (against the real API server, with
admin and with ServiceAccount credentials), its Prometheus endpoint and /healthz."""

from __future__ import annotations

import base64
import json
import logging
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from rlkube_api.names import ANNOTATION_PROGRESS, Env
from rlkube_api.rljob import Progress
from rlkube_e2e.pki import ensure_pki
from rlkube_e2e.testing import ClusterInfo, Kubectl
from rlkube_trainer.loop.progress import (
    NullReporter,
    PodAnnotationReporter,
    kubeconfig_api,
    progress_payload,
    reporter_from_env,
)
from rlkube_trainer.loop.prometheus import DriverMetrics, metrics_port_from_env, prometheus_name
from rlkube_trainer.pod.health import HealthServer

LOGGER = "rlkube.trainer.progress"

STEP_METRICS = {
    "critic/score/mean": 0.5,
    "critic/rewards/mean": 0.25,
    "actor/pg_loss": -0.125,
    "actor/ppo_kl": 0.001,
    "response_length/mean": 42.0,
    "timing_s/gen": 1.5,
    "timing_s/step": 3.0,
    "perf/throughput": 1234.5,
    "perf/mfu/actor": 0.3,
}


# --- progress payload -------------------------------------------------------------------------


def test_progress_payload_maps_verl_metrics_to_the_progress_fields() -> None:
    before = datetime.now(UTC).replace(microsecond=0)
    payload = progress_payload(3, 30, STEP_METRICS, 0)
    updated = datetime.strptime(payload.pop("updatedAt"), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    assert before <= updated <= datetime.now(UTC)
    assert payload == {
        "step": 3,
        "totalSteps": 30,
        "percentDone": 10.0,
        "rewardMean": 0.5,
        "tokensPerSecondPerGPU": 1234.5,
        "lastCheckpointStep": 0,
    }
    # The operator validates the annotation into Progress: every key must be a wire name of it.
    progress = Progress.model_validate(progress_payload(3, 30, STEP_METRICS, 0))
    assert (progress.step, progress.total_steps, progress.reward_mean) == (3, 30, 0.5)
    assert progress.tokens_per_second_per_gpu == 1234.5
    assert progress.last_checkpoint_step == 0
    # The attempt it belongs to, when the operator started the driver for one.
    assert Progress.model_validate(progress_payload(3, 30, {}, None, attempt=2)).attempt == 2
    assert "attempt" not in progress_payload(3, 30, {}, None)


def test_progress_payload_shows_how_far_generation_lags_in_the_asynchronous_modes() -> None:
    metrics = {
        **STEP_METRICS,
        "training/rollout_weight_version": 6.0,
        "training/off_policy/trajectory_staleness/max": 1.0,
    }
    payload = progress_payload(7, 30, metrics, 0)
    assert (payload["rolloutWeightVersion"], payload["staleness"]) == (6, 1)
    progress = Progress.model_validate(payload)
    assert (progress.rollout_weight_version, progress.staleness) == (6, 1)
    # The synchronous loop reports neither.
    assert not {"rolloutWeightVersion", "staleness"} & set(progress_payload(7, 30, STEP_METRICS, 0))


def test_progress_payload_estimates_the_completion_time_from_the_pace() -> None:
    before = datetime.now(UTC).replace(microsecond=0)
    payload = progress_payload(25, 100, {}, None, seconds_per_step=12.0)
    eta = datetime.strptime(payload["estimatedCompletionTime"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    # 75 steps left at 12 s each.
    assert before + timedelta(seconds=900) <= eta <= datetime.now(UTC) + timedelta(seconds=900)
    assert payload["percentDone"] == 25.0
    assert payload["timeRemaining"] == "15m"
    assert Progress.model_validate(progress_payload(2, 3, {}, None)).percent_done == 66.7  # stored rounded
    assert not {"estimatedCompletionTime", "timeRemaining"} & set(progress_payload(3, 30, {}, None))  # no pace yet


def test_progress_payload_leaves_out_missing_and_non_finite_values() -> None:
    payload = progress_payload(1, None, {"critic/score/mean": float("nan"), "perf/throughput": "fast"}, None)
    assert set(payload) == {"step", "updatedAt"}
    json.dumps(payload, allow_nan=False)  # what the reporter sends must be strict JSON


# --- Prometheus --------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {s.name: s.value for family in text_string_to_metric_families(text) for s in family.samples}


def test_prometheus_names() -> None:
    assert prometheus_name("critic/score/mean") == "rlkube_critic_score_mean"
    assert prometheus_name("perf/mfu/actor") == "rlkube_perf_mfu_actor"
    assert prometheus_name("timing_s/update-weights") == "rlkube_timing_s_update_weights"
    assert prometheus_name("a.b:c d") == "rlkube_a_b_c_d"
    assert metrics_port_from_env({}) == 9400
    assert metrics_port_from_env({Env.METRICS_PORT: "9500"}) == 9500


@pytest.fixture
def metrics() -> Iterator[DriverMetrics]:
    driver_metrics = DriverMetrics()
    yield driver_metrics
    driver_metrics.close()


def test_driver_metrics_are_scraped_under_verl_names(metrics: DriverMetrics) -> None:
    port = free_port()
    metrics.serve(port)
    metrics.update(1, STEP_METRICS, total_steps=30)
    samples = scrape(port)
    assert samples["rlkube_trainer_step"] == 1
    assert samples["rlkube_trainer_total_steps"] == 30
    assert samples["rlkube_critic_score_mean"] == 0.5
    assert samples["rlkube_actor_pg_loss"] == -0.125
    assert samples["rlkube_timing_s_gen"] == 1.5
    assert samples["rlkube_perf_throughput"] == 1234.5
    assert samples["rlkube_perf_mfu_actor"] == 0.3

    # Gauges appear as metrics first show up (a critic's metrics only after warm-up, say).
    metrics.update(2, {"critic/score/mean": 0.75, "critic/vf_loss": 0.5, "note": "not a number"})
    samples = scrape(port)
    assert samples["rlkube_trainer_step"] == 2
    assert samples["rlkube_critic_score_mean"] == 0.75
    assert samples["rlkube_critic_vf_loss"] == 0.5
    assert samples["rlkube_actor_pg_loss"] == -0.125  # last value stays until updated
    assert "rlkube_note" not in samples


def test_driver_metrics_refuse_a_second_name_for_one_series(
    metrics: DriverMetrics, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, LOGGER)
    for step in (1, 2):
        metrics.update(step, {"actor/pg_loss": 1.0, "actor_pg_loss": 2.0, "trainer/step": 99.0})
    assert metrics.registry.get_sample_value("rlkube_actor_pg_loss", metrics.job) == 1.0
    assert metrics.registry.get_sample_value("rlkube_trainer_step", metrics.job) == 2
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 2, warnings  # once per refused name, not every step
    assert "'actor_pg_loss' maps to rlkube_actor_pg_loss" in warnings[0]


def test_driver_metrics_port_zero_serves_nothing(metrics: DriverMetrics) -> None:
    metrics.serve(0)
    metrics.update(1, STEP_METRICS)
    assert metrics.registry.get_sample_value("rlkube_critic_score_mean", metrics.job) == 0.5


def test_driver_metrics_on_a_busy_port_warn_and_the_run_goes_on(
    metrics: DriverMetrics, caplog: pytest.LogCaptureFixture
) -> None:
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with caplog.at_level(logging.WARNING):
            metrics.serve(port)
    assert f"driver metrics not served: port {port}" in caplog.text
    metrics.update(1, STEP_METRICS)
    assert metrics.registry.get_sample_value("rlkube_critic_score_mean", metrics.job) == 0.5


# --- /healthz ----------------------------------------------------------------------------------


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_health_server_follows_the_check() -> None:
    state = {"healthy": True}

    def check() -> bool:
        if state.get("broken"):
            raise RuntimeError("boom")
        return state["healthy"]

    server = HealthServer(0, check, host="127.0.0.1")
    server.start()
    try:
        url = f"http://127.0.0.1:{server.port}"
        assert get(f"{url}/healthz") == (200, "ok\n")
        state["healthy"] = False
        assert get(f"{url}/healthz")[0] == 503
        state["broken"] = True
        status, body = get(f"{url}/healthz")
        assert status == 503
        assert "boom" in body
        assert get(f"{url}/other")[0] == 404
    finally:
        server.stop()


# --- reporters without a cluster ---------------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def unreachable_reporter(tmp_path: Path, clock: FakeClock) -> PodAnnotationReporter:
    # Nothing listens on port 1: connection refused at once, a network failure without waiting.
    api = kubeconfig_api(write_kubeconfig(tmp_path, "https://127.0.0.1:1", token="t"))
    return PodAnnotationReporter(api, "ns", "pod", min_interval=5, max_backoff=40, clock=clock, sleep=clock.sleep)


def write_kubeconfig(tmp_path: Path, server: str, token: str) -> Path:
    path = tmp_path / "kubeconfig"
    config = {
        "clusters": [{"name": "c", "cluster": {"server": server, "insecure-skip-tls-verify": True}}],
        "users": [{"name": "u", "user": {"token": token}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }
    path.write_text(yaml.safe_dump(config))
    return path


def test_unreachable_api_server_is_logged_once_and_backs_off(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, LOGGER)
    clock = FakeClock()
    reporter = unreachable_reporter(tmp_path, clock)
    for _ in range(20):  # 20 steps, one second each
        reporter.report(progress_payload(1, 2, {}, None))
        clock.now += 1
    # Attempts at t=0, 5 (fail 2: wait 10), 15 (fail 3: wait 20); the rest is throttled.
    assert reporter.attempts == 3
    assert reporter.successes == 0
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "cannot reach the API server for pod ns/pod" in warnings[0].getMessage()
    slept = clock.now
    reporter.report({"step": 2}, force=True)  # the final report is tried regardless, three times
    assert reporter.attempts == 6
    assert clock.now - slept == 3.0  # 1 s, then 2 s between the tries


def test_reporter_from_env(tmp_path: Path) -> None:
    assert isinstance(reporter_from_env({}, tmp_path), NullReporter)
    env = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443", Env.POD_NAME: "job-controller-0"}
    assert isinstance(reporter_from_env(env, tmp_path), NullReporter)  # no token mounted
    sa_dir = fake_service_account_dir(tmp_path, ensure_pki(tmp_path / "pki").ca_cert.read_bytes(), "token-1")
    assert isinstance(reporter_from_env({**env, Env.POD_NAME: ""}, sa_dir), NullReporter)

    reporter = reporter_from_env(env, sa_dir)
    assert isinstance(reporter, PodAnnotationReporter)
    assert (reporter.namespace, reporter.pod) == ("from-sa", "job-controller-0")
    assert reporter.api.configuration.host == "https://10.0.0.1:443"
    assert bearer_token(reporter) == "bearer token-1"
    (sa_dir / "token").write_text("token-2\n")  # kubelet rotated it
    assert bearer_token(reporter) == "bearer token-2"

    v6 = reporter_from_env({**env, "KUBERNETES_SERVICE_HOST": "fd00::1", Env.NAMESPACE: "ns"}, sa_dir)
    assert isinstance(v6, PodAnnotationReporter)
    assert v6.api.configuration.host == "https://[fd00::1]:443"


def bearer_token(reporter: PodAnnotationReporter) -> str:
    """The Authorization header the client sends with its next request."""
    token = reporter.api.configuration.get_api_key_with_prefix("BearerToken")
    assert isinstance(token, str)
    return token


def fake_service_account_dir(tmp_path: Path, ca: bytes, token: str, namespace: str = "from-sa") -> Path:
    sa_dir = tmp_path / "serviceaccount"
    sa_dir.mkdir()
    (sa_dir / "ca.crt").write_bytes(ca)
    (sa_dir / "token").write_text(token)
    (sa_dir / "namespace").write_text(namespace)
    return sa_dir


# --- against the API server --------------------------------------------------------------------


def create_pod(kubectl: Kubectl, namespace: str, name: str) -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        # kwok's fake nodes never pull this; the annotation works on any pod, even a Pending one.
        "spec": {"containers": [{"name": "driver", "image": "rlkube/trainer:test"}]},
    }
    kubectl("apply", "-f", "-", input=json.dumps(pod))


def annotation(kubectl: Kubectl, namespace: str, pod: str) -> dict[str, object] | None:
    result = kubectl("get", "pod", pod, "-n", namespace, "-o", "json")
    value = (json.loads(result.stdout)["metadata"].get("annotations") or {}).get(ANNOTATION_PROGRESS)
    return None if value is None else dict(json.loads(value))


@pytest.mark.cluster
def test_progress_lands_on_the_pod(cluster: ClusterInfo, kubectl: Kubectl, namespace: str) -> None:
    create_pod(kubectl, namespace, "job-controller-0")
    reporter = PodAnnotationReporter(kubeconfig_api(cluster.kubeconfig), namespace, "job-controller-0")
    payload = progress_payload(3, 30, STEP_METRICS, 0)
    reporter.report(payload)
    assert reporter.successes == 1
    assert annotation(kubectl, namespace, "job-controller-0") == payload


@pytest.mark.cluster
def test_reports_are_throttled_unless_forced(cluster: ClusterInfo, kubectl: Kubectl, namespace: str) -> None:
    create_pod(kubectl, namespace, "driver")
    reporter = PodAnnotationReporter(kubeconfig_api(cluster.kubeconfig), namespace, "driver", min_interval=60)
    first, second, third = (progress_payload(step, 3, STEP_METRICS, None) for step in (1, 2, 3))
    reporter.report(first)
    reporter.report(second)
    assert (reporter.attempts, reporter.throttled) == (1, 1)
    assert annotation(kubectl, namespace, "driver") == first
    reporter.flush()  # e.g. the driver stopping: the held-back report goes out
    assert annotation(kubectl, namespace, "driver") == second
    reporter.flush()  # nothing pending any more
    assert reporter.attempts == 2
    reporter.report(third, force=True)  # the final report ignores the throttle
    assert reporter.attempts == reporter.successes == 3
    assert annotation(kubectl, namespace, "driver") == third


@pytest.mark.cluster
def test_missing_pod_is_logged_not_raised(
    cluster: ClusterInfo, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, LOGGER)
    reporter = PodAnnotationReporter(kubeconfig_api(cluster.kubeconfig), namespace, "no-such-pod", min_interval=0)
    for step in (1, 2, 3):
        reporter.report(progress_payload(step, 3, {}, None))
    assert (reporter.attempts, reporter.successes) == (3, 0)
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 1, messages
    assert f"pod {namespace}/no-such-pod (404 Not Found)" in messages[0]


@pytest.mark.cluster
def test_service_account_may_patch_only_its_own_pod(
    cluster: ClusterInfo, kubectl: Kubectl, namespace: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """What the operator sets up (children/rbac.py): get/patch on the driver pod, nothing else.
    The reporter runs the in-cluster path: env, token and CA files as a pod sees them."""
    caplog.set_level(logging.WARNING, LOGGER)
    allowed, other = "job-controller-0", "job-actor-0"
    create_pod(kubectl, namespace, allowed)
    create_pod(kubectl, namespace, other)
    kubectl("create", "serviceaccount", "job-trainer", "-n", namespace)
    kubectl(
        "create", "role", "job-progress", "-n", namespace,
        "--verb=get,patch", "--resource=pods", f"--resource-name={allowed}",
    )  # fmt: skip
    kubectl(
        "create", "rolebinding", "job-progress", "-n", namespace,
        "--role=job-progress", f"--serviceaccount={namespace}:job-trainer",
    )  # fmt: skip
    token = kubectl("create", "token", "job-trainer", "-n", namespace).stdout.strip()

    config = yaml.safe_load(cluster.kubeconfig.read_text())
    server = config["clusters"][0]["cluster"]["server"]
    ca = base64.b64decode(config["clusters"][0]["cluster"]["certificate-authority-data"])
    host, port = server.removeprefix("https://").rsplit(":", 1)
    sa_dir = fake_service_account_dir(tmp_path, ca, "not-a-token", namespace)
    env = {"KUBERNETES_SERVICE_HOST": host, "KUBERNETES_SERVICE_PORT": port, Env.POD_NAME: allowed}

    reporter = reporter_from_env(env, sa_dir)
    assert isinstance(reporter, PodAnnotationReporter)
    reporter.min_interval = 0
    reporter.report({"step": 1})
    assert reporter.successes == 0  # the bad token: 401
    (sa_dir / "token").write_text(token)  # the token "rotates": it is read again on each report
    payload = progress_payload(2, 3, STEP_METRICS, 1)
    reporter.report(payload, force=True)
    assert reporter.successes == 1
    assert annotation(kubectl, namespace, allowed) == payload

    denied = reporter_from_env({**env, Env.POD_NAME: other}, sa_dir)
    assert isinstance(denied, PodAnnotationReporter)
    denied.report(payload)
    denied.report(payload, force=True)
    assert denied.successes == 0
    assert annotation(kubectl, namespace, other) is None

    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2, messages  # one 401, one 403 (not repeated on the second try)
    assert "(401 Unauthorized)" in messages[0]
    assert f"cannot patch pod {namespace}/{other} (403 Forbidden)" in messages[1]
    assert "ServiceAccount lacks 'patch' on this pod" in messages[1]
    assert f"system:serviceaccount:{namespace}:job-trainer" in messages[1]  # the API server's own words


def test_the_attempt_marks_the_series_of_a_restarted_gang() -> None:
    metrics = DriverMetrics({Env.ATTEMPT: "2", Env.JOB_NAME: "j", Env.NAMESPACE: "ns"})
    port = free_port()
    metrics.serve(port)
    try:
        assert scrape(port)["rlkube_trainer_attempt"] == 2
    finally:
        metrics.close()
