"""Placement, the one answer to "which process hosts what": groups, their ranks and the
roles each hosts, and the weight-sync group; table-driven, no cluster."""

from __future__ import annotations

from typing import Any

import pytest

from rlkube_api.config import TrainerConfig
from rlkube_api.placement import Role, placement_of

A, C, REF, RW, RO = Role.ACTOR, Role.CRITIC, Role.REFERENCE, Role.REWARD, Role.ROLLOUT


def config(roles: dict[str, Any], **sections: Any) -> TrainerConfig:
    raw: dict[str, Any] = {
        "model": {"path": "/m"},
        "data": {"train_files": ["/d.parquet"], "train_batch_size": 8},
        # 16 samples a mini-batch over up to 16 ranks: micro-batches of 1 divide every share.
        "actor": {"ppo_mini_batch_size": 8, "ppo_micro_batch_size_per_gpu": 1},
        "critic": {"ppo_micro_batch_size_per_gpu": 1},
        "rollout": {"n": 2},
        "reward": {"function": {"path": "/r.py"}},
        "roles": roles,
    }
    for key, value in sections.items():
        raw.setdefault(key, {}).update(value)
    return TrainerConfig.model_validate(raw)


ACTOR_2x4 = {"actor": {"replicas": 2, "gpus_per_replica": 4}}
SEPARATE_2x2 = {"rollout": {"placement": "separate", "replicas": 2, "gpus_per_replica": 2}}

# roles, extra sections, expected groups: (name, world size, roles hosted)
CASES = [
    pytest.param(ACTOR_2x4, {}, [(A, 8, {A, RO})], id="grpo-colocated"),
    pytest.param(
        ACTOR_2x4, {"actor": {"use_kl_loss": True}}, [(A, 8, {A, RO, REF})], id="kl-loss-reference-beside-actor"
    ),
    pytest.param(
        {**ACTOR_2x4, "reference": {"replicas": 1, "gpus_per_replica": 2}},
        {"algorithm": {"use_kl_in_reward": True}},
        [(A, 8, {A, RO}), (REF, 2, {REF})],
        id="reference-own-pods",
    ),
    pytest.param(
        {**ACTOR_2x4, "critic": {"colocate_with": "actor"}},
        {"algorithm": {"adv_estimator": "gae"}},
        [(A, 8, {A, RO, C})],
        id="gae-critic-colocated",
    ),
    pytest.param(
        {**ACTOR_2x4, "critic": {"replicas": 1, "gpus_per_replica": 8}, **SEPARATE_2x2},
        {"algorithm": {"adv_estimator": "gae"}},
        [(A, 8, {A}), (C, 8, {C}), (RO, 4, {RO})],
        id="everything-separate",
    ),
    pytest.param(
        ACTOR_2x4,
        {"reward": {"function": None, "model": {"path": "/rm"}}},
        [(A, 8, {A, RO, RW})],
        id="reward-model-beside-actor",
    ),
    pytest.param(
        {**ACTOR_2x4, "reward": {"replicas": 2, "gpus_per_replica": 1}},
        {"reward": {"function": None, "model": {"path": "/rm"}}},
        [(A, 8, {A, RO}), (RW, 2, {RW})],
        id="reward-model-own-pods",
    ),
    pytest.param({"actor": {"replicas": 2, "gpus_per_replica": 0}}, {}, [(A, 2, {A, RO})], id="cpu-one-rank-per-pod"),
]


@pytest.mark.parametrize(("roles", "sections", "expected"), CASES)
def test_groups_and_the_roles_they_host(
    roles: dict[str, Any], sections: dict[str, Any], expected: list[tuple[Role, int, set[Role]]]
) -> None:
    placement = placement_of(config(roles, **sections))
    assert [(g.name, g.world_size, set(g.hosts)) for g in placement.groups] == expected
    for name, _, hosts in expected:
        for role in hosts:
            host = placement.host_of(role)
            assert host is not None and host.name == name


def test_a_role_the_run_does_not_use_has_no_host() -> None:
    placement = placement_of(config(ACTOR_2x4))
    assert placement.host_of(REF) is None
    assert placement.host_of(C) is None
    assert placement.host_of(RW) is None


