"""The chart's opt-in dashboard and alerts: the Grafana ConfigMap carries the sidecar
label and valid JSON, every metric the dashboard and the rules name is one the
operator or the driver exports (the driver's from a real training step), the rules
pass promtool's checks and its unit tests fire each alert on the series that should
fire it, and no other."""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from rlkube_api.names import Env
from rlkube_e2e.binaries import cache_dir
from rlkube_operator.metrics import OperatorMetrics
from tests.chart.chart_kit import CHART, Helm, Obj, one

# e2e/toolchain.sh builds promtool into the cache, keyed by its Go module version.
PROMTOOL_VERSION = os.environ.get("PROMTOOL_VERSION", "0.316.0")
DASHBOARD = CHART / "dashboards" / "rlkube-jobs.json"
MONITORING = ("dashboards.enabled=true", "alerts.enabled=true")
METRIC = re.compile(r"\b(rlkube_[a-zA-Z0-9_]+)\b")
# The labels the driver puts on its series: `job` and `namespace` are Prometheus' own target labels.
JOB_LABELS = {"rljob", "rljob_namespace"}


def promtool_binary() -> Path:
    return cache_dir() / f"promtool-v{PROMTOOL_VERSION}" / "bin" / "promtool"


@pytest.fixture(scope="module")
def promtool() -> Path:
    binary = promtool_binary()
    if not binary.exists():
        pytest.fail(f"promtool not found at {binary}: run `make toolchain`", pytrace=False)
    return binary


@pytest.fixture(scope="module")
def rendered(helm: Helm) -> list[Obj]:
    return helm.template(*MONITORING)


def _rules(objects: list[Obj]) -> list[Obj]:
    groups: list[Obj] = one(objects, "PrometheusRule")["spec"]["groups"]
    return [rule for group in groups for rule in group["rules"]]


