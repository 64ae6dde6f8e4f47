"""`rlkube-trainer convert`: verl configs (written here from verl's documented keys, the
way its examples set them) become trainer YAMLs and RLJobs that rlkube's own loaders
accept; every key is reported mapped or ignored, and keys that would change the run
without a counterpart are refused by name."""

from __future__ import annotations

import copy
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from torch import nn

from rlkube_api.config import TrainerConfig
from rlkube_api.validation import load_trainer_config, parse_rljob
from rlkube_api.verl import RULES, To, VerlConfigError, convert, to_rljob
from rlkube_trainer.model.loading import apply_liger
from rlkube_trainer.pod.cli import main
from tests.api.verl_examples import DAPO, EXAMPLES, GRPO, PPO_GSM8K, REINFORCE, REWARD_MODEL, variant

Kubectl = Callable[..., subprocess.CompletedProcess[str]]
Obj = dict[str, Any]


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
    assert config.trainer.nccl_timeout == 300  # not in the example: rlkube's default


def test_nccl_timeout_arrives() -> None:
    verl = copy.deepcopy(PPO_GSM8K)
    verl["actor_rollout_ref"]["nccl_timeout"] = 1200
    assert convert(verl).config.trainer.nccl_timeout == 1200


def test_hydras_interpolations_resolve_as_omegaconf_resolves_them() -> None:
    """verl's yaml wires keys with ${a.b}, ${.sibling} and ${oc.select:a.b,fallback}."""
    config = convert(
        variant(
            **{
                "critic.ppo_micro_batch_size_per_gpu": "${oc.select:actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu,8}",
                "critic.ppo_epochs": "${oc.select:actor_rollout_ref.actor.nope,3}",
                "critic.forward_max_token_len_per_gpu": "${.ppo_max_token_len_per_gpu}",
                "critic.ppo_max_token_len_per_gpu": 12288,
                "actor_rollout_ref.model.tokenizer_path": "${actor_rollout_ref.model.path}",
            }
        )
    ).config
    assert config.critic.ppo_micro_batch_size_per_gpu == 16  # the actor's, found
    assert (config.critic.ppo_epochs, config.critic.forward_max_token_len_per_gpu) == (3, 12288)
    assert config.model.tokenizer_path == config.model.path == "/models/Qwen2.5-7B-Instruct"


def test_validation_settings_arrive() -> None:
    sampling = {"_target_": "verl.workers.config.SamplingConfig", "n": 4, "temperature": 0.6, "top_p": 0.95}
    changes = {
        "actor_rollout_ref.rollout.val_kwargs": {**sampling, "top_k": 20, "do_sample": True},
        "trainer.val_before_train": False,
        "trainer.val_only": True,
        "trainer.log_val_generations": 10,
        "data.val_batch_size": 64,
    }
    config = convert(variant(**changes)).config
    val = config.rollout.val_kwargs
    assert (val.n, val.temperature, val.top_p, val.top_k, val.do_sample) == (4, 0.6, 0.95, 20, True)
    assert (config.trainer.val_before_train, config.trainer.val_only, config.trainer.log_val_generations) == (
        False,
        True,
        10,
    )
    assert config.data.val_batch_size == 64


def test_without_a_reward_function_path_the_built_in_scorers_score() -> None:
    result = convert(variant(**{"custom_reward_function": None}))
    assert result.config.reward.function is None and result.config.reward.model is None


def test_verl_091s_reward_section_is_read_and_its_legacy_sections_win() -> None:
    """verl 0.9.1 reads reward.custom_reward_function and reward.reward_model, and moves the
    legacy custom_reward_function (any key set) and reward_model keys (each one set) over them."""
    new_layout = {
        "custom_reward_function": {"path": None, "name": None},
        "reward": {"custom_reward_function": {"path": "/rewards/new.py", "name": "score"}},
    }
    function = convert(variant(**new_layout)).config.reward.function
    assert function is not None and (function.path, function.name) == ("/rewards/new.py", "score")
    legacy_wins = {**new_layout, "custom_reward_function": {"path": "/rewards/old.py", "name": None}}
    function = convert(variant(**legacy_wins)).config.reward.function
    assert function is not None and (function.path, function.name) == ("/rewards/old.py", "compute_score")
    model = {
        "custom_reward_function": None,
        "reward_model": None,
        "reward": {"reward_model": {"enable": True, "model_path": "/models/rm"}},
    }
    config = convert(variant(**model)).config
    assert config.reward.model is not None and config.reward.model.path == "/models/rm"
    assert config.roles.reward is not None


