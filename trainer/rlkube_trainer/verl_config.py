"""`rlkube-trainer convert verl-config.yaml`: a verl (Hydra) PPO config mapped to a
trainer YAML, or to an RLJob.

Pure and table-driven: `RULES` says, for every verl key rlkube knows, where it goes
(`To`) or why it has no counterpart (`Ignored`, refused when its value asks for
something rlkube does not do). A key in no rule is refused by name, never dropped in
silence. Hydra's `${a.b}` interpolations are resolved against the same file first.

verl's layout: `actor_rollout_ref.{model,actor,ref,rollout}`, `critic`, `reward_model`,
`custom_reward_function`, `algorithm`, `data`, `trainer`; rlkube's sections keep
verl's leaf names (rlkube_api/config.py), so most rules only move a key up a level.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

from rlkube_api.config import MultiTurnConfig, TrainerConfig
from rlkube_api.rljob import RLJob
from rlkube_api.validation import InvalidSpec, parse_rljob, parse_trainer_config


@dataclass(frozen=True)
class To:
    """The verl key becomes `target` (a dotted key of rlkube's trainer YAML)."""

    target: str
    convert: Callable[[Any], Any] | None = None


@dataclass(frozen=True)
class Ignored:
    """No counterpart. `accepts(value)` False: refused with `refusal` (it would change
    what the run does). A rule on a key whose value is a mapping judges it whole."""

    why: str
    accepts: Callable[[Any], bool] = field(default=lambda _: True)
    refusal: str = ""


Rule = To | Ignored


def _is(*values: Any) -> Callable[[Any], bool]:
    return lambda value: value in values


def _falsy(value: Any) -> bool:
    return value in (None, False, 0, "", [], {})


def _as_list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list | tuple) else [value]


def _none_if_negative(value: Any) -> Any:
    return None if value is None or value < 0 else value


def _strategy(value: Any) -> str:
    # verl's fsdp/fsdp2 shard over the role's ranks; rlkube's auto does that on GPU.
    if value not in STRATEGIES:
        raise ValueError("only fsdp and fsdp2 are supported")
    return "auto"


PERF = "a performance setting of verl's engines; rlkube sizes its own"
# verl 0.9.1's FSDP engine: use_torch_compile compiles its entropy_from_logits helper, nothing else.
ENTROPY_COMPILE = (
    "compiles verl's entropy-from-logits helper only; rlkube's chunked LM head is not compiled, and its "
    "decoder-layer compile is actor/ref/critic.compile_decoder_layers"
)


def _recompute_logits(use_fused_kernels: Any) -> str:
    """verl's fused kernels compute the log-probs and entropy chunk by chunk from the hidden states and
    recompute each chunk in the backward (FusedLinearForPPO): rlkube's `always`. Without them verl keeps
    the whole micro-batch's logits for the backward; `auto` keeps them when they fit, as they must."""
    return "always" if use_fused_kernels else "auto"


DERIVED = "derived from other keys in rlkube"
NO_OFFLOAD = "rlkube offloads with param_offload and optimizer_offload"
FSDP = "FSDP wrapping is per decoder layer in rlkube"
VAL = "rlkube validates with the training sampling settings"
STRATEGIES = ("fsdp", "fsdp2")
ACTOR_DECIDES = "actor.use_dynamic_bsz decides for the actor's and the reference's forward passes too"


def _dtype(value: Any) -> str:
    names = {"bf16": "bf16", "bfloat16": "bf16", "fp32": "fp32", "float32": "fp32"}
    if value not in names:
        raise ValueError("only bf16 and fp32 are supported")
    return names[value]


def _fsdp(role: str, target: str, optimizer: bool = True) -> dict[str, Rule]:
    """A role's fsdp_config, mapped to the rlkube section `target` (`optimizer`: the role has one)."""
    fsdp = f"{target}.fsdp_config"
    return {
        f"{role}.fsdp_config.param_offload": To(f"{fsdp}.param_offload"),
        f"{role}.fsdp_config.optimizer_offload": To(f"{fsdp}.optimizer_offload")
        if optimizer
        else Ignored("the reference has no optimizer"),
        f"{role}.fsdp_config.offload_policy": Ignored(NO_OFFLOAD, _falsy, "offload_policy is not supported"),
        f"{role}.fsdp_config.wrap_policy": Ignored(FSDP),
        f"{role}.fsdp_config.reshard_after_forward": To(f"{fsdp}.reshard_after_forward"),
        f"{role}.fsdp_config.forward_prefetch": Ignored(FSDP),
        f"{role}.fsdp_config.model_dtype": To(f"{fsdp}.model_dtype", _dtype),
        f"{role}.fsdp_config.mixed_precision.param_dtype": To(f"{fsdp}.mixed_precision.param_dtype", _dtype),
        f"{role}.fsdp_config.mixed_precision.reduce_dtype": To(f"{fsdp}.mixed_precision.reduce_dtype", _dtype),
        f"{role}.fsdp_config.mixed_precision.buffer_dtype": Ignored("buffers keep the model's dtype"),
    }


