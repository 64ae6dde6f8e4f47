"""Pod template overrides merged onto the operator's pods: the job's template, then the
role's, then onto what the operator built (rules in rlkube_api/pod_template.py). Pure."""

from __future__ import annotations

from typing import Any

import pytest

from rlkube_api.names import ANNOTATION_ATTEMPT, LABEL_JOB, LABEL_ROLE, Env
from rlkube_api.rljob import RLJob
from rlkube_operator.children.statefulset import NCCL_DEFAULTS
from tests.operator.helpers import GPU, Obj, children_of, load_job, set_path

SECRET_ENV = {"name": "WANDB_API_KEY", "valueFrom": {"secretKeyRef": {"name": "wandb", "key": "api-key"}}}
JOB_TEMPLATE: Obj = {
    "labels": {"team": "rl", "cost-center": "42"},
    "annotations": {"example.com/owner": "rl-team"},
    "env": [
        SECRET_ENV,
        {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "NCCL_DEBUG", "value": "INFO"},
    ],
    "resources": {"requests": {"rdma/ib": "1"}, "limits": {"rdma/ib": "1"}},
    "imagePullSecrets": [{"name": "extra-registry"}],
    "podSecurityContext": {"runAsUser": 1000, "fsGroup": 1000},
    "securityContext": {"allowPrivilegeEscalation": False},
    "volumes": [{"name": "cache", "emptyDir": {}}],
    "volumeMounts": [{"name": "cache", "mountPath": "/cache"}],
    "initContainers": [{"name": "warm-cache", "image": "busybox", "command": ["true"]}],
    "sidecars": [{"name": "log-shipper", "image": "fluent-bit:3"}],
    "topologySpreadConstraints": [
        {"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "ScheduleAnyway"}
    ],
    "schedulingGates": [{"name": "example.com/quota"}],
    "priorityClassName": "batch",
}
ACTOR_TEMPLATE: Obj = {
    "labels": {"team": "actor-team"},
    "env": [{"name": "NCCL_DEBUG", "value": "TRACE"}],
    "resources": {"limits": {"vpc.amazonaws.com/efa": "4"}},
    "securityContext": {"capabilities": {"add": ["IPC_LOCK"]}},
    "sidecars": [{"name": "log-shipper", "image": "fluent-bit:4"}],
    "serviceAccountName": "actor-sa",
    "priorityClassName": "high",
}


def statefulsets(job: RLJob) -> list[Obj]:
    return [c for c in children_of(job) if c["kind"] == "StatefulSet"]


def _sets(**templates: Obj) -> dict[str, Obj]:
    """role -> the StatefulSet's pod template, for the GPU example with `templates`
    (`job`, `actor`, `controller`, `rollout`)."""
    paths = {
        "job": "spec.podTemplate",
        "actor": "spec.roles.actor.podTemplate",
        "rollout": "spec.roles.rollout.podTemplate",
        "controller": "spec.controller.podTemplate",
    }
    job = load_job(GPU, *(set_path(paths[k], v) for k, v in templates.items()))
    return {s["metadata"]["labels"][LABEL_ROLE]: s["spec"]["template"] for s in statefulsets(job)}


def _trainer(template: Obj) -> Obj:
    container: Obj = template["spec"]["containers"][0]
    assert container["name"] == "trainer"
    return container


def _env(template: Obj) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in _trainer(template)["env"]}


def test_without_templates_the_pods_are_unchanged() -> None:
    plain = _sets()
    assert _sets(job={}) == plain


