"""The roles as the PPO loop sees them (`ppo.Roles`), over the ranks of their groups:
batches split across data-parallel ranks and gathered back, prompts split across
rollout engines, and the weight sync of each rollout placement. The same code over
Ray actors and over ranks in this process.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from rlkube_api.placement import Engines
from rlkube_trainer.batch import TrainBatch
from rlkube_trainer.cluster.rank_group import RankGroup, split
from rlkube_trainer.reward.scoring import RewardInput, RewardScores
from rlkube_trainer.rollout import RolloutBatch, SamplingConfig
from rlkube_trainer.workers.weight_sync import Manifest

Metrics = dict[str, float]


def mean_metrics(parts: list[Metrics]) -> Metrics:
    keys = {k for p in parts for k in p}
    return {k: sum(p[k] for p in parts if k in p) / sum(1 for p in parts if k in p) for k in keys}


class DataParallelActor:
    def __init__(self, group: RankGroup) -> None:
        self.group = group

    def compute_log_prob(self, batch: TrainBatch) -> torch.Tensor:
        return torch.cat(self.group.map_batch("compute_log_prob", batch))

    def compute_log_prob_and_sum_pi_squared(self, batch: TrainBatch) -> tuple[torch.Tensor, torch.Tensor]:
        parts = self.group.map_batch("compute_log_prob_and_sum_pi_squared", batch)
        return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])

    def update(self, batch: TrainBatch) -> Metrics:
        return mean_metrics(self.group.map_batch("update_actor", batch))


class DataParallelReference:
    def __init__(self, group: RankGroup) -> None:
        self.group = group

    def compute_ref_log_prob(self, batch: TrainBatch) -> torch.Tensor:
        return torch.cat(self.group.map_batch("compute_ref_log_prob", batch))


class DataParallelCritic:
    def __init__(self, group: RankGroup) -> None:
        self.group = group

    def compute_values(self, batch: TrainBatch) -> torch.Tensor:
        return torch.cat(self.group.map_batch("compute_values", batch))

    def update(self, batch: TrainBatch) -> Metrics:
        return mean_metrics(self.group.map_batch("update_critic", batch))


class DataParallelRewardModel:
    """A reward model on the ranks of the group that hosts it (its own, or the actor's)."""

    def __init__(self, group: RankGroup) -> None:
        self.group = group

    def score(self, batch: Sequence[RewardInput]) -> RewardScores:
        rows = list(batch)
        results = self.group.wait(self.group.submit("score", [(rows[s],) for s in split(len(rows), len(self.group))]))
        scores = [x for r in results for x in r[0]]
        extra: dict[str, list[float]] = {}
        for _, e in results:
            for key, values in e.items():
                extra.setdefault(key, []).extend(values)
        return RewardScores(scores, extra)


def shard_sampling(sampling: SamplingConfig, first_prompt: int) -> SamplingConfig:
    """Each engine its own seed, offset by its first sample's index: the same seed on every
    shard would draw the same random numbers for different prompts."""
    if sampling.seed is None or first_prompt == 0:
        return sampling
    return dataclasses.replace(sampling, seed=sampling.seed + first_prompt * sampling.n)


def generate(
    group: RankGroup, prompt_token_ids: list[list[int]], sampling: SamplingConfig, engines: Engines | None = None
) -> RolloutBatch:
    """Prompts split evenly over the engines (a prompt's n samples stay on one engine), the
    same split and seeds for the same batch (so a resumed step samples the same); samples
    merged back in prompt order from each engine's first rank.

    Every rank is called, those of an engine without prompts with none: the ranks of one
    tensor-parallel engine must all take part, and a colocated engine that wakes from sleep
    re-syncs its weights, a collective over every actor rank."""
    engines = engines or Engines(len(group), 1)
    if engines.world_size != len(group):
        raise ValueError(f"{engines.world_size} engine ranks placed, but the group has {len(group)} ranks")
    parts = split(len(prompt_token_ids), engines.count)
    shares = [parts[engines.engine_of(r)] for r in range(len(group))]
    batches: list[RolloutBatch] = group.wait(
        group.submit("generate", [(prompt_token_ids[s], shard_sampling(sampling, s.start)) for s in shares])
    )
    samples = [
        dataclasses.replace(sample, prompt_index=part.start + sample.prompt_index)
        for engine, part in enumerate(parts)
        for sample in batches[engines.ranks_of(engine)[0]].samples
    ]
    return RolloutBatch(samples, sampling.n)


class ColocatedRollout:
    """Hybrid engine: each actor rank generates with its own engine; weights move in memory."""

    def __init__(self, actor: RankGroup, engines: Engines | None = None) -> None:
        self.actor = actor
        self.engines = engines

    def generate(self, prompt_token_ids: list[list[int]], sampling: SamplingConfig) -> RolloutBatch:
        return generate(self.actor, prompt_token_ids, sampling, self.engines)

    def sync_weights(self) -> int:
        return int(sum(self.actor.call_all("sync_colocated")) // max(len(self.actor), 1))

    def pause_generation(self) -> None:
        self.actor.call_all("pause_generation")

    def resume_generation(self, weight_version: int) -> None:
        self.actor.call_all("resume_generation", weight_version)


class SeparateRollout:
    """Rollout ranks of their own; every actor rank sends its shards of the new weights to every
    one of them, and each rank of a tensor-parallel engine loads its slice (vLLM's loaders cut it)."""

    def __init__(
        self,
        actor: RankGroup,
        rollout: RankGroup,
        manifest: Manifest,
        bucket_bytes: int,
        engines: Engines | None = None,
    ) -> None:
        self.actor = actor
        self.rollout = rollout
        self.engines = engines
        self.manifest = manifest
        self.bucket_bytes = bucket_bytes

    def generate(self, prompt_token_ids: list[list[int]], sampling: SamplingConfig) -> RolloutBatch:
        return generate(self.rollout, prompt_token_ids, sampling, self.engines)

    def sync_weights(self) -> int:
        # Every actor rank: a sharded policy is gathered tensor by tensor across the group.
        args = [(self.manifest, self.bucket_bytes)]
        sends = self.actor.submit("send_weights", args * len(self.actor))
        receives = self.rollout.submit("receive_weights", args * len(self.rollout))
        # Both sides at once: the broadcast completes only when every rank takes part.
        self.rollout.wait(receives)
        return int(self.actor.wait(sends)[0])

    def pause_generation(self) -> None:
        self.rollout.call_all("pause_generation")

    def resume_generation(self, weight_version: int) -> None:
        self.rollout.call_all("resume_generation", weight_version)
