"""Gang-scheduling plugins behind plugin_for(job): Volcano and coscheduling PodGroups,
Kueue's pod-group labels, and nothing at all without spec.runPolicy.gang."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from rlkube_api.names import LABEL_JOB, LABEL_ROLE
from rlkube_api.rljob import RLJob

# rlkube_operator.children must load before rlkube_operator.gang: importing the gang
# package first fails (circular import, see test_gang_package_imports_on_its_own).
from rlkube_operator.desired import desired_children
from rlkube_operator.gang import plugin_for
from rlkube_operator.gang.resources import gang_requests
from tests.operator.helpers import CPU, GPU, NAMESPACE, RAY_TOKEN, UID, Mutation, Obj, children_of, load_job, set_path

GPU_JOB = "qwen-gsm8k-grpo"
VOLCANO_GROUP = "scheduling.k8s.io/group-name"
VOLCANO_TASK = "volcano.sh/task-spec"
COSCHEDULING_GROUP = "scheduling.x-k8s.io/pod-group"
KUEUE_QUEUE = "kueue.x-k8s.io/queue-name"
KUEUE_GROUP = "kueue.x-k8s.io/pod-group-name"
KUEUE_COUNT = "kueue.x-k8s.io/pod-group-total-count"
KUEUE_RETRIABLE = "kueue.x-k8s.io/retriable-in-group"
# Kueue's pod-group annotations on every pod of the GPU example (7 pods) at attempt 0.
KUEUE_ANNOTATIONS = {KUEUE_COUNT: "7", KUEUE_RETRIABLE: "false"}
# 2×(64, 900Gi, 8) + 4×(16, 200Gi, 2) + the controller's defaults (1, 4Gi)
GPU_REQUESTS = {"cpu": "193", "memory": "2604Gi", "nvidia.com/gpu": "24"}


def gang(scheduler: str, **fields: Any) -> Mutation:
    return set_path("spec.runPolicy.gang", {"scheduler": scheduler, **fields})


def children(job: RLJob, pods_wanted: bool = True) -> list[Obj]:
    return children_of(job, pods_wanted=pods_wanted)


def pod_groups(objs: list[Obj]) -> list[Obj]:
    return [c for c in objs if c["kind"] == "PodGroup"]


def templates(objs: list[Obj]) -> dict[str, Obj]:
    return {c["metadata"]["labels"][LABEL_ROLE]: c["spec"]["template"] for c in objs if c["kind"] == "StatefulSet"}


def owner_of(child: Obj) -> Obj:
    refs = child["metadata"]["ownerReferences"]
    assert len(refs) == 1
    ref: Obj = refs[0]
    return ref


@pytest.mark.parametrize("pods_wanted", [True, False])
def test_volcano_pod_group(pods_wanted: bool) -> None:
    job = load_job(GPU, gang("volcano", queue="research", priorityClassName="rl-high"))
    groups = pod_groups(desired_children(job, UID, 0, pods_wanted, RAY_TOKEN))
    assert len(groups) == 1
    group = groups[0]
    assert group["apiVersion"] == "scheduling.volcano.sh/v1beta1"
    assert group["metadata"]["name"] == GPU_JOB
    assert group["metadata"]["namespace"] == NAMESPACE
    assert group["metadata"]["labels"][LABEL_JOB] == GPU_JOB
    assert owner_of(group)["uid"] == UID
    assert owner_of(group)["controller"] is True
    assert group["spec"] == {
        "minMember": 7,  # every pod: 1 controller + 2 actor + 4 rollout
        "minTaskMember": {"controller": 1, "actor": 2, "rollout": 4},
        "minResources": GPU_REQUESTS,
        "queue": "research",
        "priorityClassName": "rl-high",
    }
    assert sum(group["spec"]["minTaskMember"].values()) == group["spec"]["minMember"]


def test_volcano_without_queue_or_priority_leaves_them_out() -> None:
    (group,) = pod_groups(children(load_job(CPU, gang("volcano"))))
    assert group["spec"] == {
        "minMember": 4,
        "minTaskMember": {"controller": 1, "actor": 2, "rollout": 1},
        "minResources": {"cpu": "1", "memory": "4Gi"},  # only the controller asks, by default
    }


@pytest.mark.parametrize("timeout", [None, 120])
def test_coscheduling_pod_group(timeout: int | None) -> None:
    fields = {} if timeout is None else {"scheduleTimeoutSeconds": timeout}
    job = load_job(GPU, gang("coscheduling", **fields))
    (group,) = pod_groups(children(job))
    assert group["apiVersion"] == "scheduling.x-k8s.io/v1alpha1"
    assert group["metadata"]["name"] == GPU_JOB
    assert group["metadata"]["namespace"] == NAMESPACE
    assert owner_of(group)["uid"] == UID
    assert group["spec"] == {
        "minMember": 7,
        "minResources": GPU_REQUESTS,
        "scheduleTimeoutSeconds": 600 if timeout is None else timeout,
    }


@pytest.mark.parametrize("mutations", [[], [gang("kueue", queue="team-a")]], ids=["no-gang", "kueue"])
def test_no_pod_group_without_a_gang_scheduler(mutations: list[Mutation]) -> None:
    job = load_job(GPU, *mutations)
    assert pod_groups(children(job)) == []
    assert plugin_for(job).children(job) == []


# mutations, schedulerName, priorityClassName, pod labels, pod annotations (role filled in for "{role}")
POD_PATCHES = [
    pytest.param([], None, None, {}, {}, id="no-gang"),
    pytest.param(
        [gang("volcano", priorityClassName="rl-high")],
        "volcano",
        "rl-high",
        {},
        {VOLCANO_GROUP: GPU_JOB, VOLCANO_TASK: "{role}"},
        id="volcano",
    ),
    pytest.param(
        [gang("volcano", schedulerName="vc-scheduler")],
        "vc-scheduler",
        None,
        {},
        {VOLCANO_GROUP: GPU_JOB, VOLCANO_TASK: "{role}"},
        id="volcano-custom-scheduler",
    ),
    pytest.param(
        [gang("coscheduling")],
        "scheduler-plugins-scheduler",
        None,
        {COSCHEDULING_GROUP: GPU_JOB},
        {},
        id="coscheduling",
    ),
    pytest.param(
        [gang("kueue", queue="team-a")],
        None,
        None,
        {KUEUE_QUEUE: "team-a", KUEUE_GROUP: f"{GPU_JOB}-attempt-0"},
        KUEUE_ANNOTATIONS,
        id="kueue",
    ),
    # A namespace's default LocalQueue may still take the pods: they form one group all the same.
    pytest.param(
        [gang("kueue")], None, None, {KUEUE_GROUP: f"{GPU_JOB}-attempt-0"}, KUEUE_ANNOTATIONS, id="kueue-without-queue"
    ),
]
GANG_KEYS = {VOLCANO_GROUP, VOLCANO_TASK, COSCHEDULING_GROUP, KUEUE_QUEUE, KUEUE_GROUP, KUEUE_COUNT, KUEUE_RETRIABLE}


@pytest.mark.parametrize(("mutations", "scheduler", "priority", "labels", "annotations"), POD_PATCHES)
def test_pod_templates_join_the_gang(
    mutations: list[Mutation],
    scheduler: str | None,
    priority: str | None,
    labels: dict[str, str],
    annotations: dict[str, str],
) -> None:
    job = load_job(GPU, *mutations)
    by_role = templates(children(job))
    assert set(by_role) == {"controller", "actor", "rollout"}
    for role, template in by_role.items():
        spec, meta = template["spec"], template["metadata"]
        assert spec.get("schedulerName") == scheduler, role
        assert spec.get("priorityClassName") == priority, role
        pod_labels = {k: v for k, v in meta["labels"].items() if k in GANG_KEYS}
        pod_annotations = {k: v for k, v in meta["annotations"].items() if k in GANG_KEYS}
        assert pod_labels == labels, role
        assert pod_annotations == {k: v.format(role=role) for k, v in annotations.items()}, role
        # The role's own labels stay, and the gang's never enter the (immutable) selector.
        assert meta["labels"][LABEL_ROLE] == role
        assert set(meta["labels"]) >= {LABEL_JOB, LABEL_ROLE}


@pytest.mark.parametrize("mutations", [[gang("kueue", queue="team-a")], []], ids=["kueue", "no-gang"])
def test_kueue_labels_only_the_pods(mutations: list[Mutation]) -> None:
    """Kueue's keys are on pod templates only: on a StatefulSet, Kueue's statefulset
    integration (if a cluster enables it) would admit each role as a gang of its own."""
    for child in children(load_job(GPU, *mutations)):
        assert not set(child["metadata"]["labels"]) & GANG_KEYS, child["metadata"]["name"]
        assert not set(child["metadata"].get("annotations") or {}) & GANG_KEYS, child["metadata"]["name"]
        if child["kind"] == "StatefulSet":
            assert not set(child["spec"]["selector"]["matchLabels"]) & GANG_KEYS


@pytest.mark.parametrize(
    ("example", "mutations", "pods"),
    [
        pytest.param(GPU, [], 7, id="gpu-example"),
        pytest.param(CPU, [set_path("spec.roles.rollout.replicas", 3)], 6, id="cpu-three-rollouts"),
    ],
)
def test_kueue_group_counts_every_pod_of_every_role(example: str, mutations: list[Mutation], pods: int) -> None:
    """The group's total count is the whole gang: the controller and every role's replicas,
    the same on every pod (Kueue admits the group once that many pods exist)."""
    job = load_job(example, gang("kueue", queue="team-a"), *mutations)
    replicas = {
        c["metadata"]["labels"][LABEL_ROLE]: c["spec"]["replicas"] for c in children(job) if c["kind"] == "StatefulSet"
    }
    assert sum(replicas.values()) == pods
    for template in templates(children(job)).values():
        assert template["metadata"]["annotations"][KUEUE_COUNT] == str(pods)


def test_kueue_group_is_new_for_each_attempt() -> None:
    """A restarted gang is admitted as a new group: the old attempt's group ends with its pods."""
    job = load_job(GPU, gang("kueue", queue="team-a"))
    for attempt in (0, 3):
        groups = {t["metadata"]["labels"][KUEUE_GROUP] for t in templates(children_of(job, attempt=attempt)).values()}
        assert groups == {f"{GPU_JOB}-attempt-{attempt}"}


