"""The driver's step metrics for Prometheus: verl's names with '/' turned into '_' under
the `rlkube_` prefix, so `critic/score/mean` is `rlkube_critic_score_mean`."""

from __future__ import annotations

import logging
import numbers
import os
import re
import threading
from collections.abc import Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Gauge, start_http_server

from rlkube_api.names import DRIVER_METRICS_PORT, Env

log = logging.getLogger("rlkube.trainer.prometheus")

METRIC_PREFIX = "rlkube_"
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
    VAL_SCORE = "rlkube_trainer_val_score"
    # The gang attempt serving the series: after a restart the new driver's values replace the
    # old ones (steps after the last checkpoint run again, the step gauge goes back), and this
    # marks where.
    ATTEMPT = "rlkube_trainer_attempt"
    # Which RLJob a series belongs to (`job` and `namespace` are Prometheus' target labels).
    JOB_LABELS = ("rljob", "rljob_namespace")

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        env = os.environ if env is None else env
        self.job = {"rljob": env.get(Env.JOB_NAME, ""), "rljob_namespace": env.get(Env.NAMESPACE, "")}
        self.registry = CollectorRegistry()
        self._step = self._new_gauge(self.STEP, "Last completed training step.")
        self._total_steps = self._new_gauge(self.TOTAL_STEPS, "Training steps in the run.")
        attempt = env.get(Env.ATTEMPT, "")
        self._attempt = self._new_gauge(self.ATTEMPT, "The gang attempt (RLJob restartCount) of this driver.")
        self._attempt.set(int(attempt) if attempt.isdigit() else 0)
        self._val_score = self._new_gauge(
            self.VAL_SCORE, "The latest validation score (status.progress.valScore: val-core mean@N over data sources)."
        )
        self._gauges: dict[str, Gauge] = {}  # metric name -> gauge
        # Prometheus name -> metric name, to catch two names that map to one series.
        self._owners: dict[str, str] = {self.STEP: "", self.TOTAL_STEPS: "", self.VAL_SCORE: "", self.ATTEMPT: ""}
        self._skipped: set[str] = set()  # names refused for a clash: warned about once
        self._lock = threading.Lock()
        self._server: Any = None

    def update(
        self, step: int, metrics: Mapping[str, Any], total_steps: int | None = None, val_score: float | None = None
    ) -> None:
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
            if val_score is not None:
                self._val_score.set(val_score)

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
        gauge = self._new_gauge(prom, f"verl metric {name}")
        self._owners[prom] = name
        self._gauges[name] = gauge
        return gauge

    def _new_gauge(self, name: str, documentation: str) -> Gauge:
        """A gauge of this job's one series (the job's labels already set)."""
        gauge: Gauge = Gauge(name, documentation, self.JOB_LABELS, registry=self.registry).labels(**self.job)
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
