"""Every field of the trainer's config takes effect: set to a valid value other than its
default, it changes the effective settings the trainer reports at start (loop/effective_settings.py,
read from the objects it built), or it is in EXCEPTIONS, which says why and which test proves it.

The run is built as `rlkube-trainer run --in-process` builds it (driver.assembled: the real
builders, the ranks as objects in this process), on CPU, with the tiny task's model, and not
trained. The rank's roles are built once per distinct rank-side config (`_RankCache`); the rollout
engine is not started: its arguments are those a GPU rank would start vLLM with
(rollout.engine_arguments), which is what the report holds.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import yaml
from pydantic import BaseModel, ValidationError

from rlkube_api.config import TrainerConfig
from rlkube_api.placement import Group, Role, placement_of
from rlkube_trainer.cluster.rank_group import LocalRankGroup, RankGroup
from rlkube_trainer.loop.assembly import free_port
from rlkube_trainer.loop.driver import assembled
from rlkube_trainer.loop.effective_settings import run_settings
from rlkube_trainer.rollout import engine_arguments
from rlkube_trainer.tiny.task import init, write_dataset
from rlkube_trainer.workers.rank import Rank, RankSpec

pytestmark = pytest.mark.trainer

STEPS = 20
EXCEPTIONS: dict[str, str] = {
    "roles.": "pod placement and sizes are the operator's: tests/api/test_fields_take_effect.py walks "
    "them against the children it builds",
    "reward.function.config_map.": "the operator mounts the ConfigMap and hands the trainer its path "
    "(tests/operator/test_builders.py)",
    "reward.remote.": "the remote verifier's settings, read where reward.remote is set "
    "(tests/trainer/test_reward_remote.py runs it against a local HTTP server)",
    "reward.model.": "the reward model's settings, read by its ranks (tests/trainer/test_reward_model_roles.py)",
    "rollout.multi_turn.": "the agent loop's settings: tests/trainer/test_agent_*.py run episodes with "
    "each (test_agent_sandbox_fields.py: every sandbox limit reaches the tool)",
    "async_training.partial_rollout": "needs the vLLM engine started (refused with hf): "
    "tests/trainer/test_async_learning.py",
    "trainer.v1.colocate_async.num_warmup_batches": "only 1 is accepted, what the one-step-off schedule "
    "does; another value is refused by name",
    "trainer.v1.separate_async.num_warmup_batches": "as trainer.v1.colocate_async.num_warmup_batches",
    "checkpoint.adopt": "read where a run belongs to an RLJob (tests/trainer/test_checkpoint_owner.py)",
    "checkpoint.uri": "an object store: tests/trainer/test_checkpoint_s3.py runs against a local S3 server",
    "checkpoint.endpoint_url": "as checkpoint.uri",
    "checkpoint.resume": "read when the loop resumes (TrainingRun.resume): tests/trainer/test_checkpoint.py",
    "checkpoint.resume_from": "as checkpoint.resume",
    "ref.fsdp_config.optimizer_offload": "refused unless false: the reference has no optimizer",
    "ref.fsdp_config.mixed_precision.": "refused unless at the defaults: the reference computes in the "
    "dtype it loads in and reduces no gradients (tests/api/test_models.py)",
    "ref.fsdp_config.model_dtype": "refused unless fp32: the reference has no master weights",
    "model.use_liger": "needs the liger-kernel package, absent here and refused by name "
    "(tests/trainer/test_preflight.py)",
    "model.trust_remote_code": "the tiny model has no remote code; passed to every from_pretrained",
    "data.prompt_key": "the data files' column names: tests/trainer/test_data.py reads files with other keys",
    "data.reward_fn_key": "as data.prompt_key",
    "data.ground_truth_key": "as data.prompt_key",
    "data.extra_info_key": "as data.prompt_key",
    "data.apply_chat_template": "the tiny tokenizer has no chat template: tests/trainer/test_data.py",
    "data.val_batch_size": "the chunks validation generates in: tests/trainer/test_validation.py",
    "trainer.project_name": "MLflow's experiment and W&B's project: tests/trainer/test_tracking.py",
    "trainer.device": "auto is the CPU on a machine without a GPU; the report's ranks.*.device is the one used",
    "trainer.v1.separate_async.": "the asynchronous schedule's, built when the loop starts it: "
    "tests/trainer/test_async_schedule.py",
    "trainer.v1.sampler.": "the off-policy buffer's, built when the loop starts: tests/trainer/test_staleness.py, "
    "test_async_learning.py",
}
# Fields that need a particular valid value, or other fields set with them (the baseline gets the
# same companions): path -> (value, companions). "{name}" in a string is a file of the fixture.
LORA = {"model.lora_rank": 4}
CRITIC_LORA = {"critic.lora_rank": 4}
SHORT_PROMPTS = {"data.max_prompt_length": 3, "data.truncation": "right"}
# A harness drives the rollout (no process starts: the run is built, not trained).
HARNESS = {"rollout.harness.command": ["{harness}"]}
# Accepted and ignored, found by this walk and not fixed yet (docs/design.md, "Known gaps"):
# the test also fails once one of them takes effect (the list is then stale).
KNOWN_IGNORED: dict[str, str] = {}
FSDP_FIELDS: dict[str, Any] = {
    "mixed_precision.param_dtype": "fp32",
    "mixed_precision.reduce_dtype": "bf16",
    "model_dtype": "bf16",
    "param_offload": True,
    "reshard_after_forward": False,
    "optimizer_offload": True,
}
# FSDP2 applies over the one-rank process group the walk forms (`process_group`).
FSDP2: dict[str, dict[str, Any]] = {
    "actor": {"actor.strategy": "fsdp2"},
    "critic": {"critic.strategy": "fsdp2"},
    "ref": {"actor.strategy": "fsdp2", "actor.use_kl_loss": True},
}
VALUES: dict[str, tuple[Any, dict[str, Any]]] = {
    **{
        f"{role}.fsdp_config.{leaf}": (value, companions)
        for role, companions in FSDP2.items()
        for leaf, value in FSDP_FIELDS.items()
        if (role, leaf) != ("ref", "optimizer_offload")
    },
    "model.path": ("{model_link}", {}),
    "model.tokenizer_path": ("{model_link}", {}),
    "model.lora_alpha": (8, LORA),
    "model.target_modules": (["q_proj", "v_proj"], LORA),
    "model.exclude_modules": (["o_proj"], LORA),
    "critic.lora_alpha": (8, CRITIC_LORA),
    "critic.target_modules": (["q_proj", "v_proj"], CRITIC_LORA),
    "critic.exclude_modules": (["o_proj"], CRITIC_LORA),
    "critic.model_path": ("{model_link}", {}),
    "data.train_files": (["{other_data}"], {}),
    "data.val_files": (["{other_data}"], {}),
    "data.truncation": ("left", SHORT_PROMPTS),
    # Prompts of 3 tokens beside the task's of 4: at a limit of 3 the task's are dropped, or cut.
    "data.filter_overlong_prompts": (True, {**SHORT_PROMPTS, "data.train_files": ["{short_data}", "{other_data}"]}),
    "algorithm.norm_adv_by_std_in_grpo": (False, {"algorithm.adv_estimator": "grpo"}),
    "algorithm.gdpo_reward_keys": (
        ["acc", "format"],
        {"algorithm.adv_estimator": "gdpo", "algorithm.gdpo_reward_keys": ["acc"]},
    ),
    "algorithm.gdpo_reward_weights": (
        [2.0, 1.0],
        {"algorithm.adv_estimator": "gdpo", "algorithm.gdpo_reward_keys": ["acc", "format"]},
    ),
    "algorithm.kl_penalty": ("k1", {"algorithm.use_kl_in_reward": True}),
    "algorithm.kl_ctrl.target_kl": (0.05, {"algorithm.use_kl_in_reward": True, "algorithm.kl_ctrl.type": "adaptive"}),
    "algorithm.kl_ctrl.horizon": (100, {"algorithm.use_kl_in_reward": True, "algorithm.kl_ctrl.type": "adaptive"}),
    "algorithm.filter_groups.metric": ("seq_reward", {"algorithm.filter_groups.enable": True}),
    "algorithm.filter_groups.max_num_gen_batches": (3, {"algorithm.filter_groups.enable": True}),
    "algorithm.rollout_correction.rollout_is": ("token", {}),
    "algorithm.rollout_correction.rollout_is_threshold": (3.0, {"algorithm.rollout_correction.rollout_is": "token"}),
    "algorithm.rollout_correction.rollout_is_batch_normalize": (
        True,
        {"algorithm.rollout_correction.rollout_is": "token"},
    ),
    "algorithm.rollout_correction.rollout_rs": (
        "token_k1",
        {"algorithm.rollout_correction.rollout_rs_threshold": "0.5_2.0"},
    ),
    "algorithm.rollout_correction.rollout_rs_threshold": (
        "0.5_3.0",
        {
            "algorithm.rollout_correction.rollout_rs": "token_k1",
            "algorithm.rollout_correction.rollout_rs_threshold": "0.5_2.0",
        },
    ),
    "algorithm.rollout_correction.loss_type": ("reinforce", {"algorithm.rollout_correction.bypass_mode": True}),
    "actor.optim.betas": ([0.8, 0.99], {}),
    "critic.optim.betas": ([0.8, 0.99], {}),
    "actor.optim.min_lr_ratio": (0.1, {"actor.optim.warmup_style": "cosine"}),
    "critic.optim.min_lr_ratio": (0.1, {"critic.optim.warmup_style": "cosine"}),
    "actor.ppo_max_token_len_per_gpu": (1024, {"actor.use_dynamic_bsz": True}),
    "actor.log_prob_max_token_len_per_gpu": (1024, {"actor.use_dynamic_bsz": True}),
    "critic.ppo_max_token_len_per_gpu": (1024, {"critic.use_dynamic_bsz": True}),
    "critic.forward_max_token_len_per_gpu": (1024, {"critic.use_dynamic_bsz": True}),
    "ref.log_prob_max_token_len_per_gpu": (1024, {"actor.use_kl_loss": True, "actor.use_dynamic_bsz": True}),
    "actor.kl_loss_coef": (0.01, {"actor.use_kl_loss": True}),
    "actor.kl_loss_type": ("kl", {"actor.use_kl_loss": True}),
    "actor.tau_pos": (0.5, {"actor.policy_loss": "sapo"}),
    "actor.tau_neg": (0.5, {"actor.policy_loss": "sapo"}),
    "actor.clip_cov_ratio": (0.001, {"actor.policy_loss": "clip_cov"}),
    "actor.clip_cov_lb": (0.5, {"actor.policy_loss": "clip_cov"}),
    "actor.clip_cov_ub": (2.5, {"actor.policy_loss": "clip_cov"}),
    "actor.kl_cov_ratio": (0.001, {"actor.policy_loss": "kl_cov"}),
    "actor.ppo_kl_coef": (0.05, {"actor.policy_loss": "kl_cov"}),
    "actor.dro_beta": (0.25, {"actor.policy_loss": "dro", "actor.dro_beta": 0.1}),
    "ref.compile_decoder_layers": (True, {"actor.use_kl_loss": True}),  # a reference only for a KL term
    "rollout.top_k": (5, {}),
    "rollout.dtype": ("float16", {}),  # auto is bfloat16 on a GPU
    "rollout.val_kwargs.do_sample": (True, {"rollout.val_kwargs.temperature": 0.7}),
    "rollout.val_kwargs.top_k": (5, {}),
    "rollout.val_kwargs.temperature": (0.5, {"rollout.val_kwargs.do_sample": True}),
    "reward.function.path": ("{other_reward}", {}),
    "reward.function.name": ("other_score", {"reward.function.path": "{other_reward}"}),
    "reward.num_workers": (3, {}),
    "reward.overlong_buffer.len": (2, {"reward.overlong_buffer.enable": True}),
    "reward.overlong_buffer.penalty_factor": (0.5, {"reward.overlong_buffer.enable": True}),
    "reward.overlong_buffer.log": (True, {"reward.overlong_buffer.enable": True}),
    "rollout.harness.command": (["{harness}", "--other"], HARNESS),
    "rollout.harness.timeout_seconds": (30.0, HARNESS),
    "rollout.harness.require_reward": (False, HARNESS),
    "rollout.harness.max_concurrent_episodes": (4, HARNESS),
    "trainer.logger": (["console", "tensorboard"], {}),
    "trainer.experiment_name": ("other", {"trainer.logger": ["tensorboard"]}),
    "trainer.total_epochs": (2, {"trainer.total_training_steps": None}),
    "trainer.v1.trainer_mode": ("colocate_async", {"rollout.free_cache_engine": False}),
}


def _leaves(model: type[BaseModel], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted path, field info) of every scalar or list field reachable from `model`."""
    for name, info in model.model_fields.items():
        args = typing.get_args(info.annotation) if isinstance(info.annotation, types.UnionType) else ()
        nested = [a for a in (*args, info.annotation) if isinstance(a, type) and issubclass(a, BaseModel)]
        if nested:
            yield from _leaves(nested[0], f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}", info


