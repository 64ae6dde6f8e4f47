"""The operator's Prometheus metrics (read in-process from its registry) follow
what happens to a job on the cluster."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest

from rlkube_e2e.testing import wait_for
from rlkube_operator.metrics import METRICS
from tests.operator.cluster_kit import TINY_PODS, Jobs, tiny_job

pytestmark = pytest.mark.cluster

JOB = "tiny"


def sample(name: str, **labels: str) -> float:
    return METRICS.registry.get_sample_value(name, labels) or 0.0


def test_metrics_follow_the_job(jobs: Jobs) -> None:
    ns = jobs.namespace
    assert sample("rlkube_reconcile_total", namespace=ns) == 0
    assert sample("rlkube_job_restarts_total", namespace=ns) == 0

    jobs.create(tiny_job(JOB, ns))
    jobs.wait_running(JOB)
    jobs.wait_pods(JOB, TINY_PODS)
    wait_for(lambda: sample("rlkube_jobs", state="Running") >= 1, 'rlkube_jobs{state="Running"} >= 1', 10)
    passes = sample("rlkube_reconcile_total", namespace=ns)
    assert passes >= 1
    assert sample("rlkube_reconcile_errors_total", namespace=ns) == 0
    assert sample("rlkube_job_time_to_running_seconds_count") >= 1

    jobs.fail_pod(f"{JOB}-actor-0")
    wait_for(lambda: sample("rlkube_job_restarts_total", namespace=ns) == 1, "rlkube_job_restarts_total 1", 20)
    jobs.wait_running(JOB, restarts=1)
    assert sample("rlkube_reconcile_total", namespace=ns) > passes
    assert sample("rlkube_job_restarts_total", namespace=ns) == 1

    text = generate_latest(METRICS.registry).decode()
    assert f'rlkube_job_restarts_total{{namespace="{ns}"}} 1.0' in text
    assert 'rlkube_jobs{state="Running"}' in text
    assert f'rlkube_reconcile_total{{namespace="{ns}"}}' in text