def _dashboard_exprs(dashboard: Obj) -> list[str]:
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    exprs += [v["query"]["query"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    return exprs


def test_nothing_is_rendered_unless_asked(helm: Helm) -> None:
    kinds = {o["kind"] for o in helm.template()}
    assert "PrometheusRule" not in kinds
    assert not [o for o in helm.template() if o["metadata"]["name"].endswith("-dashboard")]


def test_the_dashboard_is_a_configmap_for_grafanas_sidecar(rendered: list[Obj]) -> None:
    [config_map] = [o for o in rendered if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-dashboard")]
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(config_map["data"]["rlkube-jobs.json"])
    assert dashboard == json.loads(DASHBOARD.read_text())
    titles = " ".join(p["title"] for p in dashboard["panels"]).lower()
    for shown in ("reward", "throughput", "step time by phase", "restarts", "state", "progress"):
        assert shown in titles, shown


def test_the_rules_are_the_four_alerts(rendered: list[Obj]) -> None:
    names = [r["alert"] for r in _rules(rendered)]
    assert names == ["RLJobFailed", "RLJobRestartsClimbing", "RLJobNoProgress", "RLJobThroughputDropped"]


# --- every metric named is exported ------------------------------------------------------------


def _operator_exports() -> set[str]:
    names: set[str] = set()
    for family in OperatorMetrics().registry.collect():
        suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
        names |= {family.name + s for s in suffixes[family.type]}
    return names


def _driver_metrics() -> Any:
    from rlkube_trainer.loop.prometheus import DriverMetrics  # noqa: PLC0415

    return DriverMetrics()


def _one_real_step(tmp_path: Path) -> dict[str, float]:
    """The metrics of one in-process PPO step (gae: the critic's phases too)."""
    from rlkube_api.validation import parse_trainer_config  # noqa: PLC0415
    from rlkube_trainer.loop.driver import run_in_process  # noqa: PLC0415
    from rlkube_trainer.tiny.task import init  # noqa: PLC0415

    raw = yaml.safe_load(init(tmp_path, "gae", steps=1).read_text())
    raw["rollout"]["name"] = "hf"
    raw["data"]["train_batch_size"] = 8
    raw["actor"]["ppo_mini_batch_size"] = 4
    raw["actor"]["ppo_micro_batch_size_per_gpu"] = 8  # divides a mini-batch's 4 × 4 samples
    raw["algorithm"]["use_kl_in_reward"] = True  # the reference's phase too
    result = run_in_process(parse_trainer_config(raw), 1, False)
    step: dict[str, float] = result.history[-1]
    return step


def _scrape(registry: Any) -> Iterator[tuple[str, dict[str, str]]]:
    for family in registry.collect():
        for sample in family.samples:
            yield sample.name, dict(sample.labels)


@pytest.mark.trainer
def test_every_metric_the_dashboard_and_rules_name_is_exported(rendered: list[Obj], tmp_path: Path) -> None:
    driver = _driver_metrics()
    try:
        driver.update(1, _one_real_step(tmp_path), total_steps=1)
        exported = _operator_exports() | {name for name, _ in _scrape(driver.registry)}
    finally:
        driver.close()
    named = {m for e in _dashboard_exprs(json.loads(DASHBOARD.read_text())) for m in METRIC.findall(e)}
    named |= {m for r in _rules(rendered) for m in METRIC.findall(r["expr"])}
    assert named, "no metric names found"
    assert named <= exported, f"named but not exported: {sorted(named - exported)}"


def test_the_drivers_series_carry_the_job_labels_the_dashboard_selects(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(Env.JOB_NAME, "qwen")
    monkeypatch.setenv(Env.NAMESPACE, "ml")
    driver = _driver_metrics()
    try:
        driver.update(3, {"critic/score/mean": 0.5}, total_steps=10)
        samples = dict(_scrape(driver.registry))
    finally:
        driver.close()
    for name in ("rlkube_trainer_step", "rlkube_trainer_total_steps", "rlkube_critic_score_mean"):
        assert samples[name] == {"rljob": "qwen", "rljob_namespace": "ml"}, name


def test_the_dashboard_and_rules_select_driver_series_by_the_job_labels(rendered: list[Obj]) -> None:
    exprs = _dashboard_exprs(json.loads(DASHBOARD.read_text()))
    per_job = [e for e in exprs if "rlkube_trainer" in e or "rlkube_perf" in e or "rlkube_critic" in e]
    assert per_job
    assert all(set(re.findall(r"(rljob\w*)", e)) >= JOB_LABELS for e in per_job if "label_values" not in e)
    descriptions = [r["annotations"]["description"] for r in _rules(rendered) if "rlkube_trainer" in r["expr"]]
    assert all("$labels.rljob_namespace" in d and "$labels.rljob " in d for d in descriptions)


# --- promtool -----------------------------------------------------------------------------------------


def _rule_file(rendered: list[Obj], tmp_path: Path) -> Path:
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump(one(rendered, "PrometheusRule")["spec"]))
    return path


def _promtool(promtool: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(promtool), *args], capture_output=True, text=True, cwd=cwd, timeout=120, check=False)


def test_promtool_checks_the_rules(promtool: Path, rendered: list[Obj], tmp_path: Path) -> None:
    result = _promtool(promtool, "check", "rules", str(_rule_file(rendered, tmp_path)), cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 4 rules found" in result.stdout


JOB = {"rljob": "qwen", "rljob_namespace": "ml"}
JOB_SELECTOR = '{rljob="qwen",rljob_namespace="ml"}'
UNIT_TESTS: list[Obj] = [
    {
        "interval": "1m",
        "input_series": [
            {"series": 'rlkube_jobs{state="Failed"}', "values": "0x20 1x30"},
            {"series": 'rlkube_job_restarts_total{namespace="ml"}', "values": "0 0 1 2 3 3 3 3 3 3"},
            {"series": 'rlkube_job_restarts_total{namespace="calm"}', "values": "0 0 1 1 1 1 1 1 1 1"},
            # Ten steps, then stuck at step 11 of 100.
            {"series": f"rlkube_trainer_step{JOB_SELECTOR}", "values": "1+1x10 11x80"},
            {"series": f"rlkube_trainer_total_steps{JOB_SELECTOR}", "values": "100x90"},
            # A finished job stays at its last step: no alert.
            {"series": 'rlkube_trainer_step{rljob="done",rljob_namespace="ml"}', "values": "100x90"},
            {"series": 'rlkube_trainer_total_steps{rljob="done",rljob_namespace="ml"}', "values": "100x90"},
            {"series": f"rlkube_perf_throughput{JOB_SELECTOR}", "values": "1000x90 300x60"},
            {"series": 'rlkube_perf_throughput{rljob="steady",rljob_namespace="ml"}', "values": "1000x150"},
        ],
        "alert_rule_test": [
            {"eval_time": "15m", "alertname": "RLJobFailed", "exp_alerts": []},
            {
                "eval_time": "25m",
                "alertname": "RLJobFailed",
                "exp_alerts": [
                    {
                        "exp_labels": {"severity": "critical"},
                        "exp_annotations": {
                            "summary": "An RLJob failed",
                            "description": "1 RLJobs are Failed now, more than 10 minutes ago. kubectl get rljobs -A "
                            "shows which; kubectl describe rljob NAME shows the reason.",
                        },
                    }
                ],
            },
            {"eval_time": "40m", "alertname": "RLJobFailed", "exp_alerts": []},
            {
                "eval_time": "8m",
                "alertname": "RLJobRestartsClimbing",
                "exp_alerts": [
                    {
                        "exp_labels": {"severity": "warning", "namespace": "ml"},
                        "exp_annotations": {
                            "summary": "RLJobs keep restarting",
                            "description": "3 gang restarts of RLJobs in namespace ml in the last 1h.",
                        },
                    }
                ],
            },
            {"eval_time": "20m", "alertname": "RLJobNoProgress", "exp_alerts": []},
            {
                "eval_time": "60m",
                "alertname": "RLJobNoProgress",
                "exp_alerts": [
                    {
                        "exp_labels": {"severity": "warning", **JOB},
                        "exp_annotations": {
                            "summary": "An RLJob makes no progress",
                            "description": "RLJob ml/qwen has not finished a step in 30 minutes (step 11).",
                        },
                    }
                ],
            },
            {"eval_time": "80m", "alertname": "RLJobThroughputDropped", "exp_alerts": []},
            {
                "eval_time": "120m",
                "alertname": "RLJobThroughputDropped",
                "exp_alerts": [
                    {
                        "exp_labels": {"severity": "warning", **JOB},
                        "exp_annotations": {
                            "summary": "An RLJob's throughput dropped",
                            "description": "RLJob ml/qwen trains at 300 tokens/s/GPU, below 0.5 of its average over "
                            "the 1h before.",
                        },
                    }
                ],
            },
        ],
    }
]


def test_promtool_unit_tests_fire_each_alert_when_it_should(
    promtool: Path, rendered: list[Obj], tmp_path: Path
) -> None:
    rules = _rule_file(rendered, tmp_path)
    tests = tmp_path / "tests.yaml"
    tests.write_text(yaml.safe_dump({"rule_files": [rules.name], "evaluation_interval": "1m", "tests": UNIT_TESTS}))
    result = _promtool(promtool, "test", "rules", tests.name, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_the_example_values_render_every_monitoring_object(helm: Helm) -> None:
    example = CHART.parents[1] / "examples" / "helm" / "monitoring-values.yaml"
    result = helm("template", "rlkube", str(CHART), "-f", str(example))
    kinds = [doc["kind"] for doc in yaml.safe_load_all(result.stdout) if doc]
    assert {"ServiceMonitor", "PodMonitor", "PrometheusRule"} <= set(kinds)
    assert kinds.count("ConfigMap") == 1


def test_helm_lint_passes_with_dashboards_and_alerts(helm: Helm) -> None:
    args = ["lint", str(CHART), "--strict"]
    for value in MONITORING:
        args += ["--set", value]
    result = helm(*args, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    ("value", "field"),
    [
        ("alerts.throughputDrop.ratio=2", "/alerts/throughputDrop/ratio"),
        ("alerts.restarts.window=soon", "/alerts/restarts/window"),
    ],
)
def test_the_schema_refuses_a_bad_alert_setting(helm: Helm, value: str, field: str) -> None:
    result = helm("template", "rlkube", str(CHART), "--set", value, check=False)
    assert result.returncode != 0
    assert f"at '{field}'" in result.stderr, result.stderr
