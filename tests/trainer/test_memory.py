"""The start-time fit check (memory.py), against what one H200 showed (docs/benchmarks.md,
"GPU: what fits at the 7B shape"): a 7B actor with fp32 master weights ran out of GPU memory in
its first step, with paramOffload its host (128 GiB) ran out, and with bf16 master weights it
trained. The check must refuse the first two at start, naming what to change, and let the
third and the 0.5B benchmark through."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from transformers import AutoModelForCausalLM

from rlkube_api.placement import Role
from rlkube_api.validation import parse_trainer_config
from rlkube_trainer.tiny.task import init
from rlkube_trainer.workers.memory import GIB, DoesNotFit, ModelShape, check_fit, rank_memory

H200 = int(139.8 * GIB)
HOST = 128 * GIB
# Qwen2.5-7B and -0.5B: parameter counts of their checkpoints; embeddings (and the untied head).
QWEN_7B = ModelShape(parameters=7_615_616_512, root_parameters=2 * 152_064 * 3_584, largest_tensor=152_064 * 3_584)
QWEN_05B = ModelShape(parameters=494_032_768, root_parameters=151_936 * 896)
COLOCATED = frozenset({Role.ACTOR, Role.ROLLOUT})


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("memory")
    init(path, steps=2)
    return path


def config(workdir: Path, **actor_fsdp: Any) -> Any:
    from rlkube_trainer.tiny.task import trainer_config  # noqa: PLC0415

    raw = trainer_config(workdir)
    raw["actor"]["fsdp_config"] = actor_fsdp
    raw["rollout"]["gpu_memory_utilization"] = 0.3
    raw["roles"]["actor"]["gpus_per_replica"] = 1
    return parse_trainer_config(raw)


def check(workdir: Path, shape: ModelShape, **actor_fsdp: Any) -> None:
    memory = rank_memory(config(workdir, **actor_fsdp), COLOCATED, 1, H200, {"actor": shape})
    check_fit(memory, H200, HOST, 1, "actor rank 0")


@pytest.mark.trainer
def test_7b_with_fp32_master_weights_is_refused_naming_the_options(workdir: Path) -> None:
    with pytest.raises(DoesNotFit) as refused:
        check(workdir, QWEN_7B)
    message = str(refused.value)
    assert message.startswith("actor rank 0: this configuration cannot fit: the actor update needs at least 14")
    assert "actor AdamW moments 56.7" in message
    assert "actor.fsdpConfig.modelDtype: bf16" in message and "paramOffload" in message
    assert "host memory:" not in message


@pytest.mark.trainer
def test_7b_with_param_offload_is_refused_for_the_host(workdir: Path) -> None:
    with pytest.raises(DoesNotFit) as refused:
        check(workdir, QWEN_7B, param_offload=True)
    message = str(refused.value)
    assert "host memory: 1 rank(s) × 156.0 GiB" in message
    assert "rollout engine's weights while asleep 14.2" in message
    assert "the actor update needs" not in message


@pytest.mark.trainer
def test_what_trained_on_the_h200_passes(workdir: Path) -> None:
    check(workdir, QWEN_7B, model_dtype="bf16")
    check(workdir, QWEN_05B)


@pytest.mark.trainer
def test_sharding_and_an_awake_engine_change_the_sums(workdir: Path) -> None:
    cfg = config(workdir)
    one = rank_memory(cfg, COLOCATED, 1, H200, {"actor": QWEN_7B})
    eight = rank_memory(cfg, COLOCATED, 8, H200, {"actor": QWEN_7B})
    weights = [p.bytes for p in one.gpu[1].parts if p.what.startswith("actor weights")]
    assert [p.bytes for p in eight.gpu[1].parts if p.what.startswith("actor weights")] == [weights[0] // 8]
    check_fit(eight, H200, HOST, 8, "actor rank 0")  # 7B fp32 fits when sharded over 8 GPUs
    # The engine asleep while the actor trains (freeCacheEngine, the default) is not in the update.
    assert not any(p.what.startswith("rollout engine") for p in one.gpu[1].parts)
    cfg.rollout.free_cache_engine = False
    awake = rank_memory(cfg, COLOCATED, 8, H200, {"actor": QWEN_7B})
    assert any(p.what.startswith("rollout engine") for p in awake.gpu[1].parts)
    assert awake.gpu[1].total - eight.gpu[1].total == int(0.3 * H200)


@pytest.mark.trainer
def test_model_shape_reads_the_checkpoint_without_loading_it(workdir: Path) -> None:
    shape = ModelShape.of(workdir / "model")
    assert shape is not None
    model = AutoModelForCausalLM.from_pretrained(workdir / "model")
    assert shape.parameters == sum(p.numel() for p in model.parameters())
    heads = 1 if model.config.tie_word_embeddings else 2
    assert shape.root_parameters == heads * model.config.vocab_size * model.config.hidden_size
    assert shape.largest_tensor == max(p.numel() for p in model.parameters())
    assert ModelShape.of(workdir / "data") is None


@pytest.mark.trainer
def test_optimizer_offload_takes_the_moments_off_the_gpu_outside_the_update(workdir: Path) -> None:
    def sums(**fsdp: Any) -> tuple[dict[str, int], dict[str, int], dict[str, int]]:
        memory = rank_memory(config(workdir, model_dtype="bf16", **fsdp), COLOCATED, 1, H200, {"actor": QWEN_7B})
        generate, update = ({p.what: p.bytes for p in phase.parts} for phase in memory.gpu)
        return generate, update, {p.what: p.bytes for p in memory.host.parts}

    generate, update, host = sums()
    off_generate, off_update, off_host = sums(optimizer_offload=True)
    moments = 2 * 2 * QWEN_7B.parameters  # bf16 master weights: two bf16 moments
    assert generate["actor AdamW moments"] == moments and "actor AdamW moments" not in off_generate
    assert off_host["actor AdamW moments"] == moments and "actor AdamW moments" not in host
    assert off_update == update  # the update has them back on the GPU
    # The colocated sync's bucket: the largest tensor (the embedding) is above 512 MB.
    assert generate["weight-sync bucket"] == 2 * 2 * 152_064 * 3_584


# Qwen2.5-7B's config.json, the parts the adapter count reads.
QWEN_7B_TEXT = {
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "num_hidden_layers": 28,
}


def test_lora_adapter_count_is_pefts() -> None:
    from rlkube_trainer.workers.memory import lora_parameters  # noqa: PLC0415

    # PEFT's print_trainable_parameters for Qwen2.5-7B, r=64, all-linear: 161,480,704.
    assert lora_parameters(QWEN_7B_TEXT, 64, ["all-linear"]) == 161_480_704
    assert lora_parameters(QWEN_7B_TEXT, 8, ["q_proj", "v_proj"]) == 28 * 8 * ((3584 + 3584) + (3584 + 512))


@pytest.mark.trainer
def test_7b_with_lora_fits_with_fp32_master_weights(workdir: Path) -> None:
    """The refused fp32 7B fits with LoRA rank 64: AdamW's moments, the gradients and the step's
    temporaries are the adapters' (161 M parameters), and the reference holds nothing of its own."""
    from dataclasses import replace  # noqa: PLC0415

    from rlkube_trainer.workers.memory import lora_parameters  # noqa: PLC0415

    adapters = lora_parameters(QWEN_7B_TEXT, 64, ["all-linear"])
    shape = replace(QWEN_7B, parameters=QWEN_7B.parameters + adapters, adapter_parameters=adapters)
    cfg = config(workdir)
    cfg = cfg.model_copy(update={"model": cfg.model.model_copy(update={"lora_rank": 64, "lora_alpha": 128})})
    hosts = COLOCATED | {Role.REFERENCE}
    memory = rank_memory(cfg, hosts, 1, H200, {"actor": shape, "reference": QWEN_7B})
    check_fit(memory, H200, HOST, 1, "actor rank 0")
    parts = {p.what: p.bytes for phase in memory.gpu for p in phase.parts}
    assert parts["actor AdamW moments"] == 2 * adapters * 4
    assert parts["actor gradients"] == adapters * 4
    assert parts["actor weights (fp32)"] == shape.parameters * 4
    assert not any(what.startswith("reference") for what in parts)


