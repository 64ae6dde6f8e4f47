"""`kubectl rlkube` (rlkube_operator/kubectl_plugin.py): the pure formatting and parsing,
then the plugin run by the real kubectl (as `kubectl rlkube ...`, found on PATH) against
the local cluster with the operator running: status, suspend and resume, and the
printer columns `kubectl get` rounds."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlkube_api.names import LABEL_JOB
from rlkube_api.step_rows import parse_step_lines, plot_curves, step_line
from rlkube_operator.kubectl_plugin import (
    PluginError,
    format_status,
    kubectl_message,
    metrics_rows,
    pod_name,
    reader_pod,
    tail,
)
from tests.operator.cluster_kit import TINY_PODS, Jobs, tiny_job
from tests.operator.helpers import CPU, NAMESPACE, example, set_path

JOB = "plug"
LOG = """\
2026-12-01 10:00:00,000 INFO rlkube.trainer: driver starting
2026-12-01 10:00:01,000 INFO rlkube.trainer: step 1 critic/score/mean=0.25 actor/pg_loss=-0.1 actor/ppo_kl=0.001 response_length/mean=2
2026-12-01 10:00:02,000 INFO rlkube.trainer: step 2 critic/score/mean=0.5 actor/ppo_kl=0.002 response_length/mean=2
2026-12-01 10:00:03,000 INFO rlkube.trainer: step 2 critic/score/mean=0.625 actor/ppo_kl=0.002 response_length/mean=2
"""


def test_step_lines_become_metric_rows_the_latest_run_winning() -> None:
    rows = parse_step_lines(LOG)
    assert [r["step"] for r in rows] == [1, 2]
    assert rows[0] == {
        "step": 1,
        "critic/score/mean": 0.25,
        "actor/pg_loss": -0.1,
        "actor/ppo_kl": 0.001,
        "response_length/mean": 2,
    }
    assert rows[1]["critic/score/mean"] == 0.625, "a restarted driver's repeated step replaces the earlier one"
    assert parse_step_lines("no steps here\nstep nothing") == []


def test_the_drivers_console_line_reads_back_as_its_row() -> None:
    metrics = {"critic/score/mean": 0.625, "actor/ppo_kl": 0.0015, "val-core/tiny/acc/mean@1": 0.75, "other": 3.0}
    (row,) = parse_step_lines("INFO rlkube.trainer: " + step_line(7, metrics))
    assert row == {"step": 7, "critic/score/mean": 0.625, "actor/ppo_kl": 0.0015, "val-core/tiny/acc/mean@1": 0.75}


def test_the_curves_are_drawn_from_log_rows(tmp_path: Path) -> None:
    png = tmp_path / "curves"
    assert plot_curves(parse_step_lines(LOG), png)
    assert png.read_bytes().startswith(b"\x89PNG")


def test_kubectls_error_is_said_once_in_one_line() -> None:
    logs = 'error: error from server (NotFound): pods "tiny-cpu-controller-0" not found\n'
    assert kubectl_message(logs) == 'pods "tiny-cpu-controller-0" not found'
    get = 'Warning: a deprecation\nError from server (NotFound): rljobs.rlkube.dev "nope" not found\n'
    assert kubectl_message(get) == 'rljobs.rlkube.dev "nope" not found'
    assert kubectl_message('error: the server doesn\'t have a resource type "rljobs"') == (
        'the server doesn\'t have a resource type "rljobs"'
    )


def test_metrics_rows_keep_each_steps_latest_row_and_skip_a_cut_line() -> None:
    text = '{"step": 1, "critic/score/mean": 0.25, "note": "x"}\n{"step": 2, "critic/score/mean": 0.5}\n'
    text += '{"step": 2, "critic/score/mean": 0.75}\n{"step": 3, "crit'
    assert metrics_rows(text) == [{"step": 1, "critic/score/mean": 0.25}, {"step": 2, "critic/score/mean": 0.75}]


def test_tail_counts_lines_as_kubectl_logs_does() -> None:
    text = "a\nb\nc\n"
    assert (tail(text, None), tail(text, -1), tail(text, 2), tail(text, 0), tail(text, 9)) == (
        text,
        text,
        "b\nc\n",
        "",
        text,
    )


def test_the_reader_pod_mounts_the_volume_holding_checkpoint_dir_read_only_under_the_restricted_standard() -> None:
    job = example(CPU)
    job["metadata"]["namespace"] = NAMESPACE
    set_path("spec.controller.pool", {"nodeSelector": {"pool": "cpu"}})(job)
    pod = reader_pod(job, "tiny-cpu-reader-1", "metrics.jsonl")
    spec = pod["spec"]
    (container,) = spec["containers"]
    assert container["command"] == ["cat", "/rlkube/checkpoints/tiny-cpu/metrics.jsonl"]
    assert container["image"] == job["spec"]["image"]
    assert spec["volumes"] == [
        {"name": "work", "hostPath": {"path": "/var/tmp/rlkube-demo", "type": "DirectoryOrCreate"}}
    ]
    assert container["volumeMounts"] == [{"name": "work", "mountPath": "/rlkube", "readOnly": True}]
    assert spec["restartPolicy"] == "Never" and spec["nodeSelector"] == {"pool": "cpu"}
    # What the restricted Pod Security Standard asks of every container.
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    # Not one of the job's pods: the operator must not count it.
    assert LABEL_JOB not in (pod["metadata"].get("labels") or {})
    assert pod["metadata"] == {"name": "tiny-cpu-reader-1", "namespace": NAMESPACE}


def test_a_checkpoint_dir_on_no_volume_is_one_error_naming_it() -> None:
    job = example(CPU)
    set_path("spec.checkpoint.dir", "/elsewhere/ckpt")(job)
    with pytest.raises(PluginError, match=r"checkpoint.dir /elsewhere/ckpt is on none of its volumes"):
        reader_pod(job, "r", "metrics.jsonl")


def test_the_plugin_runs_without_the_trainer_package() -> None:
    """kubectl plugins run on a user's machine, where the trainer (torch, vLLM) is not installed:
    no module of the operator's package imports the trainer's, not even inside a function."""
    package = Path(__file__).parents[2] / "operator" / "rlkube_operator"
    importers = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            names += [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            importers += [f"{path.name}: {n}" for n in names if n.split(".")[0] == "rlkube_trainer"]
    assert importers == []


def test_status_is_rounded_with_percent_done() -> None:
    job = {
        "metadata": {"name": "qwen", "namespace": "ml"},
        "spec": {"suspend": False},
        "status": {
            "state": "Running",
            "restartCount": 1,
            "progress": {
                "step": 120,
                "totalSteps": 500,
                "rewardMean": 0.612345,
                "tokensPerSecondPerGPU": 5554.641976871484,
            },
            "roles": {"actor": {"replicas": 2, "ready": 2}},
            "conditions": [
                {
                    "type": "Running",
                    "status": "True",
                    "reason": "AllPodsReady",
                    "message": "",
                    "lastTransitionTime": "x",
                }
            ],
        },
    }
    text = format_status(job)
    assert "RLJob ml/qwen" in text
    assert "120 / 500 (24.0%)" in text
    assert "0.6123" in text and "5,554.6" in text and "5554.64" not in text
    assert "restarts:     1" in text
    assert "actor 2/2 ready" in text
    assert "Running  True   AllPodsReady" in text


def test_pod_names_follow_the_statefulsets() -> None:
    assert pod_name("qwen", "controller", 0) == "qwen-controller-0"
    assert pod_name("qwen", "rollout", 3) == "qwen-rollout-3"


def _kubectl_rlkube(kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`kubectl rlkube ...` as a user runs it: kubectl finds kubectl-rlkube on PATH."""
    bin_dir = Path(sys.executable).parent
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "KUBECTL": str(bin_dir / "kubectl"),
    }
    command = [str(bin_dir / "kubectl"), "rlkube", f"--kubeconfig={kubeconfig}", *args]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=60, check=False)


