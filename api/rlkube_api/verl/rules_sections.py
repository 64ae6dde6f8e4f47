"""verl's other sections: data, critic, the reward (custom_reward_function, reward_model),
algorithm, trainer, and what Hydra and Ray add to a composed config."""

from __future__ import annotations

from rlkube_api.verl.keys import (
    DERIVED,
    FSDP,
    PERF,
    Ignored,
    Rule,
    To,
    as_list,
    falsy,
    fsdp_rules,
    megatron_rules,
    micro_batch_rules,
    one_of,
    optim_rules,
)

DATA_RULES: dict[str, Rule] = {
    "data.train_files": To("data.train_files", as_list),
    "data.val_files": To("data.val_files", lambda v: [] if v is None else as_list(v)),
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
    "data.val_batch_size": To("data.val_batch_size"),
    "data.gen_batch_size": Ignored(
        "each round of dynamic sampling generates data.train_batch_size prompts",
        one_of(None),
        "gen_batch_size is not supported: rlkube generates data.train_batch_size prompts per round "
        "(algorithm.filter_groups draws more rounds until the batch is full)",
    ),
    "data.return_raw_input_ids": Ignored("rlkube's rows carry what its roles need"),
    "data.return_raw_chat": Ignored("rlkube's rows carry what its roles need"),
    "data.return_full_prompt": Ignored("rlkube's rows carry what its roles need"),
    "data.filter_overlong_prompts_workers": Ignored(PERF),
    "data.dataloader_num_workers": Ignored(PERF),
    "data.image_key": Ignored("text only", one_of("images", None), "multimodal data is not supported"),
    "data.video_key": Ignored("text only", one_of("videos", None), "multimodal data is not supported"),
    "data.trust_remote_code": To("model.trust_remote_code"),
    "data.custom_cls": Ignored(
        "rlkube reads verl's row format itself",
        lambda v: not v or not v.get("path"),
        "custom dataset classes are not supported",
    ),
    "data.sampler": Ignored(
        "rlkube shuffles or keeps the order (data.shuffle)",
        lambda v: not v or not v.get("class_path"),
        "sampler classes of the user's own (data.sampler.class_path, curricula) are not supported",
    ),
}

CRITIC_RULES: dict[str, Rule] = {
    "critic.enable": Ignored("the critic runs when algorithm.adv_estimator is gae"),
    "critic.rollout_n": Ignored(DERIVED),
    "critic.model.path": To("critic.model_path"),
    "critic.model.tokenizer_path": Ignored("the actor's tokenizer"),
    "critic.model.override_config": Ignored("model config is used as saved", falsy, "override_config is not supported"),
    "critic.model.external_lib": Ignored("no extra imports", falsy, "external_lib is not supported"),
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
        "LoRA adapters start fresh", falsy, "lora_adapter_path (resuming from a saved adapter) is not supported"
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
    **micro_batch_rules("critic"),
    **megatron_rules("critic", None),
    **optim_rules("critic.optim", "critic.optim"),
    **fsdp_rules("critic.model", "critic"),
    # verl 0.9.1 moved the critic's FSDP settings from critic.model.fsdp_config to critic.fsdp.
    **fsdp_rules("critic", "critic", section="fsdp"),
    "critic.fsdp.fsdp_size": Ignored("a colocated critic shards like the actor"),
    "critic.model.fsdp_config.fsdp_size": Ignored("a colocated critic shards like the actor"),
}

REWARD_RULES: dict[str, Rule] = {
    # verl <= 0.8's sections (custom_reward_function, reward_model), still read by 0.9.1, which
    # moves any it finds set over its reward section (conversion._reward_sources does the same).
    "custom_reward_function.path": To("reward.function.path"),
    "custom_reward_function.name": To("reward.function.name"),
    "reward.custom_reward_function.path": To("reward.function.path"),
    "reward.custom_reward_function.name": To("reward.function.name"),
    # The processes scoring with the reward function (verl: its reward loop's workers); the
    # legacy reward_model.num_workers, where set, wins (conversion._reward_sources).
    "reward.num_workers": To("reward.num_workers"),
    "reward_model.num_workers": To("reward.num_workers"),
    "reward.reward_model.enable": Ignored("reward.model is set from reward.reward_model.model_path when enabled"),
    "reward.reward_model.model_path": To("reward.model.path"),
    "reward.reward_manager.name": Ignored(
        "one score per response", one_of("naive", None), "only the naive reward manager is supported"
    ),
    "reward_model.enable": Ignored("reward.model is set from reward_model.model.path when enabled"),
    "reward_model.model.path": To("reward.model.path"),
    "reward_model.reward_manager": Ignored(
        "one score per response", one_of("naive", None), "only the naive reward manager is supported"
    ),
    "reward_model.launch_reward_fn_async": Ignored(PERF),
    "reward_model.strategy": Ignored("the reward model runs where the actor runs"),
    "reward_model.model.input_tokenizer": Ignored("the actor's tokenizer"),
    "reward_model.model.external_lib": Ignored("no extra imports", falsy, "external_lib is not supported"),
    "reward_model.model.use_remove_padding": To("reward.model.use_remove_padding"),
    "reward_model.model.trust_remote_code": Ignored("model.trust_remote_code applies"),
    "reward_model.model.fsdp_config": Ignored(FSDP),
    "reward_model.micro_batch_size": Ignored(DERIVED),
    "reward_model.micro_batch_size_per_gpu": Ignored(DERIVED),
    "reward_model.max_length": Ignored(DERIVED),
    "reward_model.ulysses_sequence_parallel_size": Ignored(
        "no sequence parallelism in rlkube", one_of(1, None), "sequence parallelism is not supported"
    ),
    "reward_model.use_dynamic_bsz": To("reward.model.use_dynamic_bsz"),
    "reward_model.forward_max_token_len_per_gpu": To("reward.model.forward_max_token_len_per_gpu"),
    "reward_model.profiler": Ignored("profiling is a benchmark concern here"),
    "reward_model.sandbox_fusion": Ignored("no sandbox"),
}

ALGORITHM_RULES: dict[str, Rule] = {
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
    "algorithm.use_pf_ppo": Ignored("no preference feedback", falsy, "use_pf_ppo is not supported"),
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
        one_of(1, None),
        "max_inflight_gen_batches above 1 (concurrent generation rounds) is not supported",
    ),
}

TRAINER_RULES: dict[str, Rule] = {
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
    "trainer.critic_warmup": Ignored("the actor trains from step 1", one_of(0, None), "critic_warmup is not supported"),
    "trainer.log_val_generations": To("trainer.log_val_generations"),
    "trainer.rollout_data_dir": Ignored(
        "metrics.jsonl holds the step metrics", falsy, "dumping rollouts is not supported"
    ),
    "trainer.validation_data_dir": Ignored(
        "validation generations go to validation_generations.jsonl (trainer.log_val_generations rows)"
    ),
    "trainer.val_before_train": To("trainer.val_before_train"),
    "trainer.val_only": To("trainer.val_only"),
    "trainer.default_hdfs_dir": Ignored("checkpoints stay on the checkpoint volume", falsy, "HDFS is not supported"),
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