@pytest.mark.trainer
def test_async_save_counts_the_copy_being_saved_in_host_memory(workdir: Path) -> None:
    """checkpoint.asyncSave: each rank keeps a host copy of its weights and AdamW moments while
    the background write runs; the 7B that trained on the H200 (bf16 master) still fits its
    128 GiB host, a 48 GiB host does not."""
    cfg = config(workdir, model_dtype="bf16")
    saving = cfg.model_copy(update={"checkpoint": cfg.checkpoint.model_copy(update={"async_save": True})})
    host = {p.what: p.bytes for p in rank_memory(saving, COLOCATED, 1, H200, {"actor": QWEN_7B}).host.parts}
    assert host["actor weights (bf16), copy being saved"] == 2 * QWEN_7B.parameters
    assert host["actor AdamW moments, copy being saved"] == 2 * 2 * QWEN_7B.parameters
    check_fit(rank_memory(saving, COLOCATED, 1, H200, {"actor": QWEN_7B}), H200, HOST, 1, "actor rank 0")
    check_fit(rank_memory(cfg, COLOCATED, 1, H200, {"actor": QWEN_7B}), H200, 48 * GIB, 1, "actor rank 0")
    with pytest.raises(DoesNotFit, match="copy being saved"):
        check_fit(rank_memory(saving, COLOCATED, 1, H200, {"actor": QWEN_7B}), H200, 48 * GIB, 1, "actor rank 0")