def _set(raw: dict[str, Any], path: str, value: Any) -> None:
    *parents, last = path.split(".")
    for part in parents:
        if not isinstance(raw.get(part), dict):
            raw[part] = {}
        raw = raw[part]
    raw[last] = value


def _get(raw: dict[str, Any], path: str) -> Any:
    for part in path.split("."):
        if not isinstance(raw, dict):
            return None
        raw = raw.get(part)  # type: ignore[assignment]
    return raw


def _placed(entry: tuple[Any, dict[str, Any]], files: dict[str, str]) -> tuple[Any, dict[str, Any]]:
    """A VALUES entry with the fixture's files in place of their "{name}"s."""

    def place(value: Any) -> Any:
        if isinstance(value, str):
            return value.format(**files)
        return [place(v) for v in value] if isinstance(value, list) else value

    value, companions = entry
    return place(value), {k: place(v) for k, v in companions.items()}


def _candidates(info: Any, default: Any) -> list[Any]:
    """Values of the field's type other than its default, most ordinary first."""
    annotation = info.annotation
    kinds = typing.get_args(annotation) if isinstance(annotation, types.UnionType) else (annotation,)
    out: list[Any] = []
    for kind in kinds:
        origin = typing.get_origin(kind)
        if origin is typing.Literal:
            out += [v for v in typing.get_args(kind) if v != default]
        elif kind is bool:
            out.append(not default)
        elif kind is int:
            whole = default if isinstance(default, int) else 1
            out += [whole + 1, whole * 2, whole - 1, 1, 2, 3, 16, 0, -1]
        elif kind is float:
            base = float(default) if isinstance(default, (int, float)) else 0.5
            out += [base * 0.5, base + 0.1, base * 2, 0.5, 0.25, 1.5, 0.0]
        elif kind is str:
            out += ["other"]
    return [v for v in out if v != default]


