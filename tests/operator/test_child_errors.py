"""A refused child traced back to its RLJob field (child_errors.py)."""

from __future__ import annotations

import pytest

from rlkube_operator.child_errors import describe, rljob_field
from tests.operator.helpers import CPU, load_job, set_path

JOB = load_job(
    CPU,
    set_path("spec.checkpoint.volume", {"persistentVolumeClaim": {"claimName": "ckpt"}}),
)
PREFIX = 'StatefulSet.apps "tiny-cpu-actor" is invalid: '


@pytest.mark.parametrize(
    ("name", "message", "field"),
    [
        ("tiny-cpu-actor", "spec.template.spec.volumes[3].hostPath.path: Required value", "spec.volumes[0] (work)"),
        ("tiny-cpu-actor", "spec.template.spec.volumes[2].persistentVolumeClaim: x", "spec.checkpoint.volume"),
        (
            "tiny-cpu-actor",
            "spec.template.spec.containers[0].resources.limits[cpu]: Invalid value",
            "spec.roles.actor.resources",
        ),
        (
            "tiny-cpu-controller",
            "spec.template.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution: Required",
            "spec.controller.pool.affinity",
        ),
        ("tiny-cpu-rollout", "spec.template.spec.containers[0].env[3].name: Invalid", "spec.env"),
        ("tiny-cpu-rollout", "spec.template.spec.volumes[0].emptyDir: x", None),  # the operator's own /dev/shm
        ("tiny-cpu-other", "spec.template.spec.containers[0].resources: x", None),
    ],
)
def test_the_childs_field_maps_to_the_rljobs(name: str, message: str, field: str | None) -> None:
    assert rljob_field(JOB, "StatefulSet", name, PREFIX + message) == field


def test_the_message_names_child_field_and_error() -> None:
    text = describe(JOB, {"StatefulSet/tiny-cpu-actor": PREFIX + "spec.template.spec.volumes[3].hostPath.path: x"})
    assert "no pod was started" in text
    assert "StatefulSet/tiny-cpu-actor (from RLJob field spec.volumes[0] (work)): " + PREFIX in text
    assert "no single RLJob field" in describe(JOB, {"Service/tiny-cpu-actor": "invalid"})
