"""The driver: owns the data, the loop, checkpoints and reporting, and steers the
roles. Two ways to get the roles, one loop (`TrainingRun.fit`):

- `run_in_process`: every role in this process (CPU or one GPU) — tests, benchmarks;
- `run_distributed` (distributed.py): one Ray worker group per role — what
  `rlkube-trainer run` does locally and `rlkube-trainer driver` does in a pod.
"""

from __future__ import annotations

import logging
import os
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from tqdm import tqdm

from rlkube_api.config import TrainerConfig
from rlkube_trainer.checkpoint import CheckpointManager, capture_rng, load_torch, restore_rng, save_torch
from rlkube_trainer.data import Prompt, PromptDataset, PromptLoader
from rlkube_trainer.models import load_tokenizer
from rlkube_trainer.ppo import PPOTrainer, Roles
from rlkube_trainer.reporting import DriverMetrics, NullReporter, ProgressReporter, progress_payload
from rlkube_trainer.reward import build_reward_scorer
from rlkube_trainer.rollout import RolloutBatch, RolloutEngine, SamplingConfig, build_engine
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


def uses_reference(config: TrainerConfig) -> bool:
    return config.actor.use_kl_loss or config.algorithm.use_kl_in_reward


def total_steps_of(config: TrainerConfig, loader: PromptLoader) -> int:
    return config.trainer.total_training_steps or config.trainer.total_epochs * len(loader)


def order_checksum(prompts: list[Prompt]) -> int:
    """An order-sensitive fingerprint of a batch's prompts: resumed runs must see the same data."""
    return sum((i + 1) * p.index for i, p in enumerate(prompts)) % 1_000_003


class RoleState(Protocol):
    """The roles' side of checkpoints: each writes and reads its own parts."""

    def save(self, staging: Path) -> list[str]: ...
    def load(self, checkpoint: Path) -> None: ...
    def export_hf(self, path: Path) -> None: ...


@dataclass
class RunResult:
    steps: int
    history: list[dict[str, float]]
    output_dir: Path
    curves: Path | None
    last_checkpoint: Path | None


class TrainingRun:
    """The loop around PPOTrainer.step: data order, resume, checkpoints, reporting."""

    def __init__(
        self,
        config: TrainerConfig,
        ppo: PPOTrainer,
        loader: PromptLoader,
        state: RoleState,
        reporter: ProgressReporter | None = None,
        metrics: DriverMetrics | None = None,
    ) -> None:
        self.config = config
        self.ppo = ppo
        self.loader = loader
        self.state = state
        self.reporter = reporter or NullReporter()
        self.metrics = metrics
        self.checkpoints = CheckpointManager(Path(config.checkpoint.dir), config.checkpoint.max_to_keep)
        self.total_steps = total_steps_of(config, loader)
        self.step = 0
        self.last_checkpoint_step: int | None = None

    # --- checkpoints -------------------------------------------------------------------------------
    def resume(self) -> None:
        found = self.checkpoints.resolve(self.config.checkpoint.resume)
        if found is None:
            return
        self.state.load(found.path)
        driver = load_torch(found.path / "driver.pt")
        self.step = int(driver["step"])
        self.loader.load_state_dict(driver["loader"])
        self.ppo.kl_ctrl.load_state_dict(driver["kl_ctrl"])
        restore_rng(driver["rng"])
        self.last_checkpoint_step = self.step
        # The rollout engines started from the initial weights: give them the resumed ones.
        self.ppo.roles.rollout.sync_weights()
        log.info("resumed from %s (step %d)", found.path, self.step)

    def save(self) -> Path:
        staging = self.checkpoints.staging(self.step)
        files = self.state.save(staging)
        save_torch(
            staging / "driver.pt",
            {
                "step": self.step,
                "loader": self.loader.state_dict(),
                "kl_ctrl": self.ppo.kl_ctrl.state_dict(),
                "rng": capture_rng(),
            },
        )
        path = self.checkpoints.commit(self.step, {"parts": sorted({f.split("/")[0] for f in files})})
        self.last_checkpoint_step = self.step
        log.info("checkpoint %s", path)
        return path

    def _batches(self) -> Iterator[list[Prompt]]:
        while True:
            yield from self.loader

    # --- the loop ---------------------------------------------------------------------------------
    def fit(self, max_steps: int | None = None, progress: bool = True) -> RunResult:
        config = self.config
        if max_steps is not None:
            self.total_steps = min(self.total_steps, max_steps)
        self.resume()
        tracker = Tracker(Path(config.checkpoint.dir), list(config.trainer.logger), config.trainer.experiment_name)
        bar = tqdm(total=self.total_steps, initial=self.step, disable=not progress, desc="steps", unit="step")
        last_path: Path | None = None
        save_freq = config.trainer.save_freq
        try:
            batches = self._batches()
            while self.step < self.total_steps:
                self.step += 1
                prompts = next(batches)
                metrics = self.ppo.step(prompts, self.step)
                metrics["data/order_checksum"] = float(order_checksum(prompts))
                if (save_freq > 0 and self.step % save_freq == 0) or self.step == self.total_steps:
                    last_path = self.save()
                tracker.log(self.step, metrics)
                if self.metrics is not None:
                    self.metrics.update(self.step, metrics, self.total_steps)
                final = self.step == self.total_steps
                self.reporter.report(
                    progress_payload(self.step, self.total_steps, metrics, self.last_checkpoint_step), force=final
                )
                bar.update(1)
                bar.set_postfix(score=f"{metrics.get('critic/score/mean', 0.0):.3f}")
            if config.checkpoint.export_hf:
                self.state.export_hf(Path(config.checkpoint.dir) / "hf")
            curves = tracker.plot()
        finally:
            bar.close()
            tracker.close()
            self.reporter.flush()
        return RunResult(self.step, tracker.history(), Path(config.checkpoint.dir), curves, last_path)


