"""The record a trainer container writes about its own pod as it exits non-zero
(`exit_record.py`), so that its exit code outlives a pod replaced while no operator watched:
what it holds, that it is never attempted outside a pod, and, against the real API server,
that the Role the operator makes for a job lets the pod write it to the job's exit-record
ConfigMap and nowhere else (not another job's, no Events), and that the operator reads it back
by the pod's UID."""

from __future__ import annotations

import argparse
import base64
import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml
from kubernetes.client import ApiClient

from rlkube_api.event_message import EVENT_MESSAGE_LIMIT
from rlkube_api.exit_codes import ExitCode
from rlkube_api.names import ANNOTATION_EXIT_CODE, EVENT_TRAINER_EXITED, Env
from rlkube_e2e.testing import ClusterInfo, Kubectl
from rlkube_operator.children.rbac import rbac_children
from rlkube_operator.kube import Kube
from rlkube_operator.observed import departed_pod, view_pod
from rlkube_trainer.loop import progress
from rlkube_trainer.pod import cli
from rlkube_trainer.pod.exit_record import exit_event, record_exit
from tests.operator.helpers import CPU, load_job
from tests.trainer.test_reporting import create_pod, fake_service_account_dir

POD = "tiny-cpu-actor-1"
WHEN = datetime(2026, 12, 1, 12, 0, 0, 123456, tzinfo=UTC)


def test_the_event_names_the_pod_its_exit_code_and_message() -> None:
    event = exit_event(3, "exit code 3: rank 2 of actor lost", POD, "uid-1", "ns", WHEN)
    assert event["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": POD,
        "namespace": "ns",
        "uid": "uid-1",
    }
    assert (event["type"], event["reason"], event["message"]) == (
        "Warning",
        EVENT_TRAINER_EXITED,
        "exit code 3: rank 2 of actor lost",
    )
    assert event["metadata"]["annotations"] == {ANNOTATION_EXIT_CODE: "3"}
    assert event["metadata"]["namespace"] == "ns"
    assert event["firstTimestamp"] == event["lastTimestamp"] == "2026-12-01T12:00:00Z"
    # A container restarted in place may exit again: each exit is an Event of its own.
    assert (
        event["metadata"]["name"]
        != exit_event(3, "", POD, "uid-1", "ns", WHEN.replace(microsecond=5))["metadata"]["name"]
    )


def test_a_long_message_keeps_its_start_and_end_within_the_api_servers_limit() -> None:
    message = exit_event(1, "Traceback\n" + "x" * 5000 + "\nValueError: the cause", POD, "u", "ns", WHEN)["message"]
    assert len(message.encode()) <= EVENT_MESSAGE_LIMIT
    assert message.startswith("Traceback") and message.endswith("ValueError: the cause")


@pytest.mark.parametrize("missing", [Env.POD_NAME, Env.POD_UID, Env.NAMESPACE, Env.JOB_NAME])
def test_outside_a_pod_nothing_is_posted(missing: str, tmp_path: Path) -> None:
    in_pod = {Env.POD_NAME: POD, Env.POD_UID: "u", Env.NAMESPACE: "ns", Env.JOB_NAME: "tiny-cpu"}
    env = dict(in_pod)
    del env[missing]
    assert record_exit(1, "x", env, tmp_path) is False
    # In a pod's environment but with no ServiceAccount token mounted: nothing either.
    assert record_exit(1, "x", in_pod, tmp_path) is False


def test_an_api_server_that_does_not_answer_does_not_hold_the_exit_up(tmp_path: Path) -> None:
    sa_dir = fake_service_account_dir(tmp_path, b"not a certificate", "token", "ns")
    env = {
        Env.POD_NAME: POD,
        Env.POD_UID: "u",
        Env.NAMESPACE: "ns",
        Env.JOB_NAME: "tiny-cpu",
        "KUBERNETES_SERVICE_HOST": "127.0.0.1",
        "KUBERNETES_SERVICE_PORT": "9",  # discard: nothing listens
    }
    assert record_exit(1, "x", env, sa_dir) is False


# --- against the API server ------------------------------------------------------------------


def pod_env(
    cluster: ClusterInfo, kubectl: Kubectl, namespace: str, tmp_path: Path, pod: str = POD
) -> tuple[dict[str, str], Path, str]:
    """A pod of a job as the operator sets it up (a role pod unless named): its ServiceAccount
    and the job's Role (the operator's own builder), the pod's environment and mounted token;
    and the pod's UID."""
    job = load_job(CPU, namespace=namespace)  # the cached example itself stays as other tests expect it
    for child in rbac_children(job):
        kubectl("apply", "-f", "-", input=json.dumps(child))
    create_pod(kubectl, namespace, pod)
    uid = json.loads(kubectl("get", "pod", pod, "-n", namespace, "-o", "json").stdout)["metadata"]["uid"]
    token = kubectl("create", "token", "tiny-cpu-trainer", "-n", namespace).stdout.strip()
    config = yaml.safe_load(cluster.kubeconfig.read_text())
    host, port = config["clusters"][0]["cluster"]["server"].removeprefix("https://").rsplit(":", 1)
    ca = base64.b64decode(config["clusters"][0]["cluster"]["certificate-authority-data"])
    sa_dir = fake_service_account_dir(tmp_path, ca, token, namespace)
    env = {
        "KUBERNETES_SERVICE_HOST": host,
        "KUBERNETES_SERVICE_PORT": port,
        Env.POD_NAME: pod,
        Env.POD_UID: uid,
        Env.NAMESPACE: namespace,
        Env.JOB_NAME: job.metadata.name or "",
    }
    return env, sa_dir, uid