def test_the_reward_loops_worker_count_is_the_reward_functions_processes() -> None:
    """verl's reward.num_workers (its legacy reward_model.num_workers wins where set) is
    reward.numWorkers; with a reward model, which scores on its ranks, it is ignored."""
    assert convert(variant(**{"reward.num_workers": 4})).config.reward.num_workers == 4
    legacy = convert(variant(**{"reward.num_workers": 4, "reward_model.num_workers": 2}))
    assert legacy.config.reward.num_workers == 2
    model = {"custom_reward_function": None, "reward_model.enable": True, "reward_model.model.path": "/models/rm"}
    result = convert(variant(**model, **{"reward.num_workers": 4}))
    assert result.config.reward.num_workers is None
    assert ("reward.num_workers", "a reward model scores on its ranks, not in worker processes") in result.ignored


def test_the_critic_section_is_read_only_where_a_critic_runs() -> None:
    changes = {"algorithm.adv_estimator": "grpo", "actor_rollout_ref.rollout.n": 4, "critic.model.path": "~/models/x"}
    result = convert(variant(**changes))
    assert result.config.roles.critic is None and result.config.critic.model_path is None
    assert ("critic.model.path", "no critic runs: algorithm.adv_estimator is not gae") in result.ignored


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


def test_verl_091_loss_and_estimator_keys_arrive() -> None:
    config = convert(
        variant(
            **{
                "algorithm.adv_estimator": "reinforce_plus_plus_baseline",
                "actor_rollout_ref.rollout.n": 4,  # a group estimator
                "actor_rollout_ref.actor.loss_agg_mode": "seq-mean-token-sum-norm",
                "actor_rollout_ref.actor.loss_scale_factor": 4096,
                "actor_rollout_ref.actor.kl_loss_type": "k3+",
                "actor_rollout_ref.actor.tau_pos": 1.2,
                "actor_rollout_ref.actor.tau_neg": 1.5,
                "actor_rollout_ref.actor.policy_loss": {
                    "loss_mode": "clip_cov",
                    "clip_cov_ratio": 0.001,
                    "clip_cov_lb": 0.5,
                    "clip_cov_ub": 4.0,
                    "kl_cov_ratio": 0.002,
                    "ppo_kl_coef": 0.2,
                    "dro_beta": 0.3,
                },
                "actor_rollout_ref.actor.calculate_sum_pi_squared": False,
            }
        )
    ).config
    actor = config.actor
    assert config.algorithm.adv_estimator == "reinforce_plus_plus_baseline"
    assert (actor.loss_agg_mode, actor.loss_scale_factor, actor.kl_loss_type) == (
        "seq-mean-token-sum-norm",
        4096,
        "k3+",
    )
    assert (actor.tau_pos, actor.tau_neg, actor.policy_loss) == (1.2, 1.5, "clip_cov")
    assert (actor.clip_cov_ratio, actor.clip_cov_lb, actor.clip_cov_ub) == (0.001, 0.5, 4.0)
    assert (actor.kl_cov_ratio, actor.ppo_kl_coef, actor.dro_beta) == (0.002, 0.2, 0.3)
    # The critic's section is read where a critic runs (gae, PPO_GSM8K's estimator).
    assert convert(variant(**{"critic.loss_scale_factor": 2048})).config.critic.loss_scale_factor == 2048
    gdpo = convert(
        variant(
            **{
                "algorithm.adv_estimator": "gdpo",
                "actor_rollout_ref.rollout.n": 4,
                "algorithm.gdpo_reward_keys": ["format", "acc"],
                "algorithm.gdpo_reward_weights": [1.0, 0.5],
            }
        )
    ).config.algorithm
    assert (gdpo.adv_estimator, gdpo.gdpo_reward_keys, gdpo.gdpo_reward_weights) == (
        "gdpo",
        ["format", "acc"],
        [1.0, 0.5],
    )


