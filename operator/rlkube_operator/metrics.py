"""Operator metrics in the KubeRay style, served with prometheus-client."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from rlkube_api.conditions import State


@dataclass
class OperatorMetrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        self.jobs = Gauge("rlkube_jobs", "RLJobs by state, from what the operator watches", ["state"], registry=r)
        self.reconciles = Counter("rlkube_reconcile", "Reconcile passes", ["namespace"], registry=r)
        self.reconcile_errors = Counter(
            "rlkube_reconcile_errors", "Reconcile passes that raised", ["namespace"], registry=r
        )
        self.reconcile_duration = Histogram(
            "rlkube_reconcile_duration_seconds",
            "Duration of one reconcile pass",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=r,
        )
        self.restarts = Counter("rlkube_job_restarts", "Gang restarts", ["namespace"], registry=r)
        # Per job, for dashboards: 1 on the series of the job's current state.
        self.job_state = Gauge(
            "rlkube_job_state", "1 for each RLJob's current state", ["namespace", "rljob", "state"], registry=r
        )
        self.job_restart_count = Gauge(
            "rlkube_job_restart_count",
            "Gang restarts of each RLJob (status.restartCount)",
            ["namespace", "rljob"],
            registry=r,
        )
        self.time_to_running = Histogram(
            "rlkube_job_time_to_running_seconds",
            "From RLJob creation to all pods ready",
            buckets=(1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600),
            registry=r,
        )

    def set_job_states(self, states: list[str]) -> None:
        for state in State:
            self.jobs.labels(state=state).set(sum(1 for s in states if s == state))

    def set_job(self, namespace: str, name: str, state: str | None, restarts: int, was: str | None = None) -> None:
        """One job's state (its previous one's series removed) and restart count; a job
        without a state (deleted) loses its series."""
        if was is not None and was != state:
            with contextlib.suppress(KeyError):
                self.job_state.remove(namespace, name, was)
        if state is None:
            with contextlib.suppress(KeyError):
                self.job_restart_count.remove(namespace, name)
            return
        self.job_state.labels(namespace=namespace, rljob=name, state=state).set(1)
        self.job_restart_count.labels(namespace=namespace, rljob=name).set(restarts)


METRICS = OperatorMetrics()