def _optim(verl: str, rlkube: str) -> dict[str, Rule]:
    return {
        f"{verl}.lr": To(f"{rlkube}.lr"),
        # verl: -1 means "use the ratio"; rlkube: 0 does.
        f"{verl}.lr_warmup_steps": To(f"{rlkube}.lr_warmup_steps", lambda v: max(int(v), 0)),
        f"{verl}.lr_warmup_steps_ratio": To(f"{rlkube}.lr_warmup_steps_ratio"),
        f"{verl}.warmup_style": To(f"{rlkube}.warmup_style"),
        f"{verl}.lr_scheduler_type": To(f"{rlkube}.warmup_style"),
        f"{verl}.min_lr_ratio": To(f"{rlkube}.min_lr_ratio", lambda v: v or 0.0),
        f"{verl}.weight_decay": To(f"{rlkube}.weight_decay"),
        f"{verl}.betas": To(f"{rlkube}.betas", list),
        f"{verl}.num_cycles": Ignored("cosine decays over half a cycle", _is(0.5), "only num_cycles 0.5 is supported"),
        f"{verl}.total_training_steps": Ignored("filled in by verl at run time; rlkube counts steps itself"),
        f"{verl}.clip_grad": Ignored("see grad_clip"),
        f"{verl}.optimizer": Ignored("AdamW", _is("AdamW", None), "only AdamW is supported"),
    }


def _micro_batch(prefix: str) -> dict[str, Rule]:
    role = prefix.rsplit(".", maxsplit=1)[-1]
    return {
        f"{prefix}.ppo_micro_batch_size": Ignored(
            "deprecated in verl", _falsy, "set ppo_micro_batch_size_per_gpu instead of the global micro batch size"
        ),
        f"{prefix}.use_dynamic_bsz": To(f"{role}.use_dynamic_bsz"),
        f"{prefix}.ppo_max_token_len_per_gpu": To(f"{role}.ppo_max_token_len_per_gpu"),
        f"{prefix}.ulysses_sequence_parallel_size": Ignored(
            "no sequence parallelism in rlkube", _is(1, None), "sequence parallelism is not supported"
        ),
        f"{prefix}.use_torch_compile": Ignored(ENTROPY_COMPILE),
        f"{prefix}.checkpoint": Ignored("rlkube checkpoints model, optimizer and loop state"),
        f"{prefix}.use_remove_padding": Ignored("rlkube reads the model's use_remove_padding"),
        f"{prefix}.use_fused_kernels": Ignored("rlkube reads the model's use_fused_kernels"),
        f"{prefix}.entropy_from_logits_with_chunking": Ignored(PERF),
        f"{prefix}.entropy_checkpointing": Ignored(PERF),
        f"{prefix}.profiler": Ignored("profiling is a benchmark concern here"),
        f"{prefix}.strategy": To(f"{role}.strategy", _strategy),
    }


_ACTOR = "actor_rollout_ref.actor"
_REF = "actor_rollout_ref.ref"
_ROLLOUT = "actor_rollout_ref.rollout"
_MODEL = "actor_rollout_ref.model"

