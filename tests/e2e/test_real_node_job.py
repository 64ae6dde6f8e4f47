"""The tiny RLJob on real nodes from the trainer image built here (issue 28): the chart's
operator, the restricted Pod Security Standard, and its pods split across two nodes. The
two-node cluster with the imported images is the package's (`tests/e2e/conftest.py`)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from rlkube_e2e import tinyjob
from tests.e2e import real_node_kit
from tests.e2e.real_node_kit import RealCluster

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.e2e,
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None, reason="needs root and iproute2"),
]


def test_the_chart_and_the_tiny_job_run_from_their_images_under_the_restricted_standard(
    real_cluster: RealCluster, tmp_path: Path
) -> None:
    """What a user does, on real nodes with the images built here: `helm install` (the
    operator's pods start from its image as its non-root user, pass the kubelet's probes and
    reach the API through the `kubernetes` Service with the chart's ServiceAccount), then the
    tiny RLJob, whose pods start from the trainer image in a namespace that enforces the
    restricted Pod Security Standard. The controller and the rollout pod run on one node and
    the actors on the other, so Ray's, torch.distributed's and the weight sync's connections
    cross between the nodes; the job trains to Succeeded."""
    trainer = real_cluster.images["trainer-cpu"]
    namespace = "tiny-restricted"
    with real_node_kit.restricted_operator(real_cluster, namespace) as kubectl:
        workdir = tmp_path / "work"
        job = tinyjob.prepare(workdir, name="tiny-real", steps=4, save_freq=2, pool="real")
        tinyjob.from_image(job, trainer.ref)
        spec = job.manifest["spec"]
        tinyjob.claim_workdir(kubectl, namespace, job)
        apart = {"controller": 1, "rollout": 1, "actor": 0}
        spec["controller"]["pool"] = {"nodeSelector": {"test/index": str(apart["controller"])}}
        for role, settings in spec["roles"].items():
            settings["pool"] = {"nodeSelector": {"test/index": str(apart[role])}}
        tinyjob.apply(kubectl, namespace, job)
        final = tinyjob.wait_state(kubectl, namespace, job.name, ("Succeeded", "Failed"), 600)
        assert final["state"] == "Succeeded", final
        assert final["progress"]["step"] == 4
        assert len(job.metrics()) == 4
        assert final.get("restartCount", 0) == 0
