"""The operator's per-job series, for dashboards: one state series per job, moved when the
state changes and gone with the job, and its restart count."""

from __future__ import annotations

from rlkube_operator.metrics import OperatorMetrics


def series(metrics: OperatorMetrics, name: str) -> dict[tuple[str, ...], float]:
    return {
        tuple(sorted(sample.labels.items())): sample.value
        for family in metrics.registry.collect()
        for sample in family.samples
        if sample.name == name
    }


def test_a_job_has_one_state_series_that_follows_it_and_goes_with_it() -> None:
    metrics = OperatorMetrics()
    metrics.set_job("ml", "qwen", "Created", 0)
    metrics.set_job("ml", "qwen", "Running", 0, was="Created")
    metrics.set_job("ml", "other", "Running", 0)
    state = series(metrics, "rlkube_job_state")
    assert state == {
        (("namespace", "ml"), ("rljob", "qwen"), ("state", "Running")): 1.0,
        (("namespace", "ml"), ("rljob", "other"), ("state", "Running")): 1.0,
    }
    metrics.set_job("ml", "qwen", "Restarting", 1, was="Running")
    assert series(metrics, "rlkube_job_restart_count")[(("namespace", "ml"), ("rljob", "qwen"))] == 1.0
    metrics.set_job("ml", "qwen", None, 0, was="Restarting")  # deleted
    assert series(metrics, "rlkube_job_state") == {(("namespace", "ml"), ("rljob", "other"), ("state", "Running")): 1.0}
    assert (("namespace", "ml"), ("rljob", "qwen")) not in series(metrics, "rlkube_job_restart_count")