def test_the_job_template_reaches_every_role() -> None:
    for role, template in _sets(job=JOB_TEMPLATE).items():
        meta, pod, trainer = template["metadata"], template["spec"], _trainer(template)
        assert meta["labels"]["team"] == "rl", role
        assert meta["labels"][LABEL_JOB] == "qwen-gsm8k-grpo", role
        assert meta["annotations"]["example.com/owner"] == "rl-team"
        assert ANNOTATION_ATTEMPT in meta["annotations"]
        env = _env(template)
        assert env["WANDB_API_KEY"] == SECRET_ENV["valueFrom"]
        assert env["NODE"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
        assert env["NCCL_DEBUG"] == "INFO", "the override replaces rlkube's default"
        assert Env.MASTER_ADDR in env, "the operator's rendezvous stays"
        assert trainer["resources"]["limits"]["rdma/ib"] == "1"
        assert trainer["resources"]["requests"]["rdma/ib"] == "1"
        assert {"name": "extra-registry"} in pod["imagePullSecrets"]
        # Key by key over the "restricted" defaults, which stay.
        assert pod["securityContext"]["runAsUser"] == 1000 and pod["securityContext"]["fsGroup"] == 1000
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert trainer["securityContext"]["allowPrivilegeEscalation"] is False
        assert trainer["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        assert {"name": "cache", "emptyDir": {}} in pod["volumes"]
        assert {"shm", "config"} <= {v["name"] for v in pod["volumes"]}
        assert {"name": "cache", "mountPath": "/cache"} in trainer["volumeMounts"]
        assert [c["name"] for c in pod["initContainers"]] == ["warm-cache"]
        assert [c["name"] for c in pod["containers"]] == ["trainer", "log-shipper"]
        assert pod["topologySpreadConstraints"] == JOB_TEMPLATE["topologySpreadConstraints"]
        assert pod["schedulingGates"] == [{"name": "example.com/quota"}]
        assert pod["priorityClassName"] == "batch"
        assert trainer["command"][0] == "rlkube-trainer"


def test_the_role_template_wins_over_the_job_template_for_that_role_only() -> None:
    sets = _sets(job=JOB_TEMPLATE, actor=ACTOR_TEMPLATE)
    actor, rollout = sets["actor"], sets["rollout"]
    assert actor["metadata"]["labels"]["team"] == "actor-team"
    assert actor["metadata"]["labels"]["cost-center"] == "42", "maps merge key by key"
    assert _env(actor)["NCCL_DEBUG"] == "TRACE"
    assert _env(actor)["WANDB_API_KEY"] == SECRET_ENV["valueFrom"], "env merges by name"
    limits = _trainer(actor)["resources"]["limits"]
    assert limits["rdma/ib"] == "1"
    assert limits["vpc.amazonaws.com/efa"] == "4"
    assert limits["nvidia.com/gpu"] == "8", "the operator's GPUs stay"
    context = _trainer(actor)["securityContext"]
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"] == {"add": ["IPC_LOCK"]}, "the role's value replaces the key"
    assert context["seccompProfile"] == {"type": "RuntimeDefault"}, "rlkube's other defaults stay"
    sidecars = [c for c in actor["spec"]["containers"] if c["name"] == "log-shipper"]
    assert sidecars == [{"name": "log-shipper", "image": "fluent-bit:4"}], "containers merge by name"
    assert actor["spec"]["serviceAccountName"] == "actor-sa"
    assert actor["spec"]["priorityClassName"] == "high"
    # Other roles see the job's template only.
    assert rollout["metadata"]["labels"]["team"] == "rl"
    assert _env(rollout)["NCCL_DEBUG"] == "INFO"
    assert rollout["spec"]["serviceAccountName"] == "qwen-gsm8k-grpo-trainer"
    assert sets["controller"]["spec"]["priorityClassName"] == "batch"


def test_the_controller_has_a_template_of_its_own() -> None:
    sets = _sets(controller={"labels": {"driver": "yes"}, "sidecars": [{"name": "proxy", "image": "envoy"}]})
    assert sets["controller"]["metadata"]["labels"]["driver"] == "yes"
    assert [c["name"] for c in sets["controller"]["spec"]["containers"]] == ["trainer", "proxy"]
    assert "driver" not in sets["actor"]["metadata"]["labels"]


def test_the_template_overrides_spec_env_and_keeps_the_other_defaults() -> None:
    job = set_path("spec.env", [{"name": "HF_HUB_OFFLINE", "value": "0"}, {"name": "A", "value": "spec"}])
    template = set_path("spec.podTemplate", {"env": [{"name": "A", "value": "template"}]})
    [actor] = [s for s in statefulsets(load_job(GPU, job, template)) if s["metadata"]["name"].endswith("-actor")]
    env = _env(actor["spec"]["template"])
    assert env["A"] == "template"
    assert env["HF_HUB_OFFLINE"] == "0"
    assert env["TOKENIZERS_PARALLELISM"] == NCCL_DEFAULTS["TOKENIZERS_PARALLELISM"]


def test_a_mount_over_the_checkpoint_directory_leaves_the_operators_mount() -> None:
    # spec.checkpoint.dir is /checkpoints in the GPU example; the CRD cannot compare against it.
    sets = _sets(
        job={"volumes": [{"name": "x", "emptyDir": {}}], "volumeMounts": [{"name": "x", "mountPath": "/checkpoints"}]}
    )
    mounts = [m for m in _trainer(sets["actor"])["volumeMounts"] if m["mountPath"] == "/checkpoints"]
    assert mounts == [{"name": "checkpoints", "mountPath": "/checkpoints"}]


@pytest.mark.parametrize("role", ["controller", "actor", "rollout"])
def test_gang_labels_stay_the_operators(role: str) -> None:
    gang = set_path("spec.runPolicy.gang", {"scheduler": "volcano", "queue": "research"})
    template = set_path("spec.podTemplate", {"annotations": {"scheduling.k8s.io/group-name": "mine"}})
    sets = {s["metadata"]["labels"][LABEL_ROLE]: s for s in statefulsets(load_job(GPU, gang, template))}
    annotations = sets[role]["spec"]["template"]["metadata"]["annotations"]
    assert annotations["scheduling.k8s.io/group-name"] != "mine"


def test_every_pod_gets_a_writable_volume_group_by_default_and_a_template_changes_it() -> None:
    """A freshly provisioned PVC is root-owned: fsGroup (the trainer image's group, 1000) makes
    the kubelet give it that group, so the non-root trainer can write checkpoints there.
    OnRootMismatch skips the recursive chown when the volume already has it (a model volume)."""
    default = load_job(GPU)
    for sts in (c for c in children_of(default) if c["kind"] == "StatefulSet"):
        context = sts["spec"]["template"]["spec"]["securityContext"]
        assert context["fsGroup"] == 1000 and context["fsGroupChangePolicy"] == "OnRootMismatch"
    job = load_job(GPU, set_path("spec.podTemplate", {"podSecurityContext": {"fsGroup": 2000, "runAsUser": 2000}}))
    for sts in (c for c in children_of(job) if c["kind"] == "StatefulSet"):
        context = sts["spec"]["template"]["spec"]["securityContext"]
        assert (context["fsGroup"], context["runAsUser"]) == (2000, 2000), sts["metadata"]["name"]
        assert context["fsGroupChangePolicy"] == "OnRootMismatch" and context["runAsNonRoot"] is True
