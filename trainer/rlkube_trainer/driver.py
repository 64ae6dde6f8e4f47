"""The driver: owns the data, the loop, checkpoints and reporting, and steers the
roles. `run_in_process` builds every role in this process (CPU or one GPU)."""

from __future__ import annotations

import logging
import os
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from rlkube_api.config import TrainerConfig
from rlkube_trainer.data import PromptDataset, PromptLoader
from rlkube_trainer.models import load_tokenizer
from rlkube_trainer.ppo import PPOTrainer, Roles
from rlkube_trainer.reward import build_reward_scorer
from rlkube_trainer.rollout import RolloutBatch, RolloutEngine, SamplingConfig, build_rollout_engine
from rlkube_trainer.tracking import Tracker
from rlkube_trainer.workers import ActorWorker, CriticWorker, ReferenceWorker

log = logging.getLogger("rlkube.trainer")


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def pick_device(config: TrainerConfig) -> torch.device:
    wanted = config.trainer.device
    if wanted == "auto":
        wanted = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(wanted)


class ColocatedRollout:
    """The rollout engine in the actor's process (hybrid engine): weights move in
    memory; the engine sleeps while the actor trains, where the backend allows."""

    def __init__(self, engine: RolloutEngine, actor: ActorWorker, free_cache_engine: bool) -> None:
        self.engine = engine
        self.actor = actor
        self.free_cache_engine = free_cache_engine

    def generate(self, prompt_token_ids: list[list[int]], sampling: SamplingConfig) -> RolloutBatch:
        batch = self.engine.generate(prompt_token_ids, sampling)
        if self.free_cache_engine:
            self.engine.sleep()
        return batch

    def sync_weights(self) -> int:
        if self.free_cache_engine:
            self.engine.wake_up()
        weights = list(self.actor.named_weights())
        self.engine.update_weights(weights)
        return sum(t.numel() * t.element_size() for _, t in weights)


def build_engine(config: TrainerConfig, device: torch.device) -> RolloutEngine:
    rollout = config.rollout
    on_cpu = device.type == "cpu"
    dtype = rollout.dtype if rollout.dtype != "auto" else ("float32" if on_cpu else "bfloat16")
    common = {"model_path": config.model.path, "device": device.type, "dtype": dtype}
    if rollout.name == "hf":
        return build_rollout_engine("hf", **common)
    kv_cache: dict[str, int] = {}
    if on_cpu:
        # On CPU vLLM reads gpu_memory_utilization against free RAM minus this whole
        # process; a fixed KV budget (the same fraction of total RAM) is predictable.
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        kv_cache["kv_cache_memory_bytes"] = int(rollout.gpu_memory_utilization * total)
    return build_rollout_engine(
        "vllm",
        **common,
        **kv_cache,
        seed=config.trainer.seed,
        gpu_memory_utilization=rollout.gpu_memory_utilization,
        max_model_len=config.data.max_prompt_length + config.data.max_response_length,
        enforce_eager=rollout.enforce_eager or on_cpu,
        enable_sleep_mode=rollout.free_cache_engine and not on_cpu,
    )


@dataclass
class RunResult:
    steps: int
    history: list[dict[str, float]]
    output_dir: Path
    curves: Path


def run_in_process(config: TrainerConfig, max_steps: int | None = None, progress: bool = True) -> RunResult:
    """Every role in this process; the loop to the configured number of steps."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    seed_everything(config.trainer.seed)
    device = pick_device(config)
    tokenizer = load_tokenizer(config.model.tokenizer_path or config.model.path)
    dataset = PromptDataset(config.data.train_files, tokenizer, config.data)
    loader = PromptLoader.from_config(dataset, config.data)
    total_steps = config.trainer.total_training_steps or config.trainer.total_epochs * len(loader)
    if max_steps is not None:
        total_steps = min(total_steps, max_steps)

    actor = ActorWorker(config, device, total_steps)
    reference = (
        ReferenceWorker(config, device) if (config.actor.use_kl_loss or config.algorithm.use_kl_in_reward) else None
    )
    critic = CriticWorker(config, device, total_steps) if config.roles.critic is not None else None
    engine = build_engine(config, device)
    rollout = ColocatedRollout(engine, actor, config.rollout.free_cache_engine)
    roles = Roles(
        actor=actor,
        rollout=rollout,
        reward=build_reward_scorer(config.reward, str(device)),
        reference=reference,
        critic=critic,
    )
    ppo = PPOTrainer(config, roles, tokenizer.decode, tokenizer.pad_token_id, num_gpus=1)
    output_dir = Path(config.checkpoint.dir)
    tracker = Tracker(output_dir, list(config.trainer.logger), config.trainer.experiment_name)
    bar = tqdm(total=total_steps, disable=not progress, desc="steps", unit="step")
    try:
        for step, prompts in zip(range(1, total_steps + 1), _batches(loader), strict=False):
            metrics = ppo.step(prompts, step)
            tracker.log(step, metrics)
            bar.update(1)
            bar.set_postfix(score=f"{metrics.get('critic/score/mean', 0.0):.3f}")
        curves = tracker.plot()
    finally:
        bar.close()
        tracker.close()
        engine.close()
    return RunResult(total_steps, tracker.history(), output_dir, curves)


def _batches(loader: PromptLoader) -> Iterator[list]:  # type: ignore[type-arg]
    while True:
        yield from loader
