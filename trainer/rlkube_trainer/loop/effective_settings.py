"""The settings the run actually uses, reported at start: read from the objects the trainer
built (each rank's optimizer, schedule, models, batching, loss and engine arguments:
workers/settings.py; the driver's estimator, KL controller, sampling, data loader, reward
scorer, checkpoint retention and trackers: here), not echoed from the config. Written to the
driver's log and to `effective-settings.json` in the output (checkpoint.dir) folder, the place
a user checks what ran. Pure functions of built objects, but `report`."""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlkube_trainer.checkpoint.volume import writing_to
from rlkube_trainer.workers.settings import declared_arguments

if TYPE_CHECKING:
    from rlkube_trainer.data.prompts import PromptLoader
    from rlkube_trainer.loop.ppo import PPOTrainer
    from rlkube_trainer.loop.saves import Saves
    from rlkube_trainer.loop.tracking import Tracker
    from rlkube_trainer.loop.training_run import TrainingRun
    from rlkube_trainer.loop.validation import Validation

log = logging.getLogger("rlkube.trainer")

EFFECTIVE_SETTINGS_FILE = "effective-settings.json"
Settings = dict[str, Any]


def _plain(obj: object) -> Settings:
    """An object's own plain settings (numbers, strings, flags, lists of them)."""
    fields = dataclasses.asdict(obj) if dataclasses.is_dataclass(obj) and not isinstance(obj, type) else vars(obj)
    return {
        k: v
        for k, v in fields.items()
        if not k.startswith("_") and isinstance(v, (int, float, str, bool, list, tuple, type(None)))
    }


def algorithm_settings(ppo: PPOTrainer) -> Settings:
    """The registered functions the step calls and the settings it calls them with; a step's
    options that are off report None (their settings then change nothing)."""
    algo, reward = ppo.config.algorithm, ppo.config.reward
    arguments = {
        "gamma": algo.gamma,
        "lam": algo.lam,
        "norm_adv_by_std_in_grpo": algo.norm_adv_by_std_in_grpo,
        "reward_components": algo.gdpo_reward_keys,
        "reward_weights": algo.gdpo_reward_weights,
    }
    return {
        "advantage_estimator": ppo.estimate_advantages.__name__,
        "advantage_arguments": declared_arguments(ppo.estimate_advantages, arguments),
        "kl_in_reward": algo.kl_penalty if algo.use_kl_in_reward else None,
        "filter_groups": algo.filter_groups.model_dump() if algo.filter_groups.enable else None,
        "overlong_buffer": reward.overlong_buffer.model_dump() if reward.overlong_buffer.enable else None,
        # As it applies in the trainer mode (TrainerConfig.rollout_correction).
        "rollout_correction": ppo.config.rollout_correction.model_dump()
        if ppo.config.rollout_correction.enabled
        else None,
        "tokenizer": getattr(getattr(ppo.decode, "__self__", None), "name_or_path", None),
        "kl_controller": {"class": type(ppo.kl_ctrl).__name__, **_plain(ppo.kl_ctrl)},
        "uses_reference": ppo.uses_reference,
        "greedy_baseline": ppo.greedy_baseline,
        "sampling": dataclasses.asdict(ppo.sampling(0)),
    }


def episodes_settings(episodes: object | None) -> Settings | None:
    """The episode sampler's (rollout.multi_turn, or rollout.harness: its command, limits and
    the multiple its batches are cut to); None when the engine samples one response each."""
    if episodes is None:
        return None
    return {"class": type(episodes).__name__, **_plain(episodes)}


def data_settings(loader: PromptLoader, total_steps: int) -> Settings:
    dataset = loader.dataset
    return {
        "prompts": len(dataset),
        "filtered_as_overlong": getattr(dataset, "num_filtered", None),
        "chat_template": getattr(dataset, "use_chat_template", None),
        "first_prompt_tokens": list(dataset[0].prompt_token_ids) if len(dataset) else None,
        "longest_prompt": max((len(p.prompt_token_ids) for p in dataset), default=0),
        "batch_size": loader.batch_size,
        "shuffle": loader.shuffle,
        "seed": loader.seed,
        "drop_last": loader.drop_last,
        "total_steps": total_steps,
    }


def reward_settings(reward: object) -> Settings:
    """The scorer of function rewards (and the pool or remote verifier that calls it), or the
    reward model's roles (their settings are the ranks')."""
    settings = {"class": type(reward).__name__, **_plain(reward)}
    calls = getattr(reward, "calls", None)
    if calls is not None:
        settings["calls"] = {"class": type(calls).__name__, **_plain(calls)}
    return settings


def checkpoint_settings(saves: Saves) -> Settings:
    return {
        "root": str(saves.root),
        "retention": dataclasses.asdict(saves.checkpoints.retention),
        "async_save": saves.config.async_save,
        "export_hf": saves.config.export_hf,
    }


def tracking_settings(tracker: Tracker) -> Settings:
    return {
        "metrics_file": str(tracker.jsonl),
        "console": tracker.console,
        "tensorboard": str(tracker.tensorboard.folder) if tracker.tensorboard is not None else None,
        "experiment_trackers": [{"class": type(t).__name__, **_plain(t)} for t in tracker.trackers],
    }


def validation_settings(validation: Validation | None) -> Settings | None:
    if validation is None:
        return None
    return {"prompts": len(validation.prompts), "sampling": dataclasses.asdict(validation.sampling(0))}


def loop_settings(run: TrainingRun) -> Settings:
    """When the loop saves and validates, as TrainingRun.fit reads it."""
    trainer = run.config.trainer
    validates = run.validation is not None
    return {
        "total_steps": run.total_steps,
        "save_freq": trainer.save_freq,
        "test_freq": trainer.test_freq if validates else None,
        "validate_before_training": trainer.val_before_train if validates else None,
        "validate_only": trainer.val_only,
        "log_val_generations": trainer.log_val_generations if validates else None,
        "trainer_mode": trainer.v1.trainer_mode,
    }


def run_settings(run: TrainingRun, tracker: Tracker) -> Settings:
    """Every component's settings: the driver's objects and what each group's ranks reported."""
    return {
        "ranks": run.ranks,
        "loop": loop_settings(run),
        "algorithm": algorithm_settings(run.ppo),
        "episodes": episodes_settings(run.ppo.episodes),
        "data": data_settings(run.loader, run.total_steps),
        "reward": reward_settings(run.ppo.roles.reward),
        "validation": validation_settings(run.validation),
        "checkpoint": checkpoint_settings(run.saves),
        "tracking": tracking_settings(tracker),
    }


def report(settings: Settings, output_dir: Path) -> Path:
    """The settings into the driver's log and `effective-settings.json` under `output_dir`."""
    path = output_dir / EFFECTIVE_SETTINGS_FILE
    # One line in the log (a log line per setting would bury the run's start); indented in the file.
    log.info("effective settings (also in %s): %s", path, json.dumps(settings, sort_keys=True, default=str))
    text = json.dumps(settings, indent=1, sort_keys=True, default=str)
    with writing_to(path):
        output_dir.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")
    return path