# mutations, summed requests of every pod
REQUESTS = [
    pytest.param(GPU, [], GPU_REQUESTS, id="gpu-example"),
    pytest.param(
        GPU,
        [
            set_path("spec.algorithm.advEstimator", "gae"),  # only gae uses a critic
            set_path("spec.roles.critic", {"replicas": 1, "gpusPerReplica": 8}),
            set_path("spec.controller.resources", {"cpu": "4", "memory": "16Gi"}),
        ],
        {"cpu": "196", "memory": "2616Gi", "nvidia.com/gpu": "32"},
        id="gpu-critic-and-controller",
    ),
    pytest.param(CPU, [], {"cpu": "1", "memory": "4Gi"}, id="cpu-only-the-controller-defaults"),
    pytest.param(
        CPU,
        [
            set_path("spec.roles.actor.resources", {"cpu": "500m", "memory": "1.5Gi"}),
            set_path("spec.roles.rollout.resources", {"cpu": "250m", "memory": "512Mi"}),
        ],
        {"cpu": "2250m", "memory": "7680Mi"},
        id="cpu-milli-and-fractions",
    ),
]


@pytest.mark.parametrize(("example", "mutations", "expected"), REQUESTS)
def test_gang_requests_sum_every_pod(example: str, mutations: list[Mutation], expected: dict[str, str]) -> None:
    assert gang_requests(load_job(example, *mutations)) == expected