class _RankCache:
    """The in-process rank's roles built once per rank-side config: what the driver does not
    read itself (data, reward, checkpoints, reporting) is left out of the key. A rank-side field
    missing from the key would read as having no effect (a failure), never the other way."""

    DRIVER_ONLY = ("data", "reward", "checkpoint")
    TRAINER_RANK_SIDE = ("seed", "device", "nccl_timeout", "v1")
    ROLLOUT_DRIVER_ONLY = ("harness",)  # its processes and endpoint run in the driver

    def __init__(self) -> None:
        self.ranks: dict[str, _RankBuiltOnce] = {}
        self.config: TrainerConfig | None = None  # the config being built, set by `effective`

    def key(self, config: dict[str, Any], hosts: frozenset[Role]) -> str:
        kept = {k: v for k, v in config.items() if k not in self.DRIVER_ONLY}
        kept["rollout"] = {k: v for k, v in config["rollout"].items() if k not in self.ROLLOUT_DRIVER_ONLY}
        kept["trainer"] = {k: v for k, v in config["trainer"].items() if k in self.TRAINER_RANK_SIDE}
        return json.dumps([kept, sorted(hosts)], sort_keys=True)

    def launch(self, group: Group, specs: list[RankSpec], config: dict[str, Any]) -> RankGroup:
        # No engine started: the report holds the arguments a GPU rank would start vLLM with.
        spec = dataclasses.replace(specs[0], hosts=specs[0].hosts - {Role.ROLLOUT})
        key = self.key(config, spec.hosts)
        if key not in self.ranks:
            self.ranks[key] = _RankBuiltOnce(config, spec)
        rank = self.ranks[key]
        assert self.config is not None
        name, arguments = engine_arguments(self.config, torch.device("cuda"))
        rank.engine_arguments = {"engine": name, **arguments}
        return LocalRankGroup(group.name, [rank])


