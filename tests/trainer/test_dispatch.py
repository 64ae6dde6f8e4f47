"""The driver's side of rank groups, without Ray: how prompts and seeds are split."""

from __future__ import annotations

from rlkube_trainer.dispatch import shard_sampling
from rlkube_trainer.rank_group import split
from rlkube_trainer.rollout import SamplingConfig


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