@pytest.mark.parametrize("estimator", ["remax", "optimal_token_baseline", "tir_optimal_token_baseline"])
def test_estimators_with_inputs_of_their_own_convert(estimator: str) -> None:
    """ReMax's greedy rollout and the token baselines' sum_pi_squared are produced by the trainer;
    verl's switch for the latter (which its optimal token baselines require) is accepted."""
    config = convert(
        variant(
            **{
                "algorithm.adv_estimator": estimator,
                "actor_rollout_ref.rollout.n": 4,
                "actor_rollout_ref.actor.calculate_sum_pi_squared": estimator != "remax",
            }
        )
    ).config
    assert config.algorithm.adv_estimator == estimator


def test_fsdp_settings_arrive_for_each_role() -> None:
    config = convert(
        variant(
            **{
                "actor_rollout_ref.actor.fsdp_config.param_offload": True,
                "actor_rollout_ref.actor.fsdp_config.optimizer_offload": True,
                "actor_rollout_ref.actor.fsdp_config.model_dtype": "bfloat16",
                "actor_rollout_ref.actor.fsdp_config.reshard_after_forward": False,
                "actor_rollout_ref.ref.fsdp_config.param_offload": True,
                "actor_rollout_ref.ref.fsdp_config.optimizer_offload": True,  # no optimizer: ignored
                "critic.model.fsdp_config.optimizer_offload": True,
                "critic.model.fsdp_config.mixed_precision": {"param_dtype": "fp32", "reduce_dtype": "fp32"},
                "actor_rollout_ref.rollout.enable_prefix_caching": False,
                "actor_rollout_ref.rollout.max_num_seqs": 512,
                "actor_rollout_ref.rollout.max_num_batched_tokens": 16384,
            }
        )
    ).config
    actor = config.actor.fsdp_config
    assert (actor.param_offload, actor.model_dtype, actor.reshard_after_forward) == (True, "bf16", False)
    assert actor.optimizer_offload is True and config.critic.fsdp_config.optimizer_offload is True
    assert config.ref.fsdp_config.param_offload is True and config.ref.fsdp_config.optimizer_offload is False
    assert config.critic.fsdp_config.mixed_precision.param_dtype == "fp32"
    rollout = config.rollout
    assert (rollout.enable_prefix_caching, rollout.max_num_seqs, rollout.max_num_batched_tokens) == (False, 512, 16384)


def test_megatron_and_ulysses_sizes_become_the_actors_layout() -> None:
    """verl's megatron engine sizes and Ulysses: the actor's become its roles' fields; the reference
    and the critic, in the actor's workers, run in the actor's layout."""
    result = convert(
        variant(
            **{
                "actor_rollout_ref.actor.strategy": "megatron",
                "actor_rollout_ref.actor.megatron": {
                    "tensor_model_parallel_size": 2,
                    "pipeline_model_parallel_size": 2,
                    "virtual_pipeline_model_parallel_size": 2,
                },
                "actor_rollout_ref.actor.ulysses_sequence_parallel_size": 2,
                "actor_rollout_ref.ref.megatron": {"tensor_model_parallel_size": 2},
                "actor_rollout_ref.ref.ulysses_sequence_parallel_size": 2,
                "critic.megatron": {"pipeline_model_parallel_size": 2},
                "critic.ulysses_sequence_parallel_size": 2,
            }
        )
    )
    actor = result.config.roles.actor
    layout = (actor.tensor_parallel_size, actor.pipeline_parallel_size, actor.virtual_pipeline_parallel_size)
    assert layout == (2, 2, 2) and actor.ulysses_sequence_parallel_size == 2
    ignored = dict(result.ignored)
    assert "actor's parallel layout" in ignored["actor_rollout_ref.ref.megatron.tensor_model_parallel_size"]
    assert "actor's parallel layout" in ignored["critic.megatron.pipeline_model_parallel_size"]