RULES: dict[str, Rule] = {
    # --- data ---------------------------------------------------------------------------------
    "data.train_files": To("data.train_files", _as_list),
    "data.val_files": To("data.val_files", lambda v: [] if v is None else _as_list(v)),
    "data.prompt_key": To("data.prompt_key"),
    "data.reward_fn_key": To("data.reward_fn_key"),
    "data.max_prompt_length": To("data.max_prompt_length"),
    "data.max_response_length": To("data.max_response_length"),
    "data.train_batch_size": To("data.train_batch_size"),
    "data.truncation": To("data.truncation"),
    "data.filter_overlong_prompts": To("data.filter_overlong_prompts"),
    "data.shuffle": To("data.shuffle"),
    "data.seed": To("data.seed"),
    "data.tokenizer": To("model.tokenizer_path"),
    "data.use_shm": Ignored("models are read from a mounted volume"),
    "data.val_batch_size": Ignored("deprecated in verl"),
    "data.gen_batch_size": Ignored(
        "each round of dynamic sampling generates data.train_batch_size prompts",
        _is(None),
        "gen_batch_size is not supported: rlkube generates data.train_batch_size prompts per round "
        "(algorithm.filter_groups draws more rounds until the batch is full)",
    ),
    "data.return_raw_input_ids": Ignored("rlkube's rows carry what its roles need"),
    "data.return_raw_chat": Ignored("rlkube's rows carry what its roles need"),
    "data.return_full_prompt": Ignored("rlkube's rows carry what its roles need"),
    "data.filter_overlong_prompts_workers": Ignored(PERF),
    "data.dataloader_num_workers": Ignored(PERF),
    "data.image_key": Ignored("text only", _is("images", None), "multimodal data is not supported"),
    "data.video_key": Ignored("text only", _is("videos", None), "multimodal data is not supported"),
    "data.trust_remote_code": To("model.trust_remote_code"),
    "data.custom_cls": Ignored(
        "rlkube reads verl's row format itself",
        lambda v: not v or not v.get("path"),
        "custom dataset classes are not supported",
    ),
    "data.sampler": Ignored("rlkube shuffles or keeps the order (data.shuffle)"),
    # --- model (actor, reference and rollout share it) ------------------------------------------
    f"{_MODEL}.path": To("model.path"),
    f"{_MODEL}.trust_remote_code": To("model.trust_remote_code"),
    f"{_MODEL}.enable_gradient_checkpointing": To("model.enable_gradient_checkpointing"),
    f"{_MODEL}.external_lib": Ignored("no extra imports", _falsy, "external_lib is not supported"),
    f"{_MODEL}.override_config": Ignored("model config is used as saved", _falsy, "override_config is not supported"),
    f"{_MODEL}.use_remove_padding": To("model.use_remove_padding"),
    f"{_MODEL}.use_fused_kernels": To("actor.recompute_logits", _recompute_logits),
    f"{_MODEL}.fused_kernel_options": Ignored("the backend of verl's fused kernels; rlkube's chunked LM head is torch"),
    f"{_MODEL}.use_liger": To("model.use_liger"),
    f"{_MODEL}.enable_activation_offload": Ignored(NO_OFFLOAD, _falsy, "activation offload is not supported"),
    f"{_MODEL}.use_shm": To("model.use_shm"),
    f"{_MODEL}.lora_rank": To("model.lora_rank"),
    f"{_MODEL}.lora_alpha": To("model.lora_alpha"),
    f"{_MODEL}.target_modules": To("model.target_modules"),
    f"{_MODEL}.exclude_modules": To("model.exclude_modules"),
    f"{_MODEL}.lora": Ignored(
        "Megatron's LoRA block; the FSDP keys are model.lora_*",
        lambda v: not v or not v.get("rank"),
        "model.lora.rank (Megatron's LoRA block) is not supported: set model.lora_rank",
    ),
    f"{_MODEL}.lora_adapter_path": Ignored(
        "LoRA adapters start fresh", _falsy, "lora_adapter_path (resuming from a saved adapter) is not supported"
    ),
    f"{_MODEL}.custom_chat_template": Ignored(
        "the tokenizer's chat template is used", _falsy, "custom_chat_template is not supported"
    ),
    "actor_rollout_ref.hybrid_engine": Ignored(
        "rlkube colocates rollout with the actor unless roles.rollout.placement is separate",
        _is(True),
        "hybrid_engine false is not supported; convert, then set roles.rollout.placement: separate",
    ),
    "actor_rollout_ref.nccl_timeout": To("trainer.nccl_timeout"),
    # --- actor --------------------------------------------------------------------------------
    **{
        f"{_ACTOR}.{k}": To(f"actor.{k}")
        for k in (
            "ppo_mini_batch_size",
            "ppo_micro_batch_size_per_gpu",
            "ppo_epochs",
            "shuffle",
            "clip_ratio",
            "clip_ratio_low",
            "clip_ratio_high",
            "clip_ratio_c",
            "loss_agg_mode",
            "loss_scale_factor",
            "entropy_coeff",
            "use_kl_loss",
            "kl_loss_coef",
            "kl_loss_type",
            "grad_clip",
            "tau_pos",
            "tau_neg",
        )
    },
    f"{_ACTOR}.policy_loss.loss_mode": To("actor.policy_loss"),
    # The settings of particular losses sit beside actor.policy_loss in rlkube.
    **{
        f"{_ACTOR}.policy_loss.{k}": To(f"actor.{k}")
        for k in ("clip_cov_ratio", "clip_cov_lb", "clip_cov_ub", "kl_cov_ratio", "ppo_kl_coef", "dro_beta")
    },
    # verl asserts it is set for the optimal token baselines; rlkube computes it when the estimator
    # takes it. verl's other use, the variance-proxy metrics of any estimator, rlkube does not report.
    f"{_ACTOR}.calculate_sum_pi_squared": Ignored(
        "the old log-prob pass computes sum_pi_squared when algorithm.adv_estimator needs it "
        "(optimal_token_baseline, tir_optimal_token_baseline)"
    ),
    f"{_ACTOR}.fsdp_config.fsdp_size": To("roles.actor.fsdp_size", _none_if_negative),
    **_micro_batch(_ACTOR),
    **_optim(f"{_ACTOR}.optim", "actor.optim"),
    **_fsdp(_ACTOR, "actor"),
    # The key verl's FSDP engine reads (the actor-level use_torch_compile reaches no code in 0.9.1).
    f"{_ACTOR}.fsdp_config.use_torch_compile": Ignored(ENTROPY_COMPILE),
    # --- reference ----------------------------------------------------------------------------
    f"{_REF}.strategy": Ignored("the reference runs where the actor runs", _is(*STRATEGIES), "only fsdp is supported"),
    f"{_REF}.log_prob_micro_batch_size": Ignored(DERIVED),
    f"{_REF}.log_prob_micro_batch_size_per_gpu": Ignored(DERIVED),
    f"{_REF}.log_prob_use_dynamic_bsz": Ignored(ACTOR_DECIDES),
    f"{_REF}.log_prob_max_token_len_per_gpu": To("ref.log_prob_max_token_len_per_gpu"),
    f"{_REF}.ulysses_sequence_parallel_size": Ignored(
        "no sequence parallelism in rlkube", _is(1, None), "sequence parallelism is not supported"
    ),
    f"{_REF}.use_torch_compile": Ignored(ENTROPY_COMPILE),
    f"{_REF}.entropy_from_logits_with_chunking": Ignored(PERF),
    f"{_REF}.entropy_checkpointing": Ignored(PERF),
    f"{_REF}.profiler": Ignored("profiling is a benchmark concern here"),
    **_fsdp(_REF, "ref", optimizer=False),
    f"{_REF}.fsdp_config.use_torch_compile": Ignored(ENTROPY_COMPILE),
    # --- rollout ------------------------------------------------------------------------------
    f"{_ROLLOUT}.name": To("rollout.name"),
    f"{_ROLLOUT}.n": To("rollout.n"),
    **{
        f"{_ROLLOUT}.{k}": To(f"rollout.{k}")
        for k in (
            "temperature",
            "top_k",
            "top_p",
            "ignore_eos",
            "gpu_memory_utilization",
            "dtype",
            "enforce_eager",
            "free_cache_engine",
            "calculate_log_probs",
            "update_weights_bucket_megabytes",
            "enable_prefix_caching",
            "max_num_seqs",
            "max_num_batched_tokens",
        )
    },
    f"{_ROLLOUT}.tensor_model_parallel_size": To("roles.rollout.tensor_parallel_size"),
    f"{_ROLLOUT}.mode": Ignored(
        "rlkube generates a batch at a time", _is("sync", None), "async rollout is not supported"
    ),
    f"{_ROLLOUT}.do_sample": Ignored("sampling", _is(True, None), "do_sample false: set rollout.temperature 0"),
    f"{_ROLLOUT}.prompt_length": Ignored("rlkube uses data.max_prompt_length"),
    f"{_ROLLOUT}.response_length": Ignored("rlkube uses data.max_response_length"),
    f"{_ROLLOUT}.load_format": Ignored("weights come from the actor"),
    f"{_ROLLOUT}.layered_summon": To("rollout.layered_summon"),
    f"{_ROLLOUT}.max_model_len": Ignored(DERIVED),
    f"{_ROLLOUT}.disable_log_stats": Ignored(PERF),
    f"{_ROLLOUT}.enable_chunked_prefill": Ignored(PERF),
    f"{_ROLLOUT}.log_prob_micro_batch_size": Ignored(DERIVED),
    f"{_ROLLOUT}.log_prob_micro_batch_size_per_gpu": Ignored(DERIVED),
    f"{_ROLLOUT}.log_prob_use_dynamic_bsz": Ignored(ACTOR_DECIDES),
    f"{_ROLLOUT}.log_prob_max_token_len_per_gpu": To("actor.log_prob_max_token_len_per_gpu"),
    f"{_ROLLOUT}.engine_kwargs": Ignored(PERF),
    f"{_ROLLOUT}.val_kwargs": Ignored(VAL),
    # Every key of the API's MultiTurnConfig is verl's own, under the same name.
    # config_map and sandbox are rlkube's (an RLJob's ConfigMap, the code interpreter's limits).
    **{
        f"{_ROLLOUT}.multi_turn.{k}": To(f"rollout.multi_turn.{k}")
        for k in MultiTurnConfig.model_fields
        if k not in ("config_map", "sandbox")
    },
    f"{_ROLLOUT}.multi_turn._target_": Ignored("verl's Hydra class"),
    f"{_ROLLOUT}.multi_turn.use_inference_chat_template": Ignored(
        "past turns keep the tokens the model sampled",
        _is(False, None),
        "use_inference_chat_template (re-rendering past turns) is not supported",
    ),
    f"{_ROLLOUT}.multi_turn.num_repeat_rollouts": Ignored(
        "rollout.n repeats each prompt", _is(None), "num_repeat_rollouts is not supported: set rollout.n"
    ),
    f"{_ROLLOUT}.agent": Ignored("no agent loop"),
    f"{_ROLLOUT}.profiler": Ignored("profiling is a benchmark concern here"),
    # --- critic -------------------------------------------------------------------------------
    "critic.enable": Ignored("the critic runs when algorithm.adv_estimator is gae"),
    "critic.rollout_n": Ignored(DERIVED),
    "critic.model.path": To("critic.model_path"),
    "critic.model.tokenizer_path": Ignored("the actor's tokenizer"),
    "critic.model.override_config": Ignored(
        "model config is used as saved", _falsy, "override_config is not supported"
    ),
    "critic.model.external_lib": Ignored("no extra imports", _falsy, "external_lib is not supported"),
    "critic.model.enable_gradient_checkpointing": Ignored("model.enable_gradient_checkpointing applies to both"),
    "critic.model.use_remove_padding": To("critic.use_remove_padding"),
    "critic.model.trust_remote_code": Ignored("model.trust_remote_code applies to both"),
    **{
        f"critic.model.{k}": To(f"critic.{k}") for k in ("lora_rank", "lora_alpha", "target_modules", "exclude_modules")
    },
    "critic.model.use_shm": Ignored("model.use_shm decides for every role"),
    "critic.model.use_fused_kernels": Ignored("the critic has no LM head (a value head on the last hidden states)"),
    "critic.model.lora": Ignored(
        "Megatron's LoRA block; the FSDP keys are critic.model.lora_*",
        lambda v: not v or not v.get("rank"),
        "critic.model.lora.rank (Megatron's LoRA block) is not supported: set critic.model.lora_rank",
    ),
    "critic.model.lora_adapter_path": Ignored(
        "LoRA adapters start fresh", _falsy, "lora_adapter_path (resuming from a saved adapter) is not supported"
    ),
    **{
        f"critic.{k}": To(f"critic.{k}")
        for k in (
            "ppo_mini_batch_size",
            "ppo_micro_batch_size_per_gpu",
            "ppo_epochs",
            "cliprange_value",
            "loss_agg_mode",
            "loss_scale_factor",
            "grad_clip",
        )
    },
    "critic.shuffle": Ignored("actor.shuffle decides"),
    "critic.forward_micro_batch_size": Ignored(DERIVED),
    "critic.forward_micro_batch_size_per_gpu": Ignored(DERIVED),
    "critic.forward_max_token_len_per_gpu": To("critic.forward_max_token_len_per_gpu"),
    **_micro_batch("critic"),
    **_optim("critic.optim", "critic.optim"),
    **_fsdp("critic.model", "critic"),
    "critic.model.fsdp_config.fsdp_size": Ignored("a colocated critic shards like the actor"),
    # --- reward -------------------------------------------------------------------------------
    "custom_reward_function.path": To("reward.function.path"),
    "custom_reward_function.name": To("reward.function.name"),
    "reward_model.enable": Ignored("reward.model is set from reward_model.model.path when enabled"),
    "reward_model.model.path": To("reward.model.path"),
    "reward_model.reward_manager": Ignored(
        "one score per response", _is("naive", None), "only the naive reward manager is supported"
    ),
    "reward_model.launch_reward_fn_async": Ignored(PERF),
    "reward_model.strategy": Ignored("the reward model runs where the actor runs"),
    "reward_model.model.input_tokenizer": Ignored("the actor's tokenizer"),
    "reward_model.model.external_lib": Ignored("no extra imports", _falsy, "external_lib is not supported"),
    "reward_model.model.use_remove_padding": To("reward.model.use_remove_padding"),
    "reward_model.model.trust_remote_code": Ignored("model.trust_remote_code applies"),
    "reward_model.model.fsdp_config": Ignored(FSDP),
    "reward_model.micro_batch_size": Ignored(DERIVED),
    "reward_model.micro_batch_size_per_gpu": Ignored(DERIVED),
    "reward_model.max_length": Ignored(DERIVED),
    "reward_model.ulysses_sequence_parallel_size": Ignored(
        "no sequence parallelism in rlkube", _is(1, None), "sequence parallelism is not supported"
    ),
    "reward_model.use_dynamic_bsz": To("reward.model.use_dynamic_bsz"),
    "reward_model.forward_max_token_len_per_gpu": To("reward.model.forward_max_token_len_per_gpu"),
    "reward_model.profiler": Ignored("profiling is a benchmark concern here"),
    "reward_model.sandbox_fusion": Ignored("no sandbox"),
    # --- algorithm ----------------------------------------------------------------------------
    **{
        f"algorithm.{k}": To(f"algorithm.{k}")
        for k in (
            "gamma",
            "lam",
            "adv_estimator",
            "norm_adv_by_std_in_grpo",
            "use_kl_in_reward",
            "kl_penalty",
        )
    },
    **{f"algorithm.kl_ctrl.{k}": To(f"algorithm.kl_ctrl.{k}") for k in ("type", "kl_coef", "horizon", "target_kl")},
    **{
        f"algorithm.rollout_correction.{k}": To(f"algorithm.rollout_correction.{k}")
        for k in (
            "rollout_is",
            "rollout_is_threshold",
            "rollout_rs",
            "rollout_rs_threshold",
            "bypass_mode",
            "loss_type",
            "rollout_is_batch_normalize",
        )
    },
    "algorithm.gdpo_reward_keys": To("algorithm.gdpo_reward_keys", lambda v: [] if v is None else list(v)),
    "algorithm.gdpo_reward_weights": To("algorithm.gdpo_reward_weights", lambda v: None if v is None else list(v)),
    "algorithm.use_pf_ppo": Ignored("no preference feedback", _falsy, "use_pf_ppo is not supported"),
    "algorithm.pf_ppo": Ignored("only read with use_pf_ppo"),
    # DAPO's dynamic sampling. verl's metric "reward" is the canonical pre-KL reward (its
    # rm_scores), rlkube's seq_reward (the overlong penalty included); other names are keys of the
    # reward's extra info in both.
    "algorithm.filter_groups._target_": Ignored("verl's Hydra class"),
    "algorithm.filter_groups.enable": To("algorithm.filter_groups.enable"),
    "algorithm.filter_groups.metric": To(
        "algorithm.filter_groups.metric", lambda v: "seq_reward" if v in (None, "reward") else v
    ),
    "algorithm.filter_groups.max_num_gen_batches": To("algorithm.filter_groups.max_num_gen_batches"),
    "algorithm.filter_groups.max_inflight_gen_batches": Ignored(
        "one generation round at a time",
        _is(1, None),
        "max_inflight_gen_batches above 1 (concurrent generation rounds) is not supported",
    ),
    # --- trainer ------------------------------------------------------------------------------
    **{
        f"trainer.{k}": To(f"trainer.{k}")
        for k in (
            "total_epochs",
            "total_training_steps",
            "project_name",
            "experiment_name",
            "logger",
            "save_freq",
            "test_freq",
            "device",
        )
    },
    # trainer.v1 (verl 0.9.1): the trainer mode and the staleness bound of the async modes.
    "trainer.use_v1": Ignored("rlkube has one trainer, which reads trainer.v1"),
    **{
        f"trainer.v1.{k}": To(f"trainer.v1.{k}")
        for k in (
            "trainer_mode",
            "colocate_async.num_warmup_batches",
            "separate_async.num_warmup_batches",
            "separate_async.parameter_sync_step",
            "sampler.max_off_policy_threshold",
            "sampler.max_off_policy_strategy",
        )
    },
    # async_training (verl's fully-async recipe): partial_rollout only; its other keys are refused.
    "async_training.partial_rollout": To("async_training.partial_rollout"),
    "trainer.v1.hybrid_rollout": Ignored("hybrid rollout is not implemented; no trainer_mode of rlkube reads it"),
    "trainer.default_local_dir": To("checkpoint.dir"),
    "trainer.resume_mode": To("checkpoint.resume", lambda v: {"resume_path": "auto"}.get(v, v)),  # see _finish
    "trainer.resume_from_path": Ignored("read with resume_mode resume_path"),
    "trainer.max_actor_ckpt_to_keep": To("checkpoint.max_actor_ckpt_to_keep"),
    "trainer.max_critic_ckpt_to_keep": To("checkpoint.max_critic_ckpt_to_keep"),
    "trainer.nnodes": To("roles.actor.replicas"),
    "trainer.n_gpus_per_node": To("roles.actor.gpus_per_replica"),
    "trainer.balance_batch": Ignored(PERF),
    "trainer.critic_warmup": Ignored("the actor trains from step 1", _is(0, None), "critic_warmup is not supported"),
    "trainer.log_val_generations": Ignored(VAL),
    "trainer.rollout_data_dir": Ignored(
        "metrics.jsonl holds the step metrics", _falsy, "dumping rollouts is not supported"
    ),
    "trainer.validation_data_dir": Ignored(VAL),
    "trainer.val_before_train": Ignored(VAL),
    "trainer.val_only": Ignored(VAL, _falsy, "val_only is not supported"),
    "trainer.default_hdfs_dir": Ignored("checkpoints stay on the checkpoint volume", _falsy, "HDFS is not supported"),
    "trainer.del_local_ckpt_after_load": Ignored("checkpoints stay on the checkpoint volume"),
    "trainer.ray_wait_register_center_timeout": Ignored("rlkube's driver waits for its nodes itself"),
    "trainer.esi_redundant_time": Ignored("no elastic server instances"),
    "trainer.use_legacy_worker_impl": Ignored("rlkube's workers are its own"),
    "trainer.profile_steps": Ignored("profiling is a benchmark concern here"),
    "trainer.controller_nsight_options": Ignored("profiling is a benchmark concern here"),
    "trainer.worker_nsight_options": Ignored("profiling is a benchmark concern here"),
    "trainer.npu_profile": Ignored("profiling is a benchmark concern here"),
    # Hydra's own bookkeeping in a composed config.
    "hydra": Ignored("Hydra's settings"),
    "defaults": Ignored("Hydra's defaults list (write the composed config)"),
    "ray_init": Ignored("Ray is started by rlkube"),
    "ray_kwargs": Ignored("Ray is started by rlkube"),
    "global_profiler": Ignored("profiling is a benchmark concern here"),
}