def test_separate_rollout_weight_sync_ranks() -> None:
    placement = placement_of(config({**ACTOR_2x4, **SEPARATE_2x2}))
    sync = placement.weight_sync
    assert sync is not None
    assert sync.world_size == 8 + 4  # every actor rank (a sender) + every rollout rank
    assert [sync.rank_of(A, r) for r in range(8)] == list(range(8))
    assert [sync.rank_of(RO, r) for r in range(4)] == [8, 9, 10, 11]
    assert sync.rank_offset(A) == 0 and sync.rank_offset(RO) == 8
    assert sync.rank_offset(C) is None
    assert placement.num_gpus == 8 + 4


def test_colocated_rollout_has_no_weight_sync_group() -> None:
    assert placement_of(config(ACTOR_2x4)).weight_sync is None


def test_ranks_map_to_their_pods() -> None:
    actor = placement_of(config(ACTOR_2x4)).group(A)
    assert [actor.pod_of(r) for r in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]


def test_in_one_process_puts_every_used_role_on_one_rank() -> None:
    separate = config(
        {**ACTOR_2x4, "critic": {"replicas": 1, "gpus_per_replica": 8}, **SEPARATE_2x2},
        algorithm={"adv_estimator": "gae", "use_kl_in_reward": True},
    )
    single = placement_of(separate).in_one_process()
    assert [(g.name, g.world_size, set(g.hosts)) for g in single.groups] == [(A, 1, {A, C, REF, RO})]
    assert single.weight_sync is None
    assert single.num_gpus == 1
    cpu = placement_of(config({"actor": {"replicas": 2, "gpus_per_replica": 0}})).in_one_process()
    assert cpu.num_gpus == 0


@pytest.mark.parametrize(
    ("roles", "engines", "tp"),
    [
        pytest.param({**ACTOR_2x4, "rollout": {"tensor_parallel_size": 2}}, 4, 2, id="colocated-tp2-over-8"),
        pytest.param({**ACTOR_2x4, "rollout": {"tensor_parallel_size": 4}}, 2, 4, id="colocated-tp4-one-per-pod"),
        pytest.param(
            {**ACTOR_2x4, "rollout": {**SEPARATE_2x2["rollout"], "tensor_parallel_size": 2}}, 2, 2, id="separate-tp2"
        ),
        pytest.param(ACTOR_2x4, 8, 1, id="colocated-tp1-an-engine-per-rank"),
        pytest.param(
            {"actor": {"replicas": 2, "gpus_per_replica": 0}, "rollout": {"tensor_parallel_size": 2}},
            1,
            2,
            id="cpu-engine-spans-pods",
        ),
    ],
)
def test_engines_span_consecutive_ranks_of_the_rollout_host(roles: dict[str, Any], engines: int, tp: int) -> None:
    placement = placement_of(config(roles))
    e = placement.engines
    assert (e.count, e.tensor_parallel_size) == (engines, tp)
    ranks = [r for engine in range(e.count) for r in e.ranks_of(engine)]
    assert ranks == list(range(e.world_size))
    assert [e.engine_of(r) for r in ranks] == [r // tp for r in ranks]
    assert [e.tp_rank_of(r) for r in ranks] == [r % tp for r in ranks]
    assert placement.in_one_process().engines.count == 1


def test_tensor_parallel_that_does_not_divide_the_ranks_is_refused_naming_the_field() -> None:
    from pydantic import ValidationError  # noqa: PLC0415

    with pytest.raises(ValidationError, match="tensorParallelSize"):
        config({"actor": {"replicas": 3, "gpus_per_replica": 0}, "rollout": {"tensor_parallel_size": 2}})


def test_the_hf_engine_with_tensor_parallel_is_refused_naming_the_field() -> None:
    from pydantic import ValidationError  # noqa: PLC0415

    with pytest.raises(ValidationError, match=r"roles\.rollout\.tensorParallelSize must be 1"):
        config({**ACTOR_2x4, "rollout": {"tensor_parallel_size": 2}}, rollout={"name": "hf"})