REFUSED = [
    ("unknown-key", {"actor_rollout_ref.actor.use_magic": True}, "actor_rollout_ref.actor.use_magic: unknown verl key"),
    ("unknown-section", {"fancy": {"x": 1}}, "fancy.x: unknown verl key"),
    ("fp16", {"actor_rollout_ref.actor.fsdp_config.model_dtype": "fp16"}, "actor_rollout_ref.actor.fsdp_config.model_dtype: only bf16 and fp32"),
    ("lora-adapter-path", {"actor_rollout_ref.model.lora_adapter_path": "/a"}, "actor_rollout_ref.model.lora_adapter_path: lora_adapter_path"),
    ("megatron-lora", {"actor_rollout_ref.model.lora": {"rank": 8}}, "actor_rollout_ref.model.lora: model.lora.rank"),
    ("lora-regex", {"actor_rollout_ref.model.lora_rank": 8, "actor_rollout_ref.model.target_modules": ".*proj"}, "regular expression"),
    ("strategy-unknown", {"actor_rollout_ref.actor.strategy": "deepspeed"}, "actor_rollout_ref.actor.strategy: only fsdp, fsdp2 and megatron"),
    ("context-parallel", {"actor_rollout_ref.actor.megatron.context_parallel_size": 2}, "actor_rollout_ref.actor.megatron.context_parallel_size: context_parallel_size above 1 is not supported"),
    ("expert-parallel", {"critic.megatron.expert_model_parallel_size": 4}, "critic.megatron.expert_model_parallel_size: expert parallelism is not supported"),
    ("megatron-only-option", {"actor_rollout_ref.actor.megatron.use_dist_checkpointing": True}, "actor_rollout_ref.actor.megatron.use_dist_checkpointing: True is not verl 0.9.1's default"),
    ("layout-does-not-divide", {"actor_rollout_ref.actor.megatron.pipeline_model_parallel_size": 3}, "roles.actor.tensor_parallel_size: tensorParallelSize × pipelineParallelSize"),
    ("dapo-concurrent-rounds", {"algorithm.filter_groups": {"enable": True, "max_inflight_gen_batches": 2}}, "algorithm.filter_groups.max_inflight_gen_batches: max_inflight_gen_batches"),
    ("dapo-gen-batch-size", {"data.gen_batch_size": 96}, "data.gen_batch_size: gen_batch_size is not supported"),
    ("missing-interpolation", {"critic.ppo_epochs": "${actor_rollout_ref.actor.nope}"}, "critic.ppo_epochs: Interpolation key 'actor_rollout_ref.actor.nope' not found"),
    ("environment", {"trainer.default_local_dir": "${oc.env:HOME}/ckpt"}, "trainer.default_local_dir: ${oc.env:...} would read the environment of the machine that converts"),
    ("hydra-resolver", {"trainer.default_local_dir": "${hydra:runtime.output_dir}/ckpt"}, "trainer.default_local_dir: Unsupported interpolation type hydra"),
    ("mandatory", {"actor_rollout_ref.rollout.name": "???"}, "actor_rollout_ref.rollout.name: ??? (verl requires a value"),
    ("not-verls-default", {"data.train_max_samples": 100}, "data.train_max_samples: 100 is not verl 0.9.1's default (-1), and rlkube has no counterpart"),
    ("not-verls-default-mapping", {"data.apply_chat_template_kwargs": {"enable_thinking": False}}, "data.apply_chat_template_kwargs: {'enable_thinking': False} is not verl 0.9.1's default ({})"),
    ("agent-loop", {"actor_rollout_ref.rollout.agent": {"default_agent_loop": "react_agent"}}, "actor_rollout_ref.rollout.agent.default_agent_loop: only verl's single_turn_agent and tool_agent"),
    ("agent-loop-file", {"actor_rollout_ref.rollout.agent": {"agent_loop_config_path": "/loops.yaml"}}, "actor_rollout_ref.rollout.agent.agent_loop_config_path: agent loops of the user's own"),
    ("curriculum", {"data.sampler": {"class_path": "/curriculum.py", "class_name": "Easy"}}, "data.sampler: sampler classes of the user's own"),
    ("reward-manager", {"reward.reward_manager.name": "dapo"}, "reward.reward_manager.name: only the naive reward manager"),
    ("unknown-estimator", {"algorithm.adv_estimator": "ppo2"}, "algorithm.adv_estimator"),
    ("gdpo-without-keys", {"algorithm.adv_estimator": "gdpo"}, "gdpoRewardKeys"),
    ("multi-turn-format", {"actor_rollout_ref.rollout.multi_turn": {"enable": True, "function_tool_path": "/t.py", "format": "llama3_json"}}, "format"),
    ("multi-turn-sanity-check", {"actor_rollout_ref.rollout.multi_turn": {"enable": True, "function_tool_path": "/t.py", "tokenization_sanity_check_mode": "disable"}}, "tokenization_sanity_check_mode"),
    ("multi-turn-reinference", {"actor_rollout_ref.rollout.multi_turn.use_inference_chat_template": True}, "actor_rollout_ref.rollout.multi_turn.use_inference_chat_template: use_inference_chat_template"),
    ("multi-turn-repeats", {"actor_rollout_ref.rollout.multi_turn.num_repeat_rollouts": 2}, "num_repeat_rollouts is not supported"),
    ("multi-turn-without-tools", {"actor_rollout_ref.rollout.multi_turn.enable": True}, "needs tools"),
]  # fmt: skip


