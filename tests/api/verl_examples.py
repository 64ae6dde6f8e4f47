"""verl configs as verl's examples compose them (its documented keys and defaults),
shared by the conversion tests and the API server's test of the converted RLJobs."""

from __future__ import annotations

import copy
from typing import Any

Obj = dict[str, Any]

# verl's examples/ppo_trainer/run_qwen2-7b_*.sh, as a composed config (Hydra's output).
PPO_GSM8K: Obj = {
    "data": {
        "tokenizer": None,
        "train_files": "/data/gsm8k/train.parquet",
        "val_files": "/data/gsm8k/test.parquet",
        "prompt_key": "prompt",
        "reward_fn_key": "data_source",
        "max_prompt_length": 512,
        "max_response_length": 512,
        "train_batch_size": 1024,
        "return_raw_input_ids": False,
        "return_raw_chat": False,
        "shuffle": True,
        "filter_overlong_prompts": True,
        "truncation": "error",
        "image_key": "images",
        "custom_cls": {"path": None, "name": None},
    },
    "actor_rollout_ref": {
        "hybrid_engine": True,
        "model": {
            "path": "/models/Qwen2.5-7B-Instruct",
            "external_lib": None,
            "override_config": {},
            "enable_gradient_checkpointing": True,
            "use_remove_padding": True,
            "trust_remote_code": False,
            "lora_rank": 0,
        },
        "actor": {
            "strategy": "fsdp",
            "ppo_mini_batch_size": 256,
            "ppo_micro_batch_size": None,
            "ppo_micro_batch_size_per_gpu": 16,
            "use_dynamic_bsz": False,
            "ppo_max_token_len_per_gpu": 16384,
            "grad_clip": 1.0,
            "clip_ratio": 0.2,
            "clip_ratio_c": 3.0,
            "loss_agg_mode": "token-mean",
            "entropy_coeff": 0,
            "use_kl_loss": False,
            "use_torch_compile": True,
            "kl_loss_coef": 0.001,
            "kl_loss_type": "low_var_kl",
            "ppo_epochs": 1,
            "shuffle": False,
            "ulysses_sequence_parallel_size": 1,
            "checkpoint": {"contents": ["model", "optimizer", "extra"]},
            "optim": {
                "lr": 1e-6,
                "lr_warmup_steps": -1,
                "lr_warmup_steps_ratio": 0.0,
                "min_lr_ratio": 0.0,
                "num_cycles": 0.5,
                "warmup_style": "constant",
                "total_training_steps": -1,
                "weight_decay": 0.01,
            },
            "fsdp_config": {
                "wrap_policy": {"min_num_params": 0},
                "param_offload": False,
                "optimizer_offload": False,
                "offload_policy": False,
                "reshard_after_forward": True,
                "fsdp_size": -1,
            },
        },
        "ref": {
            "strategy": "fsdp",
            "fsdp_config": {"param_offload": True, "wrap_policy": {"min_num_params": 0}},
            "log_prob_micro_batch_size": None,
            "log_prob_micro_batch_size_per_gpu": 32,
            "log_prob_use_dynamic_bsz": False,
            "log_prob_max_token_len_per_gpu": 16384,
            "ulysses_sequence_parallel_size": 1,
        },
        "rollout": {
            "name": "vllm",
            "mode": "sync",
            "temperature": 1.0,
            "top_k": -1,
            "top_p": 1,
            "prompt_length": "${data.max_prompt_length}",
            "response_length": "${data.max_response_length}",
            "dtype": "bfloat16",
            "gpu_memory_utilization": 0.6,
            "ignore_eos": False,
            "enforce_eager": True,
            "free_cache_engine": True,
            "load_format": "dummy_dtensor",
            "tensor_model_parallel_size": 2,
            "max_num_batched_tokens": 8192,
            "max_model_len": None,
            "max_num_seqs": 1024,
            "log_prob_micro_batch_size_per_gpu": 32,
            "disable_log_stats": True,
            "enable_chunked_prefill": True,
            "do_sample": True,
            "n": 1,
            "engine_kwargs": {"vllm": {"swap_space": None}},
            "val_kwargs": {"top_k": -1, "top_p": 1.0, "temperature": 0, "n": 1, "do_sample": False},
        },
    },
    "critic": {
        "rollout_n": "${actor_rollout_ref.rollout.n}",
        "strategy": "fsdp",
        "optim": {"lr": 1e-5, "lr_warmup_steps_ratio": 0.0, "min_lr_ratio": None, "warmup_style": "constant"},
        "model": {
            "path": "/models/Qwen2.5-7B-Instruct",
            "tokenizer_path": "${actor_rollout_ref.model.path}",
            "override_config": {},
            "external_lib": "${actor_rollout_ref.model.external_lib}",
            "enable_gradient_checkpointing": True,
            "use_remove_padding": True,
            "fsdp_config": {"param_offload": False, "optimizer_offload": False, "fsdp_size": -1},
        },
        "ppo_mini_batch_size": "${actor_rollout_ref.actor.ppo_mini_batch_size}",
        "ppo_micro_batch_size_per_gpu": 32,
        "forward_micro_batch_size_per_gpu": "${critic.ppo_micro_batch_size_per_gpu}",
        "use_dynamic_bsz": "${actor_rollout_ref.actor.use_dynamic_bsz}",
        "ppo_max_token_len_per_gpu": 32768,
        "ulysses_sequence_parallel_size": 1,
        "ppo_epochs": "${actor_rollout_ref.actor.ppo_epochs}",
        "shuffle": "${actor_rollout_ref.actor.shuffle}",
        "grad_clip": 1.0,
        "cliprange_value": 0.5,
    },
    "reward_model": {
        "enable": False,
        "strategy": "fsdp",
        "model": {"input_tokenizer": "${actor_rollout_ref.model.path}", "path": "/models/FsfairX-LLaMA3-RM"},
        "micro_batch_size_per_gpu": None,
        "max_length": None,
        "reward_manager": "naive",
    },
    "custom_reward_function": {"path": "/rewards/gsm8k.py", "name": "compute_score"},
    "algorithm": {
        "gamma": 1.0,
        "lam": 1.0,
        "adv_estimator": "gae",
        "norm_adv_by_std_in_grpo": True,
        "use_kl_in_reward": False,
        "kl_penalty": "kl",
        "kl_ctrl": {"type": "fixed", "kl_coef": 0.001, "horizon": 10000, "target_kl": 0.1},
    },
    "trainer": {
        "balance_batch": True,
        "total_epochs": 15,
        "total_training_steps": None,
        "project_name": "verl_example_gsm8k",
        "experiment_name": "qwen2_7b_function_rm",
        "logger": ["console", "wandb"],
        "log_val_generations": 0,
        "nnodes": 1,
        "n_gpus_per_node": 8,
        "save_freq": 10,
        "resume_mode": "auto",
        "resume_from_path": None,
        "val_before_train": True,
        "test_freq": 10,
        "critic_warmup": 0,
        "default_hdfs_dir": None,
        "del_local_ckpt_after_load": False,
        "default_local_dir": "checkpoints/${trainer.project_name}/${trainer.experiment_name}",
        "max_actor_ckpt_to_keep": None,
        "max_critic_ckpt_to_keep": None,
        "device": "cuda",
    },
}


