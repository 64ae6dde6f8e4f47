"""The memory estimate per rank: checked against the GPU measurements of docs/benchmarks.md, and
divided as the layout divides the model."""

from __future__ import annotations

from typing import Any

import pytest

from rlkube_api.config import TrainerConfig
from rlkube_api.fit import table
from rlkube_api.fit.estimate import GIB, RoleEstimate, estimate
from rlkube_api.fit.model import KNOWN_ARCHITECTURES
from rlkube_api.placement import Role

H100 = int(79.6 * GIB)


def _config(actor: dict[str, Any], roles: dict[str, Any], **model: Any) -> TrainerConfig:
    return TrainerConfig.model_validate(
        {
            "model": {"path": "/m", **model},
            "data": {
                "train_files": ["/d"],
                "max_prompt_length": 256,
                "max_response_length": 512,
                "train_batch_size": 64,
            },
            "actor": {"ppo_mini_batch_size": 64, **actor},
            "rollout": {"n": 8},
            "algorithm": {"adv_estimator": "grpo"},
            "roles": {"actor": {"replicas": 1, "gpus_per_replica": 1, **roles}},
        }
    )


def _actor(config: TrainerConfig, arch: str) -> RoleEstimate:
    return next(e for e in estimate(config, KNOWN_ARCHITECTURES[arch], H100) if e.role == Role.ACTOR)


def test_the_update_estimate_is_within_15_percent_of_the_measured_peak() -> None:
    """docs/benchmarks.md, "GPU: the actor update alone", variant plain: Qwen2.5-0.5B, 512 × 768
    tokens, micro-batch 16, FSDP2 on one H100, fp32 master weights, no gradient checkpointing:
    29.5 GiB peak allocated."""
    update = _actor(_config({"ppo_micro_batch_size_per_gpu": 16}, {}), "qwen2.5-0.5b").phases[0]
    assert update.name == "actor update"
    assert update.total / GIB == pytest.approx(29.5, rel=0.15)


def test_known_architectures_have_their_published_parameter_counts() -> None:
    assert KNOWN_ARCHITECTURES["qwen2.5-7b"].parameters / 1e9 == pytest.approx(7.62, rel=0.01)
    assert KNOWN_ARCHITECTURES["qwen2.5-0.5b"].parameters / 1e9 == pytest.approx(0.494, rel=0.01)
    assert KNOWN_ARCHITECTURES["llama-3.1-8b"].parameters / 1e9 == pytest.approx(8.03, rel=0.01)


def test_tensor_and_pipeline_parallel_divide_the_states_per_rank() -> None:
    """On 8 GPUs, FSDP over 8 and TP 2 × PP 2 × FSDP 2 hold the same bytes of state per rank (each
    rank an eighth of the model); TP 2 × PP 2 without FSDP sharding (fsdpSize 1) holds twice that."""

    def states(roles: dict[str, Any]) -> int:
        config = _config({"ppo_micro_batch_size_per_gpu": 4}, {"gpus_per_replica": 8, **roles})
        update = _actor(config, "qwen2.5-7b").phases[0]
        return sum(p.bytes for p in update.parts if "weights (" in p.what or "moments" in p.what)

    fsdp8 = states({})
    tp2pp2 = states({"tensor_parallel_size": 2, "pipeline_parallel_size": 2})
    assert tp2pp2 == pytest.approx(fsdp8, rel=0.1)
    assert states({"tensor_parallel_size": 2, "pipeline_parallel_size": 2, "fsdp_size": 1}) == pytest.approx(
        2 * tp2pp2, rel=0.01
    )


def test_a_7b_with_fp32_master_weights_does_not_fit_one_h100() -> None:
    actor = _actor(_config({"ppo_micro_batch_size_per_gpu": 4}, {}, enable_gradient_checkpointing=True), "qwen2.5-7b")
    refusal = actor.refusal(H100)
    assert refusal is not None and "actor (dp1) needs" in refusal and "GiB" in refusal


def test_the_committed_memory_table_is_current() -> None:
    assert table.main(["--check"]) == 0, "docs/memory-table.md is stale: python -m rlkube_api.fit.table --write"
