"""`rlkube-trainer convert`: verl configs (written here from verl's documented keys, the
way its examples set them) become trainer YAMLs and RLJobs that rlkube's own loaders
accept; every key is reported mapped or ignored, and keys that would change the run
without a counterpart are refused by name."""

from __future__ import annotations

import copy
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from rlkube_api.config import TrainerConfig
from rlkube_api.validation import load_trainer_config, parse_rljob
from rlkube_trainer.cli import main
from rlkube_trainer.verl_config import RULES, To, VerlConfigError, convert, to_rljob

Kubectl = Callable[..., subprocess.CompletedProcess[str]]
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


def _variant(**changes: Any) -> Obj:
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
GRPO = _variant(**{
    "algorithm.adv_estimator": "grpo",
    "actor_rollout_ref.actor.use_kl_loss": True,
    "actor_rollout_ref.actor.kl_loss_coef": 0.001,
    "actor_rollout_ref.actor.ppo_mini_batch_size": 256,
    "actor_rollout_ref.rollout.n": 5,
    "actor_rollout_ref.actor.fsdp_config.fsdp_size": 8,
})  # fmt: skip
# DAPO's recipe without dynamic sampling: clip-higher and token-level loss.
DAPO = _variant(**{
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
REINFORCE = _variant(**{
    "algorithm.adv_estimator": "reinforce_plus_plus",
    "algorithm.use_kl_in_reward": True,
    "algorithm.kl_ctrl": {"type": "adaptive", "kl_coef": 0.002, "horizon": 5000, "target_kl": 0.05},
    "actor_rollout_ref.rollout.n": 4,
})  # fmt: skip
RLOO = _variant(**{"algorithm.adv_estimator": "rloo", "actor_rollout_ref.rollout.n": 4})
# A reward model instead of a function (examples/ppo_trainer/run_deepseek_full_hh_rlhf.sh).
REWARD_MODEL = _variant(**{"reward_model.enable": True})

EXAMPLES = {
    "ppo-gsm8k": PPO_GSM8K,
    "grpo": GRPO,
    "dapo": DAPO,
    "reinforce": REINFORCE,
    "rloo": RLOO,
    "rm": REWARD_MODEL,
}


@pytest.mark.parametrize("name", EXAMPLES)
def test_every_key_is_mapped_or_ignored_and_the_config_is_valid(name: str) -> None:
    result = convert(EXAMPLES[name])
    reported = {k for k, _ in result.mapped} | {k for k, _ in result.ignored}
    assert "actor_rollout_ref.model.path" in reported
    assert result.config.model.path == "/models/Qwen2.5-7B-Instruct"
    assert "mapped" in result.report() and "ignored" in result.report()


def test_ppo_maps_verls_values_to_rlkubes_keys() -> None:
    config = convert(PPO_GSM8K).config
    assert config.algorithm.adv_estimator == "gae"
    assert config.roles.critic is not None and config.roles.critic.colocate_with == "actor"
    assert config.roles.reference is None
    assert (config.roles.actor.replicas, config.roles.actor.gpus_per_replica) == (1, 8)
    assert config.roles.rollout.tensor_parallel_size == 2
    assert config.roles.rollout.placement == "colocated"
    assert config.data.train_files == ["/data/gsm8k/train.parquet"]
    assert config.data.train_batch_size == 1024
    assert config.actor.ppo_micro_batch_size_per_gpu == 16
    assert config.actor.optim.lr_warmup_steps == 0  # verl's -1: use the ratio
    assert config.critic.optim.lr == 1e-5
    assert config.critic.ppo_mini_batch_size == 256  # through ${actor_rollout_ref.actor.ppo_mini_batch_size}
    assert config.critic.model_path == "/models/Qwen2.5-7B-Instruct"
    assert config.reward.function is not None and config.reward.function.path == "/rewards/gsm8k.py"
    assert config.reward.model is None  # reward_model.enable is false
    assert config.trainer.logger == ["console", "wandb"]
    assert config.checkpoint.dir == "checkpoints/verl_example_gsm8k/qwen2_7b_function_rm"
    assert config.rollout.gpu_memory_utilization == 0.6


def test_grpo_dapo_reinforce_and_reward_model_settings_arrive() -> None:
    grpo = convert(GRPO).config
    assert (grpo.algorithm.adv_estimator, grpo.rollout.n, grpo.actor.use_kl_loss) == ("grpo", 5, True)
    assert grpo.roles.reference is not None and grpo.roles.critic is None
    assert grpo.roles.actor.fsdp_size == 8
    dapo = convert(DAPO).config
    assert (dapo.actor.clip_ratio_low, dapo.actor.clip_ratio_high, dapo.actor.clip_ratio_c) == (0.2, 0.28, 10.0)
    assert dapo.roles.actor.replicas == 2
    assert dapo.trainer.logger == ["console", "mlflow"]
    reinforce = convert(REINFORCE).config
    assert reinforce.algorithm.use_kl_in_reward and reinforce.algorithm.kl_ctrl.type == "adaptive"
    assert reinforce.algorithm.kl_ctrl.target_kl == 0.05
    assert reinforce.roles.reference is not None
    rm = convert(REWARD_MODEL).config
    assert rm.reward.model is not None and rm.reward.model.path == "/models/FsfairX-LLaMA3-RM"
    assert rm.reward.function is None and rm.roles.reward is not None


REFUSED = [
    ("unknown-key", {"actor_rollout_ref.actor.use_magic": True}, "actor_rollout_ref.actor.use_magic: unknown verl key"),
    ("unknown-section", {"fancy": {"x": 1}}, "fancy.x: unknown verl key"),
    ("param-offload", {"actor_rollout_ref.actor.fsdp_config.param_offload": True}, "actor_rollout_ref.actor.fsdp_config.param_offload: parameter offload is not supported"),
    ("lora", {"actor_rollout_ref.model.lora_rank": 32}, "actor_rollout_ref.model.lora_rank: LoRA is not supported"),
    ("megatron", {"actor_rollout_ref.actor.strategy": "megatron"}, "actor_rollout_ref.actor.strategy: only fsdp and fsdp2"),
    ("sequence-parallel", {"critic.ulysses_sequence_parallel_size": 2}, "critic.ulysses_sequence_parallel_size: sequence parallelism"),
    ("dynamic-sampling", {"algorithm.filter_groups": {"enable": True}}, "algorithm.filter_groups: DAPO's filter_groups"),
    ("no-reward", {"custom_reward_function.path": None}, "custom_reward_function.path: required"),
    ("missing-interpolation", {"critic.ppo_epochs": "${actor_rollout_ref.actor.nope}"}, "critic.ppo_epochs: ${actor_rollout_ref.actor.nope} names no key"),
    ("resolver", {"trainer.default_local_dir": "${oc.env:HOME}/ckpt"}, "trainer.default_local_dir: Hydra resolver ${oc.env:HOME}"),
    ("unknown-estimator", {"algorithm.adv_estimator": "remax"}, "algorithm.adv_estimator"),
]  # fmt: skip


@pytest.mark.parametrize(("changes", "message"), [r[1:] for r in REFUSED], ids=[r[0] for r in REFUSED])
def test_what_has_no_counterpart_is_refused_by_name(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(VerlConfigError) as caught:
        convert(_variant(**changes), "verl.yaml")
    assert any(message in e for e in caught.value.errors), caught.value.errors
    assert str(caught.value).startswith("verl.yaml: cannot convert")


def test_all_unknown_keys_are_named_at_once() -> None:
    with pytest.raises(VerlConfigError) as caught:
        convert(_variant(**{"data.a": 1, "trainer.b": 2}))
    assert [e.split(":")[0] for e in caught.value.errors] == ["data.a", "trainer.b"]


def test_every_target_is_a_key_of_rlkubes_config() -> None:
    def has(model: Any, dotted: str) -> bool:
        first, _, rest = dotted.partition(".")
        fields = model.model_fields
        if first not in fields:
            return False
        if not rest:
            return True
        annotation = fields[first].annotation
        inner = [a for a in getattr(annotation, "__args__", (annotation,)) if hasattr(a, "model_fields")]
        return any(has(m, rest) for m in inner)

    targets = {rule.target for rule in RULES.values() if isinstance(rule, To)}
    missing = sorted(t for t in targets if not has(TrainerConfig, t))
    assert not missing


def test_the_command_writes_a_trainer_yaml_rlkube_loads(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source, out = tmp_path / "verl.yaml", tmp_path / "trainer.yaml"
    source.write_text(yaml.safe_dump(GRPO))
    assert main(["convert", str(source), "-o", str(out)]) == 0
    config = load_trainer_config(out)
    assert config.rollout.n == 5
    report = capsys.readouterr().err
    assert "actor_rollout_ref.rollout.n -> rollout.n" in report
    assert "actor_rollout_ref.model.use_remove_padding:" in report


def test_the_command_refuses_naming_file_and_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "verl.yaml"
    source.write_text(yaml.safe_dump(_variant(**{"trainer.mystery": 1})))
    assert main(["convert", str(source)]) == 2
    err = capsys.readouterr().err
    assert f"{source}: cannot convert" in err and "trainer.mystery: unknown verl key" in err
    assert main(["convert", str(tmp_path / "missing.yaml")]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_the_command_writes_an_rljob(tmp_path: Path) -> None:
    source, out = tmp_path / "verl.yaml", tmp_path / "rljob.yaml"
    source.write_text(yaml.safe_dump(DAPO))
    assert (
        main(
            [
                "convert",
                str(source),
                "--rljob",
                "dapo-qwen",
                "--image",
                "registry.example/rlkube:1",
                "-o",
                str(out),
                "-q",
            ]
        )
        == 0
    )
    job = parse_rljob(yaml.safe_load(out.read_text()))
    assert job.metadata.name == "dapo-qwen" and job.spec.image == "registry.example/rlkube:1"
    assert yaml.safe_load(out.read_text())["spec"]["rollout"]["samplesPerPrompt"] == 16


@pytest.mark.cluster
@pytest.mark.parametrize("name", EXAMPLES)
def test_the_api_server_admits_the_converted_rljobs(
    kubectl: Kubectl, rljob_crd: None, namespace: str, name: str
) -> None:
    job = to_rljob(convert(EXAMPLES[name]).config, f"verl-{name}", "rlkube-trainer:0.1.0").to_wire()
    result = kubectl("create", "--dry-run=server", "-n", namespace, "-f", "-", input=yaml.safe_dump(job), check=False)
    assert result.returncode == 0, result.stderr