@pytest.mark.parametrize(("memory", "replicas", "at_least"), [("100M", 1, 100 * 10**6), ("512Ki", 2, 2 * 512 * 2**10)])
def test_gang_memory_is_never_below_the_pods_requests(memory: str, replicas: int, at_least: int) -> None:
    job = load_job(
        CPU,
        set_path("spec.roles.actor", {"replicas": replicas, "gpusPerReplica": 0, "resources": {"memory": memory}}),
    )
    total = gang_requests(job)["memory"]
    units = {"Mi": 2**20, "Gi": 2**30}
    assert int(total[:-2]) * units[total[-2:]] >= at_least, total


@pytest.fixture
def fresh_operator_modules() -> Iterator[None]:
    """Unloads rlkube_operator for one test (as in a new interpreter) and restores it afterwards."""
    saved = {name: mod for name, mod in sys.modules.items() if name.split(".")[0] == "rlkube_operator"}
    for name in saved:
        del sys.modules[name]
    try:
        yield
    finally:
        for name in [n for n in sys.modules if n.split(".")[0] == "rlkube_operator"]:
            del sys.modules[name]
        sys.modules.update(saved)


@pytest.mark.parametrize("module", ["rlkube_operator.gang", "rlkube_operator.gang.resources"])
@pytest.mark.usefixtures("fresh_operator_modules")
def test_gang_package_imports_on_its_own(module: str) -> None:
    """`import rlkube_operator.gang` as the first import of the operator (a script, a test run alone)."""
    imported = importlib.import_module(module)
    assert imported.__name__ == module
