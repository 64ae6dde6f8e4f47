"""A rollout's scores, and what advantage estimators take from them beyond the score: the
reward components of GDPO, the greedy baselines of ReMax."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from rlkube_trainer.batch import TrainBatch
from rlkube_trainer.reward.scoring import Labels


@dataclass
class Scored:
    """The scores of a rollout's samples, in sample order."""

    responses: list[str]  # decoded, as the scorer read them
    scores: list[float]  # the rewards: the scorer's, plus the overlong penalty when enabled
    raw_scores: list[float]  # the scorer's alone
    extra: dict[str, list[float]]  # per-sample numbers a reward function returned (acc, ...)
    labels: Labels  # per-sample text a reward function returned (pred, ...)

    def metric(self, name: str) -> list[float]:
        """A per-sample metric by verl's filter_groups names: score (the scorer's),
        seq_reward (the reward, shaping included), or a reward function's own key."""
        if name == "score":
            return self.raw_scores
        if name == "seq_reward":
            return self.scores
        if name in self.extra:
            return self.extra[name]
        known = ", ".join(["score", "seq_reward", *self.extra])
        raise ValueError(f"algorithm.filter_groups.metric {name!r} is not among this batch's metrics: {known}")

    def select(self, keep: list[bool]) -> Scored:
        def pick(values: list[Any]) -> list[Any]:
            return [v for v, k in zip(values, keep, strict=True) if k]

        return Scored(
            pick(self.responses),
            pick(self.scores),
            pick(self.raw_scores),
            {k: pick(v) for k, v in self.extra.items()},
            {k: pick(v) for k, v in self.labels.items()},
        )

    @staticmethod
    def concat(parts: list[Scored]) -> Scored:
        def join(key: str, field: str) -> list[Any]:
            return [v for p in parts for v in getattr(p, field).get(key, [])]

        return Scored(
            [r for p in parts for r in p.responses],
            [s for p in parts for s in p.scores],
            [s for p in parts for s in p.raw_scores],
            {k: join(k, "extra") for k in dict.fromkeys(k for p in parts for k in p.extra)},
            {k: join(k, "labels") for k in dict.fromkeys(k for p in parts for k in p.labels)},
        )


def reward_components(batch: TrainBatch, keys: list[str]) -> list[torch.Tensor]:
    """The per-sample reward components named by algorithm.gdpo_reward_keys (GDPO), from the
    numbers the reward function returned beside its score."""
    missing = [k for k in keys if k not in batch.reward_extra]
    if missing:
        known = ", ".join(sorted(batch.reward_extra)) or "none"
        raise ValueError(
            f"algorithm.gdpo_reward_keys {missing} are not among the reward function's per-sample "
            f"numbers ({known}); its compute_score must return a dict with these keys"
        )
    return [batch.reward_extra[k] for k in keys]


def greedy_reward_baselines(
    sample_prompts: Sequence[Hashable], greedy_prompts: Sequence[Hashable], greedy_scores: Sequence[float]
) -> torch.Tensor:
    """ReMax's reward_baselines, [samples]: for each sample, the reward of the greedy response to
    its prompt (`sample_prompts` and `greedy_prompts` name the prompts alike; each prompt has one
    greedy response, however many samples it has)."""
    baseline: dict[Hashable, float] = {}
    for prompt, score in zip(greedy_prompts, greedy_scores, strict=True):
        if prompt in baseline:
            raise ValueError(f"prompt {prompt!r} has more than one greedy response")
        baseline[prompt] = score
    missing = [p for p in dict.fromkeys(sample_prompts) if p not in baseline]
    if missing:
        raise ValueError(f"prompts {missing} have samples but no greedy response")
    return torch.tensor([baseline[p] for p in sample_prompts], dtype=torch.float32)
