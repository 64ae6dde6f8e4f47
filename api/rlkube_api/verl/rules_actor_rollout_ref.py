"""verl's actor_rollout_ref section: the model the actor, the reference and rollout share, and
each of the three."""

from __future__ import annotations

from rlkube_api.config import MultiTurnConfig
from rlkube_api.verl.keys import (
    ACTOR_DECIDES,
    COLOCATED_LAYOUT,
    DERIVED,
    ENTROPY_COMPILE,
    NO_OFFLOAD,
    PERF,
    STRATEGIES,
    Ignored,
    Rule,
    To,
    falsy,
    fsdp_rules,
    megatron_rules,
    micro_batch_rules,
    none_if_negative,
    one_of,
    optim_rules,
    to_recompute_logits,
)

_ACTOR = "actor_rollout_ref.actor"
_REF = "actor_rollout_ref.ref"
_ROLLOUT = "actor_rollout_ref.rollout"
_MODEL = "actor_rollout_ref.model"

ACTOR_ROLLOUT_REF_RULES: dict[str, Rule] = {
    # The model (actor, reference and rollout share it).
    f"{_MODEL}.path": To("model.path"),
    f"{_MODEL}.trust_remote_code": To("model.trust_remote_code"),
    # verl 0.9.1's HFModelConfig: the tokenizer's own directory (data.tokenizer is the older key).
    f"{_MODEL}.tokenizer_path": To("model.tokenizer_path"),
    f"{_MODEL}.enable_gradient_checkpointing": To("model.enable_gradient_checkpointing"),
    f"{_MODEL}.external_lib": Ignored("no extra imports", falsy, "external_lib is not supported"),
    f"{_MODEL}.override_config": Ignored("model config is used as saved", falsy, "override_config is not supported"),
    f"{_MODEL}.use_remove_padding": To("model.use_remove_padding"),
    f"{_MODEL}.use_fused_kernels": To("actor.recompute_logits", to_recompute_logits),
    f"{_MODEL}.fused_kernel_options": Ignored("the backend of verl's fused kernels; rlkube's chunked LM head is torch"),
    f"{_MODEL}.use_liger": To("model.use_liger"),
    f"{_MODEL}.enable_activation_offload": Ignored(NO_OFFLOAD, falsy, "activation offload is not supported"),
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
        "LoRA adapters start fresh", falsy, "lora_adapter_path (resuming from a saved adapter) is not supported"
    ),
    f"{_MODEL}.custom_chat_template": Ignored(
        "the tokenizer's chat template is used", falsy, "custom_chat_template is not supported"
    ),
    "actor_rollout_ref.hybrid_engine": Ignored(
        "rlkube colocates rollout with the actor unless roles.rollout.placement is separate",
        one_of(True),
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
    f"{_ACTOR}.fsdp_config.fsdp_size": To("roles.actor.fsdp_size", none_if_negative),
    **micro_batch_rules(_ACTOR),
    **megatron_rules(_ACTOR, "actor"),
    **optim_rules(f"{_ACTOR}.optim", "actor.optim"),
    **fsdp_rules(_ACTOR, "actor"),
    # The key verl's FSDP engine reads (the actor-level use_torch_compile reaches no code in 0.9.1).
    f"{_ACTOR}.fsdp_config.use_torch_compile": Ignored(ENTROPY_COMPILE),
    # --- reference ----------------------------------------------------------------------------
    f"{_REF}.strategy": Ignored(
        "the reference runs where the actor runs", one_of(*STRATEGIES), "only fsdp, fsdp2 and megatron are supported"
    ),
    f"{_REF}.log_prob_micro_batch_size": Ignored(DERIVED),
    f"{_REF}.log_prob_micro_batch_size_per_gpu": Ignored(DERIVED),
    f"{_REF}.log_prob_use_dynamic_bsz": Ignored(ACTOR_DECIDES),
    f"{_REF}.log_prob_max_token_len_per_gpu": To("ref.log_prob_max_token_len_per_gpu"),
    f"{_REF}.ulysses_sequence_parallel_size": Ignored(COLOCATED_LAYOUT),
    **megatron_rules(_REF, None),
    f"{_REF}.use_torch_compile": Ignored(ENTROPY_COMPILE),
    f"{_REF}.entropy_from_logits_with_chunking": Ignored(PERF),
    f"{_REF}.entropy_checkpointing": Ignored(PERF),
    f"{_REF}.profiler": Ignored("profiling is a benchmark concern here"),
    **fsdp_rules(_REF, "ref", optimizer=False),
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
    # verl 0.9.1 moved the weight-sync bucket under checkpoint_engine.
    f"{_ROLLOUT}.checkpoint_engine.update_weights_bucket_megabytes": To("rollout.update_weights_bucket_megabytes"),
    f"{_ROLLOUT}.tensor_model_parallel_size": To("roles.rollout.tensor_parallel_size"),
    # verl 0.9.1 accepts only async (its rollout replicas are vLLM/SGLang servers the agent loop
    # sends requests to); sync, its older in-process engine, generated the same samples.
    f"{_ROLLOUT}.mode": Ignored(
        "how verl reaches its engine; rlkube's rollout workers run theirs (trainer.v1.trainer_mode "
        "decides when generation overlaps training)",
        one_of("async", "sync", None),
        "only verl's rollout modes async and sync are known",
    ),
    f"{_ROLLOUT}.do_sample": Ignored("sampling", one_of(True, None), "do_sample false: set rollout.temperature 0"),
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
    # Validation's sampling: rlkube's rollout.val_kwargs, under verl's names.
    **{
        f"{_ROLLOUT}.val_kwargs.{k}": To(f"rollout.val_kwargs.{k}")
        for k in ("n", "temperature", "top_p", "top_k", "do_sample")
    },
    f"{_ROLLOUT}.val_kwargs._target_": Ignored("verl's Hydra class"),
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
        one_of(False, None),
        "use_inference_chat_template (re-rendering past turns) is not supported",
    ),
    f"{_ROLLOUT}.multi_turn.num_repeat_rollouts": Ignored(
        "rollout.n repeats each prompt", one_of(None), "num_repeat_rollouts is not supported: set rollout.n"
    ),
    # verl's agent loops by name: rlkube's one rollout loop runs one turn or many
    # (rollout.multi_turn.enable decides), as single_turn_agent and tool_agent do.
    f"{_ROLLOUT}.agent._target_": Ignored("verl's Hydra class"),
    f"{_ROLLOUT}.agent.num_workers": Ignored(PERF),
    f"{_ROLLOUT}.agent.default_agent_loop": Ignored(
        "rlkube's rollout loop runs one turn or many (rollout.multi_turn.enable decides)",
        one_of("single_turn_agent", "tool_agent", None),
        "only verl's single_turn_agent and tool_agent loops have a counterpart",
    ),
    f"{_ROLLOUT}.agent.agent_loop_config_path": Ignored(
        "no agent loops of the user's own", falsy, "agent loops of the user's own are not supported"
    ),
    f"{_ROLLOUT}.profiler": Ignored("profiling is a benchmark concern here"),
}