def test_multi_turn_keys_map_to_rollout_multi_turn() -> None:
    """verl 0.9.1's rollout.multi_turn block as its yaml writes it (defaults, a tool file, limits)."""
    section = {
        "_target_": "verl.workers.config.MultiTurnConfig",
        "enable": True,
        "max_assistant_turns": 4,
        "tool_config_path": None,
        "function_tool_path": "/tools/lookup.py",
        "max_user_turns": 3,
        "max_parallel_calls": 2,
        "max_tool_response_length": 128,
        "tool_response_truncate_side": "left",
        "use_inference_chat_template": False,
        "tokenization_sanity_check_mode": "strict",
        "format": "hermes",
        "num_repeat_rollouts": None,
    }
    result = convert(variant(**{"actor_rollout_ref.rollout.multi_turn": section}))
    multi_turn = result.config.rollout.multi_turn
    assert multi_turn.enable and multi_turn.function_tool_path == "/tools/lookup.py"
    assert (multi_turn.max_assistant_turns, multi_turn.max_user_turns, multi_turn.max_parallel_calls) == (4, 3, 2)
    assert (multi_turn.max_tool_response_length, multi_turn.tool_response_truncate_side) == (128, "left")
    assert multi_turn.tool_config_path is None
    assert ("actor_rollout_ref.rollout.multi_turn.enable", "rollout.multi_turn.enable") in result.mapped


def test_multi_turn_interaction_config_path_is_mapped() -> None:
    """verl 0.5-0.8's interaction_config_path runs rlkube's interactions (rollout/agent/interaction.py)."""
    section = {"enable": True, "function_tool_path": "/t.py", "interaction_config_path": "/i.yaml"}
    result = convert(variant(**{"actor_rollout_ref.rollout.multi_turn": section}))
    assert result.config.rollout.multi_turn.interaction_config_path == "/i.yaml"