class _RankBuiltOnce(Rank):
    """A rank whose roles are built at its first setup and kept."""

    built: str | None = None

    def setup(self) -> str:
        if self.built is None:
            self.built = super().setup()
        return self.built


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    workdir = tmp_path_factory.mktemp("fields")
    raw: dict[str, Any] = yaml.safe_load(init(workdir / "task", "gae", steps=STEPS).read_text())
    raw["data"]["train_batch_size"] = 4
    raw["actor"].update(ppo_mini_batch_size=4, ppo_micro_batch_size_per_gpu=8)
    raw["trainer"].update(logger=["console"], test_freq=5)
    raw["checkpoint"] = {"dir": str(workdir / "out")}
    (workdir / "model-link").symlink_to(workdir / "task" / "model")
    reward = Path(raw["reward"]["function"]["path"])
    other_reward = workdir / "other_reward.py"
    other_reward.write_text(
        reward.read_text()
        + "\n\ndef other_score(*args: Any, **kwargs: Any) -> float:\n    return compute_score(*args, **kwargs)\n"
    )
    files = {
        "model_link": str(workdir / "model-link"),
        "other_data": str(write_dataset(workdir / "other.parquet", count=16, seed=5)),
        "other_reward": str(other_reward),
        "short_data": str(write_dataset(workdir / "short.parquet", count=64, digits=2, seed=3)),
        "harness": "/bin/true",
    }
    return {"raw": raw, "files": files}