@pytest.mark.cluster
def test_the_jobs_role_lets_a_pod_record_its_exit_and_the_operator_reads_it_back(
    cluster: ClusterInfo, kubectl: Kubectl, kube: ApiClient, namespace: str, tmp_path: Path
) -> None:
    env, sa_dir, uid = pod_env(cluster, kubectl, namespace, tmp_path)
    assert record_exit(int(ExitCode.RANK_LOST), "exit code 3: rank 2 of actor lost", env, sa_dir) is True

    records = Kube(kube).exit_records(namespace, "tiny-cpu")
    assert list(records) == [uid] and records[uid]["reason"] == EVENT_TRAINER_EXITED
    # The operator's reading of it, once the pod is replaced (a new UID under the same name).
    replacement = view_pod({"metadata": {"name": POD, "uid": "new", "labels": {"rlkube.dev/role": "actor"}}})
    departed = departed_pod(Kube(kube).pod_events(namespace, uid), {POD: replacement}, records[uid])
    assert departed is not None and departed.uid == uid
    assert departed.terminated == (int(ExitCode.RANK_LOST), "Error")
    assert departed.termination_message == "exit code 3: rank 2 of actor lost"


@pytest.mark.cluster
def test_the_cli_records_a_config_error_and_an_uncaught_one(
    cluster: ClusterInfo, kubectl: Kubectl, kube: ApiClient, namespace: str, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    env, sa_dir, uid = pod_env(cluster, kubectl, namespace, tmp_path)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(progress, "SERVICE_ACCOUNT_DIR", sa_dir)
    bad = tmp_path / "config.yaml"
    bad.write_text("model: {path: 3}\nno_such_key: 1\n")
    monkeypatch.setenv(Env.CONFIG, str(bad))

    with pytest.raises(SystemExit) as exited:
        cli.main(["driver"])
    assert exited.value.code == ExitCode.CONFIG
    first = Kube(kube).exit_records(namespace, "tiny-cpu")[uid]
    assert first["metadata"]["annotations"][ANNOTATION_EXIT_CODE] == str(int(ExitCode.CONFIG))
    assert first["message"].startswith(f"exit code {int(ExitCode.CONFIG)} (CONFIG): ")
    assert "no_such_key: Extra inputs are not permitted" in first["message"]

    def crash(args: argparse.Namespace) -> int:
        raise ValueError("the cause")

    assert cli._in_pod(crash)(argparse.Namespace()) == int(ExitCode.UNEXPECTED)

    # One record per pod: the second exit replaced the first (the latest exit counts).
    record = Kube(kube).exit_records(namespace, "tiny-cpu")[uid]
    assert record["metadata"]["annotations"][ANNOTATION_EXIT_CODE] == str(int(ExitCode.UNEXPECTED))
    assert record["message"].startswith("exit code 1 (UNEXPECTED): Traceback")
    assert record["message"].endswith("ValueError: the cause")


@pytest.mark.cluster
def test_a_jobs_pods_may_write_only_their_own_jobs_exit_records(
    cluster: ClusterInfo, kubectl: Kubectl, kube: ApiClient, namespace: str, tmp_path: Path
) -> None:
    """Two jobs in one namespace: the other job's pods can neither write this job's exit
    records nor post an Event (about any pod), and what they write for themselves stays in
    their own job's records, which this job's reading never looks at."""
    env, sa_dir, uid = pod_env(cluster, kubectl, namespace, tmp_path)
    other = load_job(CPU).model_copy(deep=True)  # the cached example stays as other tests expect it
    other.metadata.name, other.metadata.namespace = "other", namespace
    for child in rbac_children(other):
        kubectl("apply", "-f", "-", input=json.dumps(child))
    as_other = f"--as=system:serviceaccount:{namespace}:other-trainer"

    def allowed(*what: str, who: str = as_other) -> bool:
        answer = kubectl("auth", "can-i", *what, "-n", namespace, who, check=False).stdout.strip()
        return answer == "yes"

    assert allowed("patch", "configmap/other-exits")
    assert not allowed("patch", "configmap/tiny-cpu-exits")
    assert not allowed("create", "events")
    assert not allowed("create", "events", who=f"--as=system:serviceaccount:{namespace}:tiny-cpu-trainer")

    # The other job's pod, with this pod's UID and name claimed, still writes only its own records.
    token = kubectl("create", "token", "other-trainer", "-n", namespace).stdout.strip()
    (sa_dir / "token").write_text(token)
    forged = {**env, Env.JOB_NAME: "tiny-cpu"}
    assert record_exit(int(ExitCode.CONFIG), "forged", forged, sa_dir) is False  # refused: not its ConfigMap
    assert record_exit(int(ExitCode.CONFIG), "its own", {**env, Env.JOB_NAME: "other"}, sa_dir) is True
    assert Kube(kube).exit_records(namespace, "tiny-cpu") == {}
    assert list(Kube(kube).exit_records(namespace, "other")) == [uid]
