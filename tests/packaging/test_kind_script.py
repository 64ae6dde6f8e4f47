"""e2e/kind.sh, which needs Docker and so cannot run here: shellcheck and `bash -n`
on it, and a run against stand-ins for docker, kind, kubectl and helm that record
what they were asked, to check the order of the steps and their arguments."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from tests.packaging.tools import tool

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "e2e" / "kind.sh"
EXAMPLE = REPO / "examples" / "tiny-cpu.yaml"

# One stand-in for all four tools: logs `<tool> <args>` (one line per call), keeps
# what was piped into `docker build -` and `kubectl apply -f -`, and answers the
# few questions the script asks. STUB_STATE=Failed makes the job fail.
STUB = r"""#!/usr/bin/env bash
set -euo pipefail
tool=$(basename "$0")
echo "$tool $*" >> "$STUB_DIR/calls"
args=" $* "
if [[ $tool == docker && $args == *" build "* && $args == *" - "* ]]; then
  cat > "$STUB_DIR/docker-build-stdin"
fi
if [[ $tool == kubectl && $args == *" apply "* && $args == *" -f - "* ]]; then
  n=$(find "$STUB_DIR" -name 'applied-*' | wc -l)
  cat > "$STUB_DIR/applied-$n"
fi
case "$tool $args" in
  "kind  get clusters "*) exit 0 ;;
  *" get crd "*) exit 1 ;;
  *" wait rljob/"*) [[ ${STUB_STATE:-Succeeded} == Succeeded ]] ;;
  *" get rljob "*"jsonpath"*) echo "${STUB_STATE:-Succeeded}" ;;
