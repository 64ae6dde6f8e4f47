"""The tiny RLJob on real nodes from the trainer image built here: the chart's
operator, the restricted Pod Security Standard, and its pods split across two nodes. The
two-node cluster with the imported images is the package's (`tests/e2e/conftest.py`)."""

from __future__ import annotations

import json
import os
import shutil
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from rlkube_api.names import LABEL_JOB
from rlkube_e2e import tinyjob
from rlkube_e2e.testing import Kubectl, wait_for
from tests.e2e import real_node_kit
from tests.e2e.real_node_kit import RealCluster
from tests.e2e.test_kubectl_plugin_logs import _plugin

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.e2e,
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None, reason="needs root and iproute2"),
]


STEPS = 8
# Run in the trainer container: what its process sees. Each write raises if it cannot.
PROBE = """
import json, os, pathlib, tempfile
home = pathlib.Path.home()
(home / ".cache" / "rlkube-probe").mkdir(parents=True, exist_ok=True)
(home / ".cache" / "rlkube-probe" / "written").write_text("x")
pathlib.Path(tempfile.gettempdir(), "rlkube-probe").write_text("x")
pathlib.Path("/dev/shm/rlkube-probe").write_bytes(bytes(1 << 20))
shm = os.statvfs("/dev/shm")
mounts = [line.split() for line in open("/proc/mounts")]
print(json.dumps({
    "uid": os.getuid(), "home": str(home), "shm_bytes": shm.f_blocks * shm.f_frsize,
    "shm_type": next(m[2] for m in mounts if m[1] == "/dev/shm"),
}))
"""


def _inside(kubectl: Kubectl, namespace: str, pod: str) -> dict[str, Any] | None:
    result = kubectl("-n", namespace, "exec", pod, "-c", "trainer", "--", "python3", "-c", PROBE, check=False)
    if result.returncode != 0:
        assert "Permission denied" not in result.stderr and "Read-only" not in result.stderr, result.stderr
        return None
    return dict(json.loads(result.stdout))


def test_the_chart_and_the_tiny_job_run_from_their_images_under_the_restricted_standard(
    real_cluster: RealCluster, tmp_path: Path
) -> None:
    """What a user does, on real nodes with the images built here: `helm install` (the
    operator's pods start from its image as its non-root user, pass the kubelet's probes and
    reach the API through the `kubernetes` Service with the chart's ServiceAccount), then the
    tiny RLJob, whose pods start from the trainer image in a namespace that enforces the
    restricted Pod Security Standard. The controller and the rollout pod run on one node and
    the actors on the other, so Ray's, torch.distributed's and the weight sync's connections
    cross between the nodes; the job trains to Succeeded. Inside a trainer container meanwhile:
    the image's non-root user with writable caches and a memory-backed /dev/shm. Once it has
    succeeded, every pod of it is gone within seconds with no container run again, and
    `kubectl rlkube logs` and `curves` read the finished job's log and metrics from its volume."""
    trainer, kubeconfig = real_cluster.images["trainer-cpu"], real_cluster.cluster.kubeconfig
    namespace = "tiny-restricted"
    with real_node_kit.restricted_operator(real_cluster, namespace) as kubectl:
        workdir = tmp_path / "work"
        job = tinyjob.prepare(workdir, name="tiny-real", steps=STEPS, save_freq=2, pool="real")
        tinyjob.from_image(job, trainer.ref)
        spec = job.manifest["spec"]
        tinyjob.claim_workdir(kubectl, namespace, job)
        apart = {"controller": 1, "rollout": 1, "actor": 0}
        spec["controller"]["pool"] = {"nodeSelector": {"test/index": str(apart["controller"])}}
        for role, settings in spec["roles"].items():
            settings["pool"] = {"nodeSelector": {"test/index": str(apart[role])}}
        tinyjob.apply(kubectl, namespace, job)
        seen = wait_for(lambda: _inside(kubectl, namespace, f"{job.name}-actor-0"), "an exec into actor-0", 600)
        # The image's non-root user, a home of its own for the caches (Hugging Face, vLLM,
        # torch), a writable /tmp (Ray's session folder), and the memory-backed /dev/shm the
        # operator mounts: the node's memory, not a runtime's 64 MB default, which breaks NCCL.
        assert seen["uid"] == tinyjob.TRAINER_UID and seen["home"] == "/home/rlkube", seen
        assert seen["shm_bytes"] >= 1024**3 and seen["shm_type"] == "tmpfs", seen
        final = tinyjob.wait_state(kubectl, namespace, job.name, ("Succeeded", "Failed"), 600)
        assert final["state"] == "Succeeded", final
        assert final["progress"]["step"] == STEPS
        assert len(job.metrics()) == STEPS
        assert final.get("restartCount", 0) == 0
        # A finished job lets go at once: no container of it runs again (the driver idles
        # rather than exit, which the kubelet would restart) and every pod is gone within
        # seconds, not the job's grace period (120 s).
        seen = _pods_until_gone(kubectl, namespace, job.name, final["completionTime"], FINISHED_WITHIN)
        restarted = {
            f"{p['metadata']['name']}/{c['name']}": c["restartCount"]
            for p in seen
            for c in p["status"].get("containerStatuses") or []
            if c.get("restartCount")
        }
        assert not restarted, f"containers restarted after the job succeeded: {restarted}"
        # Its log and curves stay readable from its volume.
        log = _plugin(kubeconfig, "-n", namespace, "logs", job.name)
        assert log.returncode == 0 and f"step {STEPS} " in log.stdout, log.stderr
        png = tmp_path / "curves.png"
        curves = _plugin(kubeconfig, "-n", namespace, "curves", job.name, "-o", str(png))
        assert curves.returncode == 0, curves.stderr
        assert f"{STEPS} steps, 1 to {STEPS}" in curves.stdout
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        role = _plugin(kubeconfig, "-n", namespace, "logs", job.name, "--role", "actor")
        assert role.returncode == 1 and role.stderr.count("error") == 1 and "is Succeeded" in role.stderr


# After a job's end (its completionTime), every pod of it is gone within this many seconds.
FINISHED_WITHIN = 15.0


def _pods_until_gone(kubectl: Kubectl, namespace: str, job: str, completed: str, within: float) -> list[dict[str, Any]]:
    """Every observation of the job's pods from now until none is left (polled 4 times a second);
    fails if any is still there `within` seconds after `completed` (whole seconds, so the bound
    is kept with up to a second to spare)."""
    deadline = datetime.fromisoformat(completed.replace("Z", "+00:00")).timestamp() + within
    seen: list[dict[str, Any]] = []
    while True:
        pods = json.loads(kubectl("-n", namespace, "get", "pods", "-l", f"{LABEL_JOB}={job}", "-o", "json").stdout)
        seen += pods["items"]
        if not pods["items"]:
            return seen
        left = {
            p["metadata"]["name"]: (
                p["metadata"].get("deletionTimestamp"),
                p["metadata"].get("deletionGracePeriodSeconds"),
                [c.get("state") for c in p["status"].get("containerStatuses") or []],
            )
            for p in pods["items"]
        }
        assert time.time() < deadline, f"pods still there {within:.0f}s after the job ended: {left}"
        time.sleep(0.25)
