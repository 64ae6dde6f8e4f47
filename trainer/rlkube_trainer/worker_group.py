"""The driver's side of the role worker groups: Ray actors per rank, batches split
across data-parallel ranks and gathered back, and the roles' interfaces the loop
(ppo.Roles) expects, for both rollout placements.

A rank that dies fails the step at once with the role and rank named: results are
collected with ray.wait, so one dead rank is seen even while the others are
blocked in a collective waiting for it.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any

import ray
import torch

from rlkube_trainer.batch import TrainBatch
from rlkube_trainer.reward import RewardInput, RewardScores
from rlkube_trainer.rollout import RolloutBatch, RolloutSample, SamplingConfig
from rlkube_trainer.weight_sync import Manifest

Metrics = dict[str, float]


class WorkerLost(RuntimeError):
    """A rank of a worker group died or stopped answering."""

    def __init__(self, role: str, rank: int, cause: str) -> None:
        self.role, self.rank = role, rank
        super().__init__(f"role {role} rank {rank} failed: {cause}")


class WorkerGroup:
    def __init__(self, role: str, handles: list[Any], timeout: float) -> None:
        self.role = role
        self.handles = handles
        self.timeout = timeout

    def __len__(self) -> int:
        return len(self.handles)

    def gather(self, refs: Sequence[Any], ranks: Sequence[int] | None = None) -> list[Any]:
        """Results in rank order; the first failure raises WorkerLost naming its rank."""
        ranks = list(ranks) if ranks is not None else list(range(len(refs)))
        rank_of = {ref: rank for ref, rank in zip(refs, ranks, strict=True)}
        pending = list(refs)
        deadline = time.monotonic() + self.timeout
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                rank = rank_of[pending[0]]
                raise WorkerLost(self.role, rank, f"no answer within {self.timeout:.0f} s")
            done, pending = ray.wait(pending, num_returns=1, timeout=min(left, 5.0))
            for ref in done:
                try:
                    ray.get(ref)
                except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError) as exc:
                    raise WorkerLost(self.role, rank_of[ref], _first_line(exc)) from exc
        return ray.get(list(refs))

    def call_all(self, method: str, *args: Any) -> list[Any]:
        return self.gather([getattr(h, method).remote(*args) for h in self.handles])

    def call(self, rank: int, method: str, *args: Any) -> Any:
        return self.gather([getattr(self.handles[rank], method).remote(*args)], [rank])[0]

    def map_batch(self, method: str, batch: TrainBatch) -> list[Any]:
        """Data parallel: rank i gets the i-th contiguous slice of the batch."""
        parts = _split(len(batch), len(self.handles))
        refs = [getattr(h, method).remote(batch.select(s)) for h, s in zip(self.handles, parts, strict=True)]
        return self.gather(refs)


def _split(n: int, k: int) -> list[slice]:
    sizes = [n // k + (1 if i < n % k else 0) for i in range(k)]
    out, start = [], 0
    for size in sizes:
        out.append(slice(start, start + size))
        start += size
    return out


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def mean_metrics(parts: list[Metrics]) -> Metrics:
    keys = {k for p in parts for k in p}
    return {k: sum(p[k] for p in parts if k in p) / sum(1 for p in parts if k in p) for k in keys}


class GroupActor:
    def __init__(self, group: WorkerGroup) -> None:
        self.group = group

    def compute_log_prob(self, batch: TrainBatch) -> torch.Tensor:
        return torch.cat(self.group.map_batch("compute_log_prob", batch))

    def update(self, batch: TrainBatch) -> Metrics:
        return mean_metrics(self.group.map_batch("update_actor", batch))


class GroupReference:
    def __init__(self, group: WorkerGroup) -> None:
        self.group = group

    def compute_ref_log_prob(self, batch: TrainBatch) -> torch.Tensor:
        return torch.cat(self.group.map_batch("compute_ref_log_prob", batch))


class GroupCritic:
    def __init__(self, group: WorkerGroup) -> None:
        self.group = group

    def compute_values(self, batch: TrainBatch) -> torch.Tensor:
        return torch.cat(self.group.map_batch("compute_values", batch))

    def update(self, batch: TrainBatch) -> Metrics:
        return mean_metrics(self.group.map_batch("update_critic", batch))


class GroupRewardModel:
    """A reward model served by its own worker group (or the actor's, colocated)."""

    def __init__(self, group: WorkerGroup) -> None:
        self.group = group

    def score(self, batch: Sequence[RewardInput]) -> RewardScores:
        rows = list(batch)
        parts = _split(len(rows), len(self.group))
        results = self.group.gather([h.score.remote(rows[s]) for h, s in zip(self.group.handles, parts, strict=True)])
        scores = [x for r in results for x in r[0]]
        extra: dict[str, list[float]] = {}
        for _, e in results:
            for key, values in e.items():
                extra.setdefault(key, []).extend(values)
        return RewardScores(scores, extra)


def _generate(group: WorkerGroup, prompt_token_ids: list[list[int]], sampling: SamplingConfig) -> RolloutBatch:
    """Prompts split across the group's engines; samples merged back in prompt order."""
    parts = [s for s in _split(len(prompt_token_ids), len(group)) if s.stop > s.start]
    # Each engine its own seed (offset by its first sample's index): the same seed on every
    # shard would draw the same random numbers for different prompts.
    refs = [
        group.handles[i].generate.remote(prompt_token_ids[s], _shard_sampling(sampling, s.start))
        for i, s in enumerate(parts)
    ]
    batches: list[RolloutBatch] = group.gather(refs, list(range(len(parts))))
    samples = []
    for part, batch in zip(parts, batches, strict=True):
        for sample in batch.samples:
            samples.append(
                RolloutSample(part.start + sample.prompt_index, sample.token_ids, sample.logprobs, sample.finish_reason)
            )
    return RolloutBatch(samples, sampling.n)


def _shard_sampling(sampling: SamplingConfig, first_prompt: int) -> SamplingConfig:
    if sampling.seed is None or first_prompt == 0:
        return sampling
    return dataclasses.replace(sampling, seed=sampling.seed + first_prompt * sampling.n)


class ColocatedGroupRollout:
    """Hybrid engine: each actor rank generates with its own engine; weights move in memory."""

    def __init__(self, actor: WorkerGroup) -> None:
        self.actor = actor

    def generate(self, prompt_token_ids: list[list[int]], sampling: SamplingConfig) -> RolloutBatch:
        return _generate(self.actor, prompt_token_ids, sampling)

    def sync_weights(self) -> int:
        return int(sum(self.actor.call_all("sync_colocated")) // max(len(self.actor), 1))


class SeparateGroupRollout:
    """Rollout ranks of their own; actor rank 0 broadcasts new weights to them."""

    def __init__(self, actor: WorkerGroup, rollout: WorkerGroup, manifest: Manifest, bucket_bytes: int) -> None:
        self.actor = actor
        self.rollout = rollout
        self.manifest = manifest
        self.bucket_bytes = bucket_bytes

    def generate(self, prompt_token_ids: list[list[int]], sampling: SamplingConfig) -> RolloutBatch:
        return _generate(self.rollout, prompt_token_ids, sampling)

    def sync_weights(self) -> int:
        # Every actor rank: a sharded policy is gathered tensor by tensor across the group.
        sends = [h.send_weights.remote(self.manifest, self.bucket_bytes) for h in self.actor.handles]
        receives = [h.receive_weights.remote(self.manifest, self.bucket_bytes) for h in self.rollout.handles]
        # Both sides at once: the broadcast completes only when every rank takes part.
        self.rollout.gather(receives)
        return int(self.actor.gather(sends)[0])
