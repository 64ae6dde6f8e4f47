"""The roles a PPO step calls, as the loop sees them: objects with a few methods. Where they
run (one process, or Ray rank groups across pods: cluster/dispatch.py) is not the loop's
business."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from rlkube_trainer.batch import TrainBatch
from rlkube_trainer.data.prompts import Prompt
from rlkube_trainer.reward.scoring import RewardScorer
from rlkube_trainer.rollout import RolloutBatch, SamplingConfig

Metrics = dict[str, float]


class Actor(Protocol):
    def compute_log_prob(self, batch: TrainBatch) -> torch.Tensor: ...
    def compute_log_prob_and_sum_pi_squared(self, batch: TrainBatch) -> tuple[torch.Tensor, torch.Tensor]: ...
    def update(self, batch: TrainBatch) -> Metrics: ...


class Reference(Protocol):
    def compute_ref_log_prob(self, batch: TrainBatch) -> torch.Tensor: ...


class Critic(Protocol):
    def compute_values(self, batch: TrainBatch) -> torch.Tensor: ...
    def update(self, batch: TrainBatch) -> Metrics: ...


class Rollout(Protocol):
    def generate(self, prompt_token_ids: list[list[int]], sampling: SamplingConfig) -> RolloutBatch: ...

    def sync_weights(self) -> int:
        """Moves the actor's new weights into the engine; returns the bytes moved."""
        ...


class Episodes(Protocol):
    """rollout.multi_turn's sampler (rollout/agent/sampler.py): whole tool-calling episodes; or
    rollout.harness's (rollout/endpoint/sampler.py): episodes of the user's harness."""

    def generate(self, prompts: list[Prompt], sampling: SamplingConfig) -> RolloutBatch: ...


@dataclass
class Roles:
    actor: Actor
    rollout: Rollout
    reward: RewardScorer
    reference: Reference | None = None
    critic: Critic | None = None