@pytest.mark.cluster
def test_status_suspend_resume_and_rounded_columns(jobs: Jobs) -> None:
    kubeconfig = jobs.kubectl.kubeconfig
    ns = jobs.namespace
    jobs.create(tiny_job(JOB, ns))
    jobs.wait_running(JOB)
    jobs.report_progress(
        JOB, {"step": 3, "totalSteps": 60, "rewardMean": 0.612345678, "tokensPerSecondPerGPU": 5554.641976871484}
    )
    jobs.wait(JOB, lambda j: (j["status"].get("progress") or {}).get("step") == 3, "progress step 3")

    # kubectl get rounds because the status holds rounded numbers.
    wide = jobs.kubectl("get", "rljobs", JOB, "-n", ns, "-o", "wide").stdout
    assert "5554.6" in wide and "5554.64" not in wide, wide
    assert "0.6123" in wide and "0.61234" not in wide, wide

    status = _kubectl_rlkube(kubeconfig, "-n", ns, "status", JOB)
    assert status.returncode == 0, status.stderr
    assert f"RLJob {ns}/{JOB}" in status.stdout
    assert "state:        Running" in status.stdout
    assert "3 / 60 (5.0%)" in status.stdout

    suspended = _kubectl_rlkube(kubeconfig, "-n", ns, "suspend", JOB)
    assert suspended.returncode == 0, suspended.stderr
    assert jobs.get(JOB)["spec"]["suspend"] is True
    jobs.wait_state(JOB, "Suspended")
    jobs.wait_no_pods(JOB)
    assert "(suspended)" in _kubectl_rlkube(kubeconfig, "-n", ns, "status", JOB).stdout

    resumed = _kubectl_rlkube(kubeconfig, "-n", ns, "resume", JOB)
    assert resumed.returncode == 0, resumed.stderr
    assert jobs.get(JOB)["spec"]["suspend"] is False
    jobs.wait_pods(JOB, TINY_PODS)
    jobs.wait_running(JOB)


@pytest.mark.cluster
def test_a_missing_job_or_pod_is_one_line_naming_it(jobs: Jobs) -> None:
    kubeconfig = jobs.kubectl.kubeconfig
    missing = _kubectl_rlkube(kubeconfig, "-n", jobs.namespace, "status", "nope")
    assert missing.returncode == 1
    assert missing.stderr.startswith("error: ") and '"nope" not found' in missing.stderr
    for command in (["curves", "nope", "-o", "/dev/null"], ["logs", "nope"]):
        result = _kubectl_rlkube(kubeconfig, "-n", jobs.namespace, *command)
        assert result.returncode == 1
        assert result.stderr.startswith("error: ") and '"nope" not found' in result.stderr, result.stderr
        assert "error: error" not in result.stderr.lower(), result.stderr
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
