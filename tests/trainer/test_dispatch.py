"""The driver's side of rank groups, without Ray: how prompts and seeds are split."""

from __future__ import annotations

import pytest
import torch

from rlkube_api.placement import Engines, Role
from rlkube_trainer.batch import TrainBatch
from rlkube_trainer.cluster.dispatch import DataParallelActor, generate, shard_sampling
from rlkube_trainer.cluster.rank_group import LocalRankGroup, split
from rlkube_trainer.rollout import RolloutBatch, RolloutSample, SamplingConfig


def test_prompt_shards_cover_the_batch_in_order() -> None:
    parts = split(10, 3)
    assert [(s.start, s.stop) for s in parts] == [(0, 4), (4, 7), (7, 10)]


def test_each_engine_shard_gets_its_own_seeds() -> None:
    """vLLM numbers a request's n samples seed, seed+1, ...: shards offset by their first
    prompt × n never reuse another shard's random streams."""
    sampling = SamplingConfig(n=8, seed=100)
    seeds = [shard_sampling(sampling, s.start).seed for s in split(64, 4)]
    assert seeds == [100, 100 + 16 * 8, 100 + 32 * 8, 100 + 48 * 8]
    assert shard_sampling(SamplingConfig(n=8, seed=None), 16).seed is None


class EngineRank:
    """What `generate` talks to on each rank: the process boundary, with the engine behind it
    replaced by one that answers each prompt with its own first token (per sample, n of them)."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[list[int]], int | None]] = []

    def generate(self, prompts: list[list[int]], sampling: SamplingConfig) -> RolloutBatch:
        self.calls.append((prompts, sampling.seed))
        samples = [RolloutSample(i, [p[0], j], None, "stop") for i, p in enumerate(prompts) for j in range(sampling.n)]
        return RolloutBatch(samples, sampling.n)


def _ranks(count: int) -> tuple[list[EngineRank], LocalRankGroup]:
    ranks = [EngineRank() for _ in range(count)]
    return ranks, LocalRankGroup(Role.ACTOR, ranks)  # type: ignore[arg-type]


def test_prompts_split_over_engines_every_rank_of_an_engine_gets_its_share_results_in_order() -> None:
    ranks, group = _ranks(4)
    prompts = [[10], [11], [12]]
    out = generate(group, prompts, SamplingConfig(n=2, seed=7), Engines(4, 2))
    # Engine 0 = ranks 0, 1: prompts 0-1, seed 7; engine 1 = ranks 2, 3: prompt 2, seed 7 + 2 prompts × n.
    assert [r.calls for r in ranks] == [[([[10], [11]], 7)]] * 2 + [[([[12]], 11)]] * 2
    assert [(s.prompt_index, s.token_ids) for s in out.samples] == [
        (0, [10, 0]),
        (0, [10, 1]),
        (1, [11, 0]),
        (1, [11, 1]),
        (2, [12, 0]),
        (2, [12, 1]),
    ]


def test_engines_without_prompts_are_still_called() -> None:
    """A colocated engine asleep on a sharded actor re-syncs its weights when it wakes, a
    collective over every actor rank: a rank left out would hang the others."""
    ranks, group = _ranks(4)
    out = generate(group, [[5]], SamplingConfig(n=1, seed=0), Engines(4, 1))
    assert [r.calls for r in ranks] == [[([[5]], 0)]] + [[([], 1)]] * 3
    assert [s.prompt_index for s in out.samples] == [0]


def test_the_same_batch_goes_to_the_same_engines_with_the_same_seeds() -> None:
    """What a resumed step relies on: the split is a function of the batch and the engines."""
    prompts = [[i] for i in range(10)]
    runs = []
    for _ in range(2):
        ranks, group = _ranks(6)
        generate(group, prompts, SamplingConfig(n=4, seed=3), Engines(6, 2))
        runs.append([r.calls for r in ranks])
    assert runs[0] == runs[1]
    assert [len(calls[0][0]) for calls in runs[0]] == [4, 4, 3, 3, 3, 3]


def test_a_group_that_is_not_the_placed_engines_is_refused() -> None:
    _, group = _ranks(2)
    with pytest.raises(ValueError, match="4 engine ranks placed"):
        generate(group, [[1]], SamplingConfig(), Engines(4, 2))


class LogProbRank:
    """An actor rank whose log-prob of each token is its sample's first input id, and whose sum
    of pi^2 is that plus 0.5: the gathered halves show where each row went."""

    def compute_log_prob_and_sum_pi_squared(self, batch: TrainBatch) -> tuple[torch.Tensor, torch.Tensor]:
        log_probs = batch.input_ids[:, :1].float().expand(-1, batch.response_length)
        return log_probs, log_probs + 0.5


def test_log_probs_and_sum_pi_squared_come_back_in_batch_order_over_ranks() -> None:
    rows = 5
    batch = TrainBatch(
        input_ids=torch.arange(rows).unsqueeze(-1).expand(-1, 3).clone(),
        attention_mask=torch.ones(rows, 3, dtype=torch.long),
        responses=torch.zeros(rows, 2, dtype=torch.long),
        response_mask=torch.ones(rows, 2),
        group_index=torch.arange(rows),
        prompt_lengths=torch.ones(rows, dtype=torch.long),
    )
    group = LocalRankGroup(Role.ACTOR, [LogProbRank(), LogProbRank()])  # type: ignore[list-item]
    log_probs, sum_pi_squared = DataParallelActor(group).compute_log_prob_and_sum_pi_squared(batch)
    assert log_probs[:, 0].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert torch.equal(sum_pi_squared, log_probs + 0.5)