def variant(**changes: Any) -> Obj:
    """PPO_GSM8K with dotted keys changed; a value of None deletes the key."""
    config = copy.deepcopy(PPO_GSM8K)
    for dotted, value in changes.items():
        *parents, leaf = dotted.replace("__", ".").split(".")
        node = config
        for part in parents:
            node = node.setdefault(part, {})
        if value is None:
            node.pop(leaf, None)
        else:
            node[leaf] = value
    return config


# verl's examples/grpo_trainer/run_qwen2-7b.sh: KL as a loss, 5 samples per prompt.
GRPO = variant(**{
    "algorithm.adv_estimator": "grpo",
    "actor_rollout_ref.actor.use_kl_loss": True,
    "actor_rollout_ref.actor.kl_loss_coef": 0.001,
    "actor_rollout_ref.actor.ppo_mini_batch_size": 256,
    "actor_rollout_ref.rollout.n": 5,
    "actor_rollout_ref.actor.fsdp_config.fsdp_size": 8,
})  # fmt: skip
# DAPO's recipe without dynamic sampling: clip-higher and token-level loss.
DAPO = variant(**{
    "algorithm.adv_estimator": "grpo",
    "algorithm.filter_groups": {"enable": False, "metric": "acc", "max_num_gen_batches": 10},
    "actor_rollout_ref.actor.clip_ratio_low": 0.2,
    "actor_rollout_ref.actor.clip_ratio_high": 0.28,
    "actor_rollout_ref.actor.clip_ratio_c": 10.0,
    "actor_rollout_ref.actor.loss_agg_mode": "token-mean",
    "actor_rollout_ref.rollout.n": 16,
    "trainer.nnodes": 2,
    "trainer.logger": ["console", "mlflow"],
})  # fmt: skip
# examples/reinforce_plus_plus_trainer: KL in the reward with an adaptive coefficient.
REINFORCE = variant(**{
    "algorithm.adv_estimator": "reinforce_plus_plus",
    "algorithm.use_kl_in_reward": True,
    "algorithm.kl_ctrl": {"type": "adaptive", "kl_coef": 0.002, "horizon": 5000, "target_kl": 0.05},
    "actor_rollout_ref.rollout.n": 4,
})  # fmt: skip
RLOO = variant(**{"algorithm.adv_estimator": "rloo", "actor_rollout_ref.rollout.n": 4})
# A reward model instead of a function (examples/ppo_trainer/run_deepseek_full_hh_rlhf.sh).
REWARD_MODEL = variant(**{"reward_model.enable": True})

EXAMPLES = {
    "ppo-gsm8k": PPO_GSM8K,
    "grpo": GRPO,
    "dapo": DAPO,
    "reinforce": REINFORCE,
    "rloo": RLOO,
    "rm": REWARD_MODEL,
}