@pytest.mark.parametrize(("changes", "message"), [r[1:] for r in REFUSED], ids=[r[0] for r in REFUSED])
def test_what_has_no_counterpart_is_refused_by_name(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(VerlConfigError) as caught:
        convert(variant(**changes), "verl.yaml")
    assert any(message in e for e in caught.value.errors), caught.value.errors
    assert str(caught.value).startswith("verl.yaml: cannot convert")


def test_all_unknown_keys_are_named_at_once() -> None:
    with pytest.raises(VerlConfigError) as caught:
        convert(variant(**{"data.a": 1, "trainer.b": 2}))
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
    assert "actor_rollout_ref.model.use_remove_padding -> model.use_remove_padding" in report
    assert config.model.use_remove_padding


def test_the_command_refuses_naming_file_and_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "verl.yaml"
    source.write_text(yaml.safe_dump(variant(**{"trainer.mystery": 1})))
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
    # verl's default_local_dir (a path on one machine) goes on a claim every pod mounts.
    assert job.spec.checkpoint.volume is not None
    assert job.spec.checkpoint.volume.to_pod() == {"persistentVolumeClaim": {"claimName": "dapo-qwen-checkpoints"}}
    assert job.spec.checkpoint.dir.startswith("/checkpoints/checkpoints/"), job.spec.checkpoint.dir


def test_a_converted_rljob_keeps_its_checkpoints_where_it_is_told(tmp_path: Path) -> None:
    source = tmp_path / "verl.yaml"
    source.write_text(yaml.safe_dump(variant(**{"trainer.default_local_dir": "/mnt/ckpt/run"})))
    to_claim = to_rljob(convert(yaml.safe_load(source.read_text())).config, "a", "i:1", "shared-rwx")
    volume = to_claim.spec.checkpoint.volume
    assert (to_claim.spec.checkpoint.dir, volume and volume.to_pod()) == (
        "/mnt/ckpt/run",
        {"persistentVolumeClaim": {"claimName": "shared-rwx"}},
    )


def test_the_example_recipe_converts() -> None:
    example = Path(__file__).resolve().parents[2] / "examples" / "verl" / "grpo-gsm8k.yaml"
    config = convert(yaml.safe_load(example.read_text()), str(example)).config
    assert (config.algorithm.adv_estimator, config.rollout.n, config.roles.rollout.tensor_parallel_size) == (
        "grpo",
        5,
        2,
    )


def test_optimizer_offload_alone_arrives() -> None:
    """verl's optimizer_offload without param_offload: the state alone leaves the GPU between updates."""
    config = convert(variant(**{"actor_rollout_ref.actor.fsdp_config.optimizer_offload": True})).config
    fsdp = config.actor.fsdp_config
    assert (fsdp.optimizer_offload, fsdp.param_offload) == (True, False)


def test_trainer_v1_keys_arrive_and_what_is_not_supported_is_refused_by_name() -> None:
    verl = copy.deepcopy(PPO_GSM8K)
    verl["trainer"]["use_v1"] = True
    verl["trainer"]["v1"] = {
        "trainer_mode": "sync",
        "separate_async": {"parameter_sync_step": 2, "num_warmup_batches": 1},
        "sampler": {"max_off_policy_threshold": 3, "max_off_policy_strategy": "wait"},
    }
    v1 = convert(verl).config.trainer.v1
    assert (v1.trainer_mode, v1.separate_async.parameter_sync_step) == ("sync", 2)
    assert (v1.sampler.max_off_policy_threshold, v1.sampler.max_off_policy_strategy) == (3, "wait")
    verl["trainer"]["v1"]["colocate_async"] = {"num_warmup_batches": 1.5}
    with pytest.raises(Exception, match=r"num_warmup_batches|numWarmupBatches"):
        convert(verl)
    del verl["trainer"]["v1"]["colocate_async"]
    verl["trainer"]["v1"]["trainer_mode"] = "separate_async"  # the example's rollout is colocated
    with pytest.raises(Exception, match="separate_async needs separate rollout pods"):
        convert(verl)


@pytest.mark.parametrize(("fused", "recompute"), [(True, "always"), (False, "auto")])
def test_use_fused_kernels_maps_to_recompute_logits(fused: bool, recompute: str) -> None:
    """verl's fused kernels recompute the LM head's chunks in the backward (rlkube's always);
    without them verl keeps the logits, which auto does when they fit."""
    conversion = convert(
        variant(**{"actor_rollout_ref.model.use_fused_kernels": fused, "critic.model.use_fused_kernels": fused})
    )
    assert conversion.config.actor.recompute_logits == recompute
    assert ("actor_rollout_ref.model.use_fused_kernels", "actor.recompute_logits") in conversion.mapped
    assert "no LM head" in dict(conversion.ignored)["critic.model.use_fused_kernels"]


def test_use_torch_compile_is_not_the_decoder_layer_compile() -> None:
    """verl's use_torch_compile compiles its entropy helper only: ignored, with the reason, and the
    decoder layers stay uncompiled."""
    keys = [
        f"actor_rollout_ref.{role}.{where}use_torch_compile"
        for role in ("actor", "ref")
        for where in ("", "fsdp_config.")
    ]
    conversion = convert(variant(**dict.fromkeys(keys, True)))
    why = dict(conversion.ignored)
    for key in keys:
        assert "entropy-from-logits helper only" in why[key], key
    assert not conversion.config.actor.compile_decoder_layers
    assert conversion.config.ref.compile_decoder_layers is None


def test_use_liger_arrives_and_needs_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    conversion = convert(variant(**{"actor_rollout_ref.model.use_liger": True}))
    assert conversion.config.model.use_liger
    assert ("actor_rollout_ref.model.use_liger", "model.use_liger") in conversion.mapped
    monkeypatch.setitem(sys.modules, "liger_kernel", None)  # not importable
    with pytest.raises(RuntimeError, match="liger-kernel"):
        apply_liger(nn.Linear(2, 2))


def test_resume_from_path_seeds_the_run_and_checkpoints_to_keep_arrive_per_role() -> None:
    """verl's resume_path mode becomes resume auto + resumeFrom: a restart after the run's own
    first checkpoint resumes from that one, not from the seed again."""
    verl = copy.deepcopy(PPO_GSM8K)
    verl["trainer"].update(
        {
            "resume_mode": "resume_path",
            "resume_from_path": "/ckpt/other/step_000100",
            "max_actor_ckpt_to_keep": 2,
            "max_critic_ckpt_to_keep": 4,
        }
    )
    checkpoint = convert(verl).config.checkpoint
    assert (checkpoint.resume, checkpoint.resume_from) == ("auto", "/ckpt/other/step_000100")
    assert (checkpoint.max_actor_ckpt_to_keep, checkpoint.max_critic_ckpt_to_keep) == (2, 4)


def test_lora_keys_arrive() -> None:
    """verl 0.9.1's LoRA keys (actor_rollout_ref.model.*, critic.model.*, rollout.layered_summon)."""
    config = convert(
        variant(
            **{
                "actor_rollout_ref.model.lora_rank": 32,
                "actor_rollout_ref.model.lora_alpha": 64,
                "actor_rollout_ref.model.target_modules": "all-linear",
                "actor_rollout_ref.model.exclude_modules": ["lm_head", "mlp.down_proj"],
                "actor_rollout_ref.model.use_shm": True,
                "actor_rollout_ref.model.lora_adapter_path": None,
                "actor_rollout_ref.model.lora": {"rank": 0, "alpha": 32},
                "actor_rollout_ref.rollout.layered_summon": True,
                "critic.model.lora_rank": 8,
                "critic.model.lora_alpha": 16,
                "critic.model.target_modules": ["q_proj", "v_proj"],
                "critic.model.exclude_modules": None,
            }
        )
    ).config
    model = config.model
    assert (model.lora_rank, model.lora_alpha, model.use_shm) == (32, 64, True)
    assert model.target_modules == ["all-linear"] and model.exclude_modules == ["lm_head", "mlp.down_proj"]
    assert config.rollout.layered_summon is True
    critic = config.critic
    assert (critic.lora_rank, critic.lora_alpha, critic.target_modules, critic.exclude_modules) == (
        8,
        16,
        ["q_proj", "v_proj"],
        [],
    )


def test_async_save_arrives_from_the_actors_checkpoint_section() -> None:
    """verl's actor_rollout_ref.actor.checkpoint.async_save is checkpoint.async_save; one rlkube
    checkpoint holds every role, so a critic asking for it without the actor is refused."""
    assert convert(PPO_GSM8K).config.checkpoint.async_save is False  # verl's default, and ours
    both = convert(
        variant(**{"actor_rollout_ref.actor.checkpoint.async_save": True, "critic.checkpoint.async_save": True})
    )
    assert both.config.checkpoint.async_save is True
    assert ("actor_rollout_ref.actor.checkpoint.async_save", "checkpoint.async_save") in both.mapped
    assert "critic.checkpoint.async_save" in dict(both.ignored)
    with pytest.raises(VerlConfigError, match=r"critic\.checkpoint\.async_save: one rlkube checkpoint"):
        convert(variant(**{"critic.checkpoint.async_save": True}))