@pytest.fixture(scope="module")
def cache() -> Iterator[_RankCache]:
    """The built ranks, over a one-rank gloo process group: FSDP2 (actor.strategy fsdp2) shards
    over it, so its settings are walked too. The group ends with the module."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        yield _RankCache()
    finally:
        dist.destroy_process_group()


def effective(config: TrainerConfig, cache: _RankCache) -> dict[str, Any]:
    cache.config = config
    with assembled(config, placement_of(config).in_one_process(), cache.launch) as run:
        settings = run_settings(run, run.open_tracker(-1))
    plain: dict[str, Any] = json.loads(json.dumps(settings, default=str))
    return plain


def _valid(raw: dict[str, Any]) -> TrainerConfig | None:
    try:
        return TrainerConfig.model_validate(raw)
    except (ValidationError, ValueError):
        return None


def test_every_trainer_field_changes_the_effective_settings(base: dict[str, Any], cache: _RankCache) -> None:
    raw, files = base["raw"], base["files"]
    defaults = TrainerConfig.model_validate(raw).model_dump(mode="json")
    baseline_cache: dict[str, dict[str, Any]] = {}
    no_effect, no_value, failed, stale = [], [], [], []
    for path, info in _leaves(TrainerConfig):
        if any(path.startswith(prefix) for prefix in EXCEPTIONS):
            continue
        value, companions = _placed(VALUES.get(path, (None, {})), files)
        baseline = json.loads(json.dumps(defaults))
        for other, companion in companions.items():
            _set(baseline, other, companion)
        candidates = [value] if path in VALUES else _candidates(info, _get(defaults, path))
        changed, value = None, None
        for candidate in candidates:
            trial = json.loads(json.dumps(baseline))
            _set(trial, path, candidate)
            changed, value = _valid(trial), candidate
            if changed is not None:
                break
        if changed is None:
            no_value.append(f"{path} (tried {candidates})")
            continue
        key = json.dumps(companions, sort_keys=True)
        try:
            if key not in baseline_cache:
                baseline_cache[key] = effective(TrainerConfig.model_validate(baseline), cache)
            same = effective(changed, cache) == baseline_cache[key]
        except Exception as error:  # refused at start: a field set wrongly here
            failed.append(f"{path} = {value!r}: {type(error).__name__}: {str(error)[:200]}")
            continue
        if same and path not in KNOWN_IGNORED:
            no_effect.append(f"{path} = {value!r}")
        if not same and path in KNOWN_IGNORED:
            stale.append(path)
    problems = [
        ("fields whose value here fails the build (fix it in VALUES)", failed),
        ("fields without a valid non-default value here (add one to VALUES)", no_value),
        ("fields that change nothing the trainer runs with", no_effect),
        ("fields of KNOWN_IGNORED that take effect now (remove them there)", stale),
    ]
    report = "\n".join(f"{title}:\n  " + "\n  ".join(paths) for title, paths in problems if paths)
    assert not report, report


def test_the_exceptions_and_values_name_real_fields() -> None:
    paths = [path for path, _ in _leaves(TrainerConfig)]
    for prefix in [*EXCEPTIONS, *VALUES, *KNOWN_IGNORED]:
        assert any(path.startswith(prefix) for path in paths), prefix
