"""The tiny RLJob on real nodes from the trainer image built here: the chart's
operator, the restricted Pod Security Standard, and its pods split across two nodes. The
two-node cluster with the imported images is the package's (`tests/e2e/conftest.py`)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from rlkube_e2e import tinyjob
from rlkube_e2e.testing import Kubectl, wait_for
from tests.e2e import real_node_kit
from tests.e2e.real_node_kit import RealCluster

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
    the image's non-root user with writable caches and a memory-backed /dev/shm."""
    trainer = real_cluster.images["trainer-cpu"]
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
