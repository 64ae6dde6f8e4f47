"""Every field of the trainer's config is read by the trainer while it runs: a field that no
code path reads is accepted and ignored. The spec walk (tests/api/test_fields_take_effect.py)
proves the operator's side: a spec field changes the children or is refused. Every trainer
field changes the ConfigMap, so that walk cannot tell whether the trainer uses one; this
test can.

The tiny task runs in this process (`rlkube-trainer run --in-process`, as users run it) a few
times, together covering the trainer's features (GRPO with a KL loss and validation; gae with a
critic, a KL penalty in the reward and token budgets), while every read of a config field is
recorded by its path in the config. A field none of the runs read fails the test, unless
EXCEPTIONS says where it is read and which test proves it.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from rlkube_api.base import ApiModel
from rlkube_api.config import TrainerConfig
from rlkube_trainer.pod import cli
from rlkube_trainer.tiny.task import init, write_dataset

pytestmark = pytest.mark.trainer

# Where a field is read outside these runs, and the test that proves it; keyed by path prefix.
EXCEPTIONS: dict[str, str] = {
    "roles.": "pod placement and sizes are the operator's: tests/api/test_fields_take_effect.py walks "
    "them against the children it builds",
    "reward.function.config_map.": "the operator mounts the ConfigMap and hands the trainer its path "
    "(tests/operator/test_builders.py)",
    "checkpoint.adopt": "read where a run belongs to an RLJob, which must own checkpoint.dir "
    "(tests/trainer/test_checkpoint_owner.py)",
    "actor.fsdp_config.": "read where the role is sharded with FSDP2, over a process group of ranks "
    "(tests/trainer/test_fsdp.py, test_distributed.py)",
    "critic.fsdp_config.": "as actor.fsdp_config",
    "ref.fsdp_config.": "as actor.fsdp_config; its optimizerOffload is refused unless false (no optimizer)",
    "reward.remote.": "the remote verifier's settings, read where reward.remote is set "
    "(tests/trainer/test_reward_remote.py runs it against a local HTTP server)",
    "reward.model.": "the reward model's settings, read by its ranks (tests/trainer/test_reward_model_roles.py)",
    "rollout.multi_turn.": "the agent loop's settings: tests/trainer/test_agent_*.py run episodes with "
    "each (test_agent_sandbox_fields.py: every sandbox limit reaches the tool)",
    "rollout.enable_prefix_caching": "the vLLM engine's settings, read where it starts (rollout.name vllm: "
    "tests/trainer/test_rollout.py)",
    "rollout.enforce_eager": "as rollout.enable_prefix_caching",
    "rollout.gpu_memory_utilization": "as rollout.enable_prefix_caching",
    "rollout.max_num_batched_tokens": "as rollout.enable_prefix_caching",
    "rollout.max_num_seqs": "as rollout.enable_prefix_caching",
    "async_training.partial_rollout": "needs the vLLM engine (the hf engine cannot be interrupted; refused "
    "with it): tests/trainer/test_async_learning.py",
    "trainer.v1.colocate_async.num_warmup_batches": "only 1 is accepted, what the one-step-off schedule "
    "does; another value is refused by name",
    "trainer.v1.separate_async.num_warmup_batches": "as trainer.v1.colocate_async.num_warmup_batches",
}


def _leaves(model: type[BaseModel], prefix: str = "") -> Iterator[str]:
    """The dotted paths of every scalar or list field reachable from `model`."""
    for name, info in model.model_fields.items():
        args = typing.get_args(info.annotation) if isinstance(info.annotation, types.UnionType) else ()
        nested = [a for a in (*args, info.annotation) if isinstance(a, type) and issubclass(a, BaseModel)]
        if nested:
            yield from _leaves(nested[0], f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}"


class ReadRecorder:
    """Records `section.field` paths as the trainer reads them. A section's path is learned when
    it is read from its parent; a copy (model_copy, a section as it applies) is placed by its
    class where the class has one place in the config."""

    def __init__(self) -> None:
        self.read: set[str] = set()
        self._paths: dict[int, tuple[object, str]] = {}  # the object kept: its id stays its own
        self._places = self._unique_places(TrainerConfig)

    @staticmethod
    def _unique_places(root: type[BaseModel]) -> dict[type, str]:
        places: dict[type, set[str]] = {}

        def walk(model: type[BaseModel], path: str) -> None:
            places.setdefault(model, set()).add(path)
            for name, info in model.model_fields.items():
                args = typing.get_args(info.annotation) if isinstance(info.annotation, types.UnionType) else ()
                for arg in (*args, info.annotation):
                    if isinstance(arg, type) and issubclass(arg, BaseModel):
                        walk(arg, f"{path}{name}.")

        walk(root, "")
        return {model: next(iter(paths)) for model, paths in places.items() if len(paths) == 1}

    def _path_of(self, section: BaseModel) -> str | None:
        known = self._paths.get(id(section))
        if known is not None and known[0] is section:
            return known[1]
        for cls in type(section).__mro__:  # a subclass (the critic as it applies) reads as its base
            if cls in self._places:
                return self._places[cls]
        return None

    def attribute(self, section: BaseModel, name: str, value: object) -> None:
        path = self._path_of(section)
        if path is None or name not in type(section).model_fields:
            return
        if isinstance(value, BaseModel):
            self._paths[id(value)] = (value, f"{path}{name}.")
        else:
            self.read.add(f"{path}{name}")


@pytest.fixture
def recorder(monkeypatch: pytest.MonkeyPatch) -> ReadRecorder:
    recording = ReadRecorder()
    get = object.__getattribute__

    def recorded(self: BaseModel, name: str) -> Any:
        value = get(self, name)
        if not name.startswith("_"):
            recording.attribute(self, name, value)
        return value

    monkeypatch.setattr(ApiModel, "__getattribute__", recorded)
    return recording


def _run(workdir: Path, estimator: str, changes: dict[str, dict[str, Any]]) -> None:
    raw: dict[str, Any] = yaml.safe_load(init(workdir / "task", estimator, steps=2).read_text())
    raw["rollout"]["name"] = "hf"
    raw["data"]["train_batch_size"] = 4
    raw["actor"].update(ppo_mini_batch_size=4, ppo_micro_batch_size_per_gpu=8)
    raw["trainer"].update(save_freq=2, test_freq=2, logger=["console"])
    raw["checkpoint"]["dir"] = str(workdir / "checkpoints")
    for section, values in changes.items():
        raw.setdefault(section, {}).update(values)
    config = workdir / "config.yaml"
    config.write_text(yaml.safe_dump(raw))
    assert cli.main(["run", str(config), "--in-process", "--no-progress"]) == 0


def test_every_trainer_field_is_read_by_the_trainer(tmp_path: Path, recorder: ReadRecorder) -> None:
    # The task's prompts are 4 tokens ("6 6 0 ="), these 3: at a limit of 3 the task's are
    # overlong, dropped in the first run and cut in the second.
    short = str(write_dataset(tmp_path / "short.parquet", count=64, digits=2, seed=3))
    _run(
        tmp_path / "grpo",
        "grpo",
        {
            "data": {
                "max_prompt_length": 3,
                "filter_overlong_prompts": True,
                "train_files": [str(tmp_path / "grpo" / "task" / "data" / "train.parquet"), short],
                "val_files": [short],
            },
            "algorithm": {
                "filter_groups": {"enable": True, "max_num_gen_batches": 0},
                "rollout_correction": {
                    "rollout_is": "token",
                    "rollout_rs": "token_k1",
                    "rollout_rs_threshold": "0.5_2.0",
                    "rollout_is_batch_normalize": True,
                },
            },
            "actor": {"use_kl_loss": True, "use_dynamic_bsz": True, "optim": {"lr": 3e-3, "warmup_style": "cosine"}},
            "ref": {"log_prob_max_token_len_per_gpu": 256},
            "rollout": {"val_kwargs": {"do_sample": True}},
            "trainer": {"log_val_generations": 2},
            "reward": {"overlong_buffer": {"enable": True, "len": 1}},
        },
    )
    _run(
        tmp_path / "gae",
        "gae",
        {
            "data": {"max_prompt_length": 3, "truncation": "left"},
            "algorithm": {
                "use_kl_in_reward": True,
                "rollout_correction": {"bypass_mode": True, "loss_type": "reinforce"},
            },
            "critic": {"optim": {"lr": 3e-3, "warmup_style": "cosine"}, "use_dynamic_bsz": True, "lora_rank": 4},
        },
    )
    sampler = {"max_off_policy_threshold": 3, "max_off_policy_strategy": "wait"}
    _run(
        tmp_path / "separate_async",
        "grpo",
        {
            "trainer": {"v1": {"trainer_mode": "separate_async", "sampler": sampler}, "test_freq": -1},
            "roles": {"rollout": {"placement": "separate", "replicas": 1, "gpus_per_replica": 0}},
        },
    )
    # An epoch of 8 prompts: the run's length comes from trainer.total_epochs.
    epoch = write_dataset(tmp_path / "epoch.parquet", count=8)
    _run(
        tmp_path / "colocate_async",
        "grpo",
        {
            "data": {"train_files": [str(epoch)]},
            "trainer": {
                "v1": {"trainer_mode": "colocate_async"},
                "test_freq": -1,
                "total_training_steps": None,
                "total_epochs": 1,
            },
            "rollout": {"free_cache_engine": False},
        },
    )
    unread = sorted(
        path
        for path in _leaves(TrainerConfig)
        if path not in recorder.read and not any(path.startswith(prefix) for prefix in EXCEPTIONS)
    )
    assert not unread, "fields the trainer never read:\n  " + "\n  ".join(unread)


def test_the_exceptions_name_real_sections() -> None:
    paths = list(_leaves(TrainerConfig))
    for prefix in EXCEPTIONS:
        assert any(path.startswith(prefix) for path in paths), prefix