class VerlConfigError(ValueError):
    """A verl config that cannot be converted; `errors` name each key."""

    def __init__(self, source: str, errors: list[str]) -> None:
        self.source = source
        self.errors = errors
        super().__init__(f"{source}: cannot convert:\n" + "\n".join(f"  {e}" for e in errors))


@dataclass(frozen=True)
class Conversion:
    config: TrainerConfig
    mapped: list[tuple[str, str]]  # (verl key, rlkube key)
    ignored: list[tuple[str, str]]  # (verl key, why)

    def report(self) -> str:
        lines = [f"mapped {len(self.mapped)} keys:"]
        lines += [f"  {verl} -> {target}" for verl, target in self.mapped]
        lines.append(f"ignored {len(self.ignored)} keys (no counterpart, value has no effect here):")
        lines += [f"  {verl}: {why}" for verl, why in self.ignored]
        return "\n".join(lines)


# --- Hydra interpolation -----------------------------------------------------------------------------

_REF_PATTERN = re.compile(r"\$\{([^}]*)\}")


def _lookup(root: Mapping[str, Any], dotted: str) -> Any:
    node: Any = root
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            raise KeyError(dotted)
        node = node[part]
    return node


def resolve(root: Mapping[str, Any]) -> dict[str, Any]:
    """`${a.b}` references replaced by their values (a whole-value reference keeps its
    type); resolvers such as `${oc.env:X}` are refused by name."""
    errors: list[str] = []

    def value(node: Any, key: str, depth: int = 0) -> Any:
        if isinstance(node, Mapping):
            return {k: value(v, f"{key}.{k}" if key else str(k), depth) for k, v in node.items()}
        if isinstance(node, list):
            return [value(v, f"{key}[{i}]", depth) for i, v in enumerate(node)]
        if not isinstance(node, str) or "${" not in node:
            return node
        if depth > 10:
            errors.append(f"{key}: interpolation loops")
            return None
        refs = _REF_PATTERN.findall(node)
        for ref in refs:
            if ":" in ref:
                errors.append(f"{key}: Hydra resolver ${{{ref}}} is not supported; write the value")
                return None
        try:
            whole = _REF_PATTERN.fullmatch(node)
            if whole:
                return value(_lookup(root, whole.group(1)), key, depth + 1)
            return _REF_PATTERN.sub(lambda m: str(value(_lookup(root, m.group(1)), key, depth + 1)), node)
        except KeyError as missing:
            errors.append(f"{key}: ${{{missing.args[0]}}} names no key of this config")
            return None

    out = value(root, "")
    if errors:
        raise VerlConfigError("config", errors)
    assert isinstance(out, dict)
    return out


