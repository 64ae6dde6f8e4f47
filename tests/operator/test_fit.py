"""A job whose memory estimate exceeds its GPUs is held before any pod is created, with the
numbers; the GPU memory comes from spec.fit or the pool's nodes' GPU feature discovery label."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from kubernetes.client import ApiClient, CoreV1Api

from rlkube_operator.fit import GPU_MEMORY_LABEL, fit_refusals, format_plan
from rlkube_operator.kube import Kube
from rlkube_operator.plan import ApplyChildren
from rlkube_operator.status import Observed, compute_status
from rlkube_operator.status.before_pods import DOES_NOT_FIT
from tests.operator.helpers import GPU, at, load_job, set_path

# The example: the actor on 2 pods × 8 GPUs of the h100-train pool (FSDP over 16), the rollout
# on 4 pods × 2 GPUs of the l40s-infer pool.
TRAIN = {"rlkube.dev/pool": "h100-train", GPU_MEMORY_LABEL: "81559"}
INFER = {"rlkube.dev/pool": "l40s-infer", GPU_MEMORY_LABEL: "46068"}


def _nodes(*labels: dict[str, str]) -> tuple[Callable[[], list[dict[str, str]]], list[int]]:
    calls: list[int] = []

    def list_nodes() -> list[dict[str, str]]:
        calls.append(1)
        return list(labels)

    return list_nodes, calls


def test_a_job_without_model_dimensions_is_not_estimated_and_lists_no_nodes() -> None:
    nodes, calls = _nodes(TRAIN)
    assert fit_refusals(load_job(GPU), nodes) == ()
    assert calls == []


def test_the_pools_gpu_memory_label_decides_and_the_refusal_names_role_and_numbers() -> None:
    job = load_job(GPU, set_path("spec.fit", {"modelArchitecture": "qwen2.5-32b"}))
    nodes, _ = _nodes(TRAIN, INFER)
    refusals = fit_refusals(job, nodes)
    # 32B over 16 H100s with fp32 master weights: 16 bytes a parameter over 16 ranks fits; the
    # separate rollout's engines take their share of a 45 GiB L40S and fit too.
    assert refusals == ()
    small = {**TRAIN, GPU_MEMORY_LABEL: "16384"}
    refusals = fit_refusals(job, _nodes(small, INFER)[0])
    assert len(refusals) == 1 and refusals[0].startswith("actor (dp16) needs"), refusals
    assert "16.0 GiB" in refusals[0]


def test_stated_gpu_memory_wins_and_no_node_is_listed() -> None:
    job = load_job(GPU, set_path("spec.fit", {"modelArchitecture": "qwen2.5-32b", "gpuMemoryMiB": 8192}))
    nodes, calls = _nodes(TRAIN, INFER)
    refusals = fit_refusals(job, nodes)
    assert calls == [] and {r.split(" ", 1)[0] for r in refusals} == {"actor", "rollout"}


def test_a_job_that_does_not_fit_is_held_with_no_pods() -> None:
    job = load_job(GPU)
    plan = compute_status(job, Observed([], at(0), {}, fit_refusals=("actor (dp16) needs 90.0 GiB",)))
    created = next(c for c in plan.status.conditions if c.type == "Created")
    assert (created.status, created.reason) == ("False", DOES_NOT_FIT)
    assert created.message.startswith("actor (dp16) needs 90.0 GiB")
    assert plan.status.state == "Pending"
    applies = [a for a in plan.actions if isinstance(a, ApplyChildren)]
    # Every StatefulSet, the controller's too, at zero replicas.
    assert applies and not applies[0].pods_wanted


def test_plan_shows_each_layout_where_its_groups_sit_and_the_memory() -> None:
    job = load_job(
        GPU,
        set_path("spec.roles.actor.tensorParallelSize", 2),
        set_path("spec.roles.actor.pipelineParallelSize", 2),
        set_path("spec.roles.actor.fsdpSize", 4),
        set_path("spec.fit", {"modelArchitecture": "qwen2.5-32b"}),
    )
    text = format_plan(job, 81559)
    assert "actor: tp2×pp2×dp4 on 2 pod(s) × 8 rank(s)" in text
    # Tensor parallel inside a pod, pipeline stages on different pods.
    assert "tensor-parallel groups of 2: ranks [0, 1] on pods [0]" in text
    assert "pipeline-parallel groups of 2: ranks [0, 8] on pods [0, 1]" in text
    assert "actor actor update:" in text and "actor: fits" in text
    assert "DOES NOT FIT" in format_plan(job, 16384)


@pytest.mark.cluster
def test_node_labels_come_from_the_api_server(kube: ApiClient) -> None:
    """The reconciler's list of node labels (metadata only), against the real API server."""
    expected = [dict((n.metadata.labels if n.metadata else None) or {}) for n in CoreV1Api(kube).list_node().items]
    assert sorted(map(sorted, Kube(kube).node_labels())) == sorted(map(sorted, expected))
