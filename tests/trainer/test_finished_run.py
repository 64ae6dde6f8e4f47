"""The driver's end of a successful run in a pod (`finished_run.py`): it records the run on its
own pod and idles until SIGTERM, which it answers with exit 0; where it cannot record it, it
exits as before. Against the real API server: the job's Role lets the controller pod write the
annotation, and the operator reads it as the driver's success."""

from __future__ import annotations

import json
import os
import signal
from datetime import UTC, datetime
from pathlib import Path

import pytest

from rlkube_api.names import ANNOTATION_RUN_FINISHED, Env
from rlkube_e2e.testing import ClusterInfo, Kubectl
from rlkube_operator.observed import view_pod
from rlkube_trainer.pod.finished_run import idle_until_stopped, record_finished
from tests.trainer.test_exit_record import pod_env
from tests.trainer.test_reporting import fake_service_account_dir

DRIVER = "tiny-cpu-controller-0"


def test_outside_a_pod_nothing_is_recorded_and_the_driver_exits(tmp_path: Path) -> None:
    assert record_finished({Env.NAMESPACE: "ns"}, tmp_path) is False
    # In a pod's environment but with no ServiceAccount token mounted: nothing either.
    assert record_finished({Env.POD_NAME: DRIVER, Env.NAMESPACE: "ns"}, tmp_path) is False


def test_an_api_server_that_does_not_answer_means_an_exit_after_a_few_tries(tmp_path: Path) -> None:
    sa_dir = fake_service_account_dir(tmp_path, b"not a certificate", "token", "ns")
    env = {
        Env.POD_NAME: DRIVER,
        Env.NAMESPACE: "ns",
        "KUBERNETES_SERVICE_HOST": "127.0.0.1",
        "KUBERNETES_SERVICE_PORT": "9",  # discard: nothing listens
    }
    waits: list[float] = []
    assert record_finished(env, sa_dir, sleep=waits.append) is False
    assert waits == [0.0, 1.0, 2.0]


def test_the_idle_driver_exits_0_on_sigterm() -> None:
    before = signal.getsignal(signal.SIGTERM)
    try:
        with pytest.raises(SystemExit) as exited:
            idle_until_stopped(pause=lambda: os.kill(os.getpid(), signal.SIGTERM))
        assert exited.value.code == 0
    finally:
        signal.signal(signal.SIGTERM, before)


@pytest.mark.cluster
def test_the_jobs_role_lets_the_driver_record_its_finished_run_and_the_operator_reads_success(
    cluster: ClusterInfo, kubectl: Kubectl, namespace: str, tmp_path: Path
) -> None:
    env, sa_dir, _ = pod_env(cluster, kubectl, namespace, tmp_path, DRIVER)
    when = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
    assert record_finished(env, sa_dir, now=when) is True
    pod = json.loads(kubectl("get", "pod", DRIVER, "-n", namespace, "-o", "json").stdout)
    assert pod["metadata"]["annotations"][ANNOTATION_RUN_FINISHED] == "2026-12-01T12:00:00Z"
    view = view_pod(pod)
    assert view.succeeded and view.run_finished and not view.failed