# --- conversion --------------------------------------------------------------------------------------


def _leaves(node: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """(dotted key, value) of every leaf; a mapping that has a rule of its own is one leaf
    (its rule judges it whole), as is an empty mapping."""
    out: list[tuple[str, Any]] = []
    for k, v in node.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, Mapping) and v and key not in RULES:
            out += _leaves(v, key)
        else:
            out.append((key, v))
    return out


def _set(tree: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    node = tree
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = value


def convert(verl: Mapping[str, Any], source: str = "config") -> Conversion:
    """The trainer config a verl config describes, and what was mapped and ignored."""
    try:
        resolved = resolve(verl)
    except VerlConfigError as error:
        raise VerlConfigError(source, error.errors) from None
    tree: dict[str, Any] = {}
    mapped: list[tuple[str, str]] = []
    ignored: list[tuple[str, str]] = []
    errors: list[str] = []
    for key, value in _leaves(resolved):
        rule = RULES.get(key)
        if rule is None:
            errors.append(f"{key}: unknown verl key (no rlkube counterpart known)")
            continue
        if isinstance(rule, Ignored):
            if not rule.accepts(value):
                errors.append(f"{key}: {rule.refusal} (got {value!r})")
            else:
                ignored.append((key, rule.why))
            continue
        try:
            converted = rule.convert(value) if rule.convert and value is not None else value
        except ValueError as error:
            errors.append(f"{key}: {error} (got {value!r})")
            continue
        if converted is None:
            ignored.append((key, "null: rlkube's default"))
            continue
        _set(tree, rule.target, converted)
        mapped.append((key, rule.target))
    errors += _finish(tree, resolved, mapped, ignored)
    if errors:
        raise VerlConfigError(source, errors)
    _place_roles(tree)
    try:
        config = parse_trainer_config(tree, source)
    except InvalidSpec as invalid:
        raise VerlConfigError(source, [f"after mapping, {e}" for e in invalid.errors]) from None
    return Conversion(config, mapped, ignored)


def _finish(
    tree: dict[str, Any], verl: Mapping[str, Any], mapped: list[tuple[str, str]], ignored: list[tuple[str, str]]
) -> list[str]:
    """What depends on more than one key: which reward source verl would use, resume paths."""
    errors: list[str] = []
    reward = tree.setdefault("reward", {})
    if not reward.get("function", {}).get("path"):
        reward.pop("function", None)  # a name without a path (verl's default name) selects nothing
    unused = "function" if (verl.get("reward_model") or {}).get("enable") else "model"
    if reward.pop(unused, None) is not None:
        dropped = [(k, t) for k, t in mapped if t.startswith(f"reward.{unused}.")]
        mapped[:] = [m for m in mapped if m not in dropped]
        why = "reward_model.enable wins" if unused == "function" else "reward_model.enable is false"
        ignored += [(k, why) for k, _ in dropped]
    trainer = verl.get("trainer") or {}
    if trainer.get("resume_mode") == "resume_path" and trainer.get("resume_from_path"):
        # resume auto + resumeFrom: the path seeds the run, and a restart after this run's own
        # first checkpoint resumes from that one, not from the seed again.
        _set(tree, "checkpoint.resume_from", trainer["resume_from_path"])
        mapped.append(("trainer.resume_from_path", "checkpoint.resume_from"))
    errors += _async_save(tree, verl, mapped, ignored)
    if not reward:
        errors.append(
            "custom_reward_function.path: required (verl's built-in scorers by data_source have no counterpart)"
        )
    return errors


def _async_save(
    tree: dict[str, Any], verl: Mapping[str, Any], mapped: list[tuple[str, str]], ignored: list[tuple[str, str]]
) -> list[str]:
    """actor.checkpoint.async_save becomes checkpoint.async_save (the rest of the section is
    ignored by its rule). One rlkube checkpoint holds every role, so the actor's key decides
    for all, as it decides verl's latest marker; a critic asking for it alone is refused."""
    actor = ((verl.get("actor_rollout_ref") or {}).get("actor") or {}).get("checkpoint") or {}
    critic = (verl.get("critic") or {}).get("checkpoint") or {}
    key = "actor_rollout_ref.actor.checkpoint.async_save"
    if actor.get("async_save") is not None:
        _set(tree, "checkpoint.async_save", bool(actor["async_save"]))
        mapped.append((key, "checkpoint.async_save"))
    if critic.get("async_save") and not actor.get("async_save"):
        return [
            "critic.checkpoint.async_save: one rlkube checkpoint holds every role, and "
            f"{key} decides for all: set it there (got critic true, actor false)"
        ]
    if critic.get("async_save") is not None:
        ignored.append(("critic.checkpoint.async_save", f"{key} decides for every role"))
    return []


def _place_roles(tree: dict[str, Any]) -> None:
    """verl's hybrid engine: every role in one pool of nnodes × n_gpus_per_node, so the
    reference, critic and reward model run inside the actor's workers, and so does rollout."""
    roles = tree.setdefault("roles", {})
    actor = roles.setdefault("actor", {})
    actor.setdefault("replicas", 1)
    actor.setdefault("gpus_per_replica", 8)
    algorithm = tree.setdefault("algorithm", {})
    algorithm.setdefault("adv_estimator", "gae")  # verl's default; rlkube's is grpo
    if algorithm.get("use_kl_in_reward") or tree.get("actor", {}).get("use_kl_loss"):
        roles["reference"] = {"colocate_with": "actor"}
    if algorithm["adv_estimator"] == "gae":
        roles["critic"] = {"colocate_with": "actor"}
    if "model" in tree["reward"]:
        roles["reward"] = {"colocate_with": "actor"}


# Where a converted RLJob mounts its checkpoint claim: verl's relative default_local_dir goes under it.
CHECKPOINT_MOUNT = "/checkpoints"


def checkpoint_claim_of(name: str) -> str:
    """The PersistentVolumeClaim a converted RLJob named `name` keeps its checkpoints on, unless told."""
    return f"{name}-checkpoints"


def to_rljob(config: TrainerConfig, name: str, image: str, checkpoint_claim: str | None = None) -> RLJob:
    """The same settings as an RLJob (camelCase, the Kubernetes fields added). Checkpoints
    without an object store go on a claim every pod mounts (`checkpoint_claim`, by default
    `checkpoint_claim_of(name)`): the driver and every actor rank write parts of each one,
    and verl's default_local_dir, a path on one machine, would be each pod's own."""
    spec = {**config.to_wire(), "image": image}
    if config.checkpoint.uri is None:
        local = PurePosixPath(config.checkpoint.dir)
        directory = local if local.is_absolute() else PurePosixPath(CHECKPOINT_MOUNT) / local
        claim = checkpoint_claim or checkpoint_claim_of(name)
        spec["checkpoint"] = {
            **spec["checkpoint"],
            "dir": str(directory),
            "volume": {"persistentVolumeClaim": {"claimName": claim}},
        }
    return parse_rljob({"metadata": {"name": name}, "spec": spec}, f"RLJob {name}")


# --- the command -----------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", type=Path, help="verl's config YAML (as Hydra composed it)")
    parser.add_argument("-o", "--output", type=Path, help="write here instead of standard output")
    parser.add_argument("--rljob", metavar="NAME", help="write an RLJob of this name instead of a trainer YAML")
    parser.add_argument("--image", default="rlkube-trainer:0.1.0", help="the RLJob's trainer image")
    parser.add_argument(
        "--checkpoint-claim",
        metavar="CLAIM",
        help="the RLJob's checkpoints go on this PersistentVolumeClaim (ReadWriteMany: every pod writes to it);"
        " default NAME-checkpoints; not used when the config sets an object store",
    )
    parser.add_argument("-q", "--quiet", action="store_true", help="do not list the mapped and ignored keys")


def run(args: argparse.Namespace) -> int:
    try:
        raw = yaml.safe_load(args.config.read_text())
    except OSError as error:
        print(f"error: {args.config}: cannot read: {error.strerror}", file=sys.stderr)
        return 2
    except yaml.YAMLError as error:
        print(f"error: {args.config}: not valid YAML: {error}", file=sys.stderr)
        return 2
    if not isinstance(raw, dict):
        print(f"error: {args.config}: expected a mapping of verl's sections", file=sys.stderr)
        return 2
    try:
        conversion = convert(raw, str(args.config))
        document = (
            to_rljob(conversion.config, args.rljob, args.image, args.checkpoint_claim).to_wire()
            if args.rljob
            else conversion.config.to_config()
        )
    except (VerlConfigError, InvalidSpec) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    text = yaml.safe_dump(document, sort_keys=False)
    if args.output:
        args.output.write_text(text)
    else:
        sys.stdout.write(text)
    if not args.quiet:
        print(conversion.report(), file=sys.stderr)
        volume = ((document.get("spec") or {}).get("checkpoint") or {}).get("volume") if args.rljob else None
        if volume:
            claim = volume["persistentVolumeClaim"]["claimName"]
            print(f"checkpoints: on PersistentVolumeClaim {claim} (create it, ReadWriteMany)", file=sys.stderr)
    return 0
