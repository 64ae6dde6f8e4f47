"""rollout.harness's sampling: each prompt's samples are episodes of the user's harness.

It takes the place of one engine call in the step (PPOTrainer.generate), as the multi-turn
sampler does: for a batch, an Endpoint is served on the driver's loopback interface over the
rollout engine (its calls batched by `BatchingGenerator`, with the step's sampling and a token of
its own), one harness process runs per (prompt, sample) with the row in RLKUBE_EPISODE, and every
finished episode becomes a `RolloutSample` (`training_sample`) with the harness's reward in
extra_info["harness_reward"].

A lost episode (harness.py says why) takes its whole group out of the step. The survivors of a
group are not a sample of the policy's episodes for that prompt: losses follow behaviour (a
harness that fails on some answers, a model that loops until the timeout), so a baseline from
them is biased, and GRPO's advantages are relative to it. Whole groups also keep the batch a
multiple of samplesPerPrompt, and after a loss the kept groups are cut to a number whose samples
split evenly over the training ranks (`sample_multiple`), so that every rank runs as many mini-
and micro-batches as the others. Losses are counted in rollout/episodes_lost and
rollout/groups_dropped; a batch that keeps no group fails the step, naming the harness and the
first reasons.
"""

from __future__ import annotations

import json
import secrets
import shlex
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from transformers import PreTrainedTokenizerBase

from rlkube_api.config import HarnessConfig, TrainerConfig
from rlkube_trainer.data.prompts import Prompt
from rlkube_trainer.rollout.agent.engine_adapter import Engine
from rlkube_trainer.rollout.agent.sampler import messages_of
from rlkube_trainer.rollout.base import RolloutBatch, RolloutSample, SamplingConfig
from rlkube_trainer.rollout.endpoint.harness import Outcome, run_episodes
from rlkube_trainer.rollout.endpoint.recorder import EpisodeRecord
from rlkube_trainer.rollout.endpoint.samples import training_sample
from rlkube_trainer.rollout.endpoint.server import Endpoint

EPISODES_LOST = "rollout/episodes_lost"
GROUPS_DROPPED = "rollout/groups_dropped"


class HarnessError(RuntimeError):
    """No group of a batch kept an episode of every sample: the harness, not the policy, failed."""


def episode_task(prompt: Prompt) -> dict[str, Any]:
    """RLKUBE_EPISODE: the row as a harness needs it, in plain JSON (a parquet row's arrays as lists)."""
    task = {
        "prompt": messages_of(prompt.raw_prompt),
        "data_source": prompt.data_source,
        "ground_truth": prompt.ground_truth,
        "extra_info": prompt.extra_info,
        "index": prompt.index,
        "uid": prompt.uid,
    }
    plain: dict[str, Any] = json.loads(
        json.dumps(task, default=lambda o: o.tolist() if hasattr(o, "tolist") else str(o))
    )
    return plain


def kept_groups(
    order: Sequence[int],
    outcomes: Sequence[Outcome],
    n: int,
    sample_multiple: int,
    to_sample: Callable[[int, EpisodeRecord], RolloutSample],
    command: Sequence[str],
) -> RolloutBatch:
    """The samples of the groups whose every episode finished; when some were lost, the first of
    them as many as split evenly (their samples a multiple of `sample_multiple`; a batch with
    nothing lost is the caller's, as an engine's would be). Pure."""
    lost_prompts = {p for p, o in zip(order, outcomes, strict=True) if o.lost is not None}
    whole = sorted(set(order) - lost_prompts)
    groups_per_split = next(g for g in range(1, sample_multiple + 1) if g * n % sample_multiple == 0)
    kept = set(whole[: len(whole) - len(whole) % groups_per_split] if lost_prompts else whole)
    lost = [o for o in outcomes if o.lost is not None]
    if not kept:
        too_few = f"; {len(whole)} whole groups, too few to split evenly over the training ranks" if whole else ""
        raise HarnessError(
            f"rollout.harness.command {shlex.join(command)}: {len(lost)} of {len(outcomes)} episodes lost, "
            f"no group of the batch kept{too_few}; first losses: "
            + "; ".join(f"{o.episode_id}: {o.lost}" for o in lost[:3])
        )
    samples: list[RolloutSample] = [
        to_sample(p, o.record) for p, o in zip(order, outcomes, strict=True) if p in kept and o.record is not None
    ]
    metrics = {
        EPISODES_LOST: float(len(lost)),
        GROUPS_DROPPED: float(len(set(order)) - len(kept)),
    }
    return RolloutBatch(samples, n, metrics)


class HarnessSampler:
    """rollout.harness of a run; `generate` per batch (training and validation alike)."""

    def __init__(
        self,
        engine: Engine,
        tokenizer: PreTrainedTokenizerBase,
        section: HarnessConfig,
        response_length: int,
        sample_multiple: int = 1,
    ) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.command = list(section.command)
        self.timeout_seconds = section.timeout_seconds
        self.require_reward = section.require_reward
        self.max_concurrent_episodes = section.max_concurrent_episodes
        self.response_length = response_length
        self.sample_multiple = sample_multiple
        self._batches = 0  # episode ids are unique within a run: b<batch>-<episode>

    def generate(self, prompts: list[Prompt], sampling: SamplingConfig) -> RolloutBatch:
        """`sampling.n` episodes per prompt, grouped in prompt order as an engine's samples are."""
        order = [i for i in range(len(prompts)) for _ in range(sampling.n)]
        # One continuation per call: each episode is its own request (and seed) in the engine's batch.
        endpoint = Endpoint(self.engine, self.tokenizer, replace(sampling, n=1), secrets.token_urlsafe(32))
        try:
            outcomes = run_episodes(
                endpoint,
                endpoint.serve(),
                self.command,
                [episode_task(prompts[i]) for i in order],
                self.timeout_seconds,
                self.require_reward,
                prefix=f"b{self._batches}",
                max_concurrent=self.max_concurrent_episodes,
            )
        finally:
            endpoint.close()
            self._batches += 1

        def to_sample(prompt_index: int, record: EpisodeRecord) -> RolloutSample:
            return training_sample(prompt_index, record, self.response_length, sampling.logprobs)

        return kept_groups(order, outcomes, sampling.n, self.sample_multiple, to_sample, self.command)


def harness_sampler(
    engine: Engine, tokenizer: PreTrainedTokenizerBase, config: TrainerConfig, sample_multiple: int = 1
) -> HarnessSampler | None:
    """The run's harness sampler, or None without rollout.harness."""
    section = config.rollout.harness
    if section is None:
        return None
    return HarnessSampler(engine, tokenizer, section, config.data.max_response_length, sample_multiple)