esac
"""


def test_shellcheck_finds_nothing() -> None:
    result = subprocess.run(
        [tool("shellcheck"), "--severity=style", str(SCRIPT)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_bash_parses_it() -> None:
    result = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr


def test_it_is_executable() -> None:
    assert SCRIPT.stat().st_mode & stat.S_IXUSR


def _run(tmp_path: Path, state: str) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    stub = tmp_path / "stub"
    stub.write_text(STUB)
    stub.chmod(0o755)
    tools = {}
    for name in ("docker", "kind", "kubectl", "helm"):
        (tmp_path / name).symlink_to(stub)
        tools[name.upper()] = str(tmp_path / name)
    env = {
        **os.environ,
        **tools,
        "STUB_DIR": str(tmp_path),
        "STUB_STATE": state,
        "RLKUBE_KIND_CLUSTER": "ci",
        "RLKUBE_JOB_NAMESPACE": "jobs",
    }
    result = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, check=False, timeout=60)
    calls = (tmp_path / "calls").read_text().splitlines() if (tmp_path / "calls").exists() else []
    return result, calls


def _index(calls: list[str], start: str) -> int:
    found = [i for i, call in enumerate(calls) if call.startswith(start)]
    assert found, f"no call starting with {start!r} in:\n" + "\n".join(calls)
    return found[0]


def test_the_steps_run_in_order_with_the_built_images(tmp_path: Path) -> None:
    result, calls = _run(tmp_path, "Succeeded")
    assert result.returncode == 0, result.stdout + result.stderr
    kubectl = "kubectl --context kind-ci"
    order = [
        _index(calls, "kind create cluster --name ci"),
        _index(calls, "docker build -f Dockerfile.operator -t rlkube-operator:dev ."),
        _index(calls, "docker build -f Dockerfile.trainer --target cpu -t rlkube-trainer:dev ."),
        _index(calls, "kind load docker-image --name ci rlkube-operator:dev rlkube-trainer:dev"),
        _index(calls, "helm upgrade --install rlkube charts/rlkube"),
        _index(calls, f"{kubectl} -n jobs wait pod/tiny-task-init"),
        _index(calls, f"{kubectl} -n jobs create configmap tiny-reward"),
        _index(calls, f"{kubectl} -n jobs wait rljob/tiny-cpu --for=jsonpath={{.status.state}}=Succeeded"),
    ]
    assert order == sorted(order)
    helm = calls[_index(calls, "helm upgrade")]
    for part in ("--kube-context kind-ci", "--set image.repository=rlkube-operator", "--set image.tag=dev"):
        assert part in helm
    configmap = calls[_index(calls, f"{kubectl} -n jobs create configmap")]
    assert "--from-file=reward.py=examples/rewards/tiny_task.py" in configmap
    assert "RLJob tiny-cpu succeeded" in result.stdout


def test_the_job_is_the_example_with_the_image_built(tmp_path: Path) -> None:
    result, _ = _run(tmp_path, "Succeeded")
    assert result.returncode == 0, result.stdout + result.stderr
    example = yaml.safe_load(EXAMPLE.read_text())
    [job] = [doc for doc in _applied(tmp_path) if doc.get("kind") == "RLJob"]
    assert job == {**example, "spec": {**example["spec"], "image": "rlkube-trainer:dev"}}


def test_the_model_step_writes_where_the_example_reads(tmp_path: Path) -> None:
    result, _ = _run(tmp_path, "Succeeded")
    assert result.returncode == 0, result.stdout + result.stderr
    spec = yaml.safe_load(EXAMPLE.read_text())["spec"]
    [pod] = [doc for doc in _applied(tmp_path) if doc.get("kind") == "Pod"]
    # The same node directory at the same path as the job's volume.
    [volume] = spec["volumes"]
    assert pod["spec"]["volumes"] == [{"name": "work", **volume["source"]}]
    mounts = [m for c in pod["spec"]["initContainers"] + pod["spec"]["containers"] for m in c["volumeMounts"]]
    assert {m["mountPath"] for m in mounts} == {volume["mountPath"]}
    [writer] = pod["spec"]["containers"]
    assert writer["image"] == "rlkube-trainer:dev"
    script = writer["command"][-1]
    _run_the_writer_for_real(script, volume["mountPath"], spec, tmp_path / "node-dir")
    # The pod writes as the trainer image's user, so the job can write checkpoints beside them.
    from tests.packaging.dockerfile import read_stages  # noqa: PLC0415

    [cpu] = [stage for stage in read_stages(REPO / "Dockerfile.trainer") if stage.name == "cpu"]
    uid = int((cpu.user or "").split(":")[0])
    assert writer["securityContext"]["runAsUser"] == uid


def _run_the_writer_for_real(script: str, mount_path: str, spec: dict[str, Any], node_dir: Path) -> None:
    """Runs the pod's script with the project's Python, the mount moved to `node_dir`, and checks
    that every model and data path the example reads is there afterwards."""
    local = script.replace(mount_path, str(node_dir))
    result = subprocess.run([sys.executable, "-c", local], capture_output=True, text=True, check=False, timeout=300)
    assert result.returncode == 0, result.stderr
    read = [spec["model"]["path"], *spec["data"]["trainFiles"], *spec["data"].get("valFiles", [])]
    assert read, "the example reads no files?"
    for path in read:
        assert path.startswith(mount_path + "/"), f"{path} is not on the job's volume"
        local_path = node_dir / path.removeprefix(mount_path + "/")
        assert local_path.exists(), f"the init step wrote no {path}"
    assert (node_dir / spec["model"]["path"].removeprefix(mount_path + "/") / "config.json").is_file()


def _applied(tmp_path: Path) -> list[dict[str, Any]]:
    docs = [yaml.safe_load(p.read_text()) for p in sorted(tmp_path.glob("applied-*"))]
    return [d for d in docs if isinstance(d, dict)]


def test_a_failed_job_ends_the_wait_with_an_error(tmp_path: Path) -> None:
    result, calls = _run(tmp_path, "Failed")
    assert result.returncode != 0
    assert "error: RLJob tiny-cpu failed" in result.stderr
    assert sum(call.startswith("kubectl --context kind-ci -n jobs wait rljob/") for call in calls) == 1


def test_delete_removes_the_cluster(tmp_path: Path) -> None:
    stub = tmp_path / "kind"
    stub.write_text(STUB)
    stub.chmod(0o755)
    env = {**os.environ, "KIND": str(stub), "STUB_DIR": str(tmp_path), "RLKUBE_KIND_CLUSTER": "ci"}
    result = subprocess.run(["bash", str(SCRIPT), "delete"], env=env, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "calls").read_text().splitlines() == ["kind delete cluster --name ci"]