# --- every role in this process ------------------------------------------------------------------


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


class InProcessState:
    def __init__(self, actor: ActorWorker, critic: CriticWorker | None, tokenizer: Any) -> None:
        self.parts = {"actor": actor, "critic": critic}
        self.tokenizer = tokenizer

    def save(self, staging: Path) -> list[str]:
        files = []
        for name, part in self.parts.items():
            if part is not None:
                save_torch(staging / name / "rank_0.pt", {"state": part.state_dict()})
                files.append(f"{name}/rank_0.pt")
        return files

    def load(self, checkpoint: Path) -> None:
        for name, part in self.parts.items():
            if part is not None:
                part.load_state_dict(load_torch(checkpoint / name / "rank_0.pt")["state"])

    def export_hf(self, path: Path) -> None:
        from rlkube_trainer.checkpoint import export_hf  # noqa: PLC0415

        actor = self.parts["actor"]
        assert actor is not None
        export_hf(actor.model, self.tokenizer, path)


def run_in_process(config: TrainerConfig, max_steps: int | None = None, progress: bool = True) -> RunResult:
    """Every role in this process; the loop to the configured number of steps."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    seed_everything(config.trainer.seed)
    device = pick_device(config)
    tokenizer = load_tokenizer(config.model.tokenizer_path or config.model.path)
    dataset = PromptDataset(config.data.train_files, tokenizer, config.data)
    loader = PromptLoader.from_config(dataset, config.data)
    total_steps = total_steps_of(config, loader)

    actor = ActorWorker(config, device, total_steps)
    reference = ReferenceWorker(config, device) if uses_reference(config) else None
    critic = CriticWorker(config, device, total_steps) if config.roles.critic is not None else None
    engine = build_engine(config, device)
    try:
        roles = Roles(
            actor=actor,
            rollout=ColocatedRollout(engine, actor, config.rollout.free_cache_engine),
            reward=build_reward_scorer(config.reward, str(device)),
            reference=reference,
            critic=critic,
        )
        ppo = PPOTrainer(config, roles, tokenizer.decode, tokenizer.pad_token_id, num_gpus=1)
        run = TrainingRun(config, ppo, loader, InProcessState(actor, critic, tokenizer))
        return run.fit(max_steps, progress)
    finally:
        engine.close()
