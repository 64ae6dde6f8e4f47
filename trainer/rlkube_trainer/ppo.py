"""The PPO / GRPO loop. One step reads like the algorithm:

    generate → score → old and reference log-probs → values → advantages
    → update critic → update actor → sync weights to the rollout → metrics

The roles are objects with a few methods (workers.py, rollout/); where they run
(one process, or Ray worker groups across pods) is not this module's business.
Estimators and losses are looked up by their registered names, so the loop never
branches on an algorithm's name.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from rlkube_api.config import TrainerConfig
from rlkube_trainer.algos import apply_kl_penalty, get_adv_estimator_fn, get_kl_controller, masked_mean
from rlkube_trainer.batch import TrainBatch, build_batch, token_level_scores
from rlkube_trainer.data import Prompt
from rlkube_trainer.metrics import compute_data_metrics, compute_throughput_metrics
from rlkube_trainer.reward import RewardInput, RewardScorer
from rlkube_trainer.rollout import RolloutBatch, SamplingConfig

Metrics = dict[str, float]


class Actor(Protocol):
    def compute_log_prob(self, batch: TrainBatch) -> torch.Tensor: ...
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


# tokenizer.decode: token ids -> text (the response the reward function reads).
Detokenize = Callable[..., Any]


@dataclass
class Roles:
    actor: Actor
    rollout: Rollout
    reward: RewardScorer
    reference: Reference | None = None
    critic: Critic | None = None


def call_with(fn: Callable[..., Any], **available: Any) -> Any:
    """Calls fn with the arguments it names, from those available (estimators differ
    in what they need: values for gae, the group index for grpo/rloo, ...)."""
    params = inspect.signature(fn).parameters
    return fn(**{name: value for name, value in available.items() if name in params})


class Timer:
    """timing_s/<name> for each phase of a step."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[f"timing_s/{name}"] = self.seconds.get(f"timing_s/{name}", 0.0) + time.perf_counter() - start


def rollout_probs_diff(batch: TrainBatch) -> Metrics:
    """verl's training/rollout_probs_diff_*: |p_engine - p_actor| of the sampled tokens,
    which shows whether rollout and training compute the same policy."""
    assert batch.rollout_log_probs is not None and batch.old_log_probs is not None
    diff = (batch.rollout_log_probs.exp() - batch.old_log_probs.exp()).abs()
    picked = diff[batch.response_mask.bool()]
    return {
        "training/rollout_probs_diff_mean": masked_mean(diff, batch.response_mask).item(),
        "training/rollout_probs_diff_max": picked.max().item() if picked.numel() else 0.0,
    }


class PPOTrainer:
    def __init__(
        self, config: TrainerConfig, roles: Roles, decode: Detokenize, pad_token_id: int, num_gpus: int = 1
    ) -> None:
        self.config = config
        self.roles = roles
        self.decode = decode
        self.pad_token_id = pad_token_id
        self.num_gpus = max(num_gpus, 1)
        algo = config.algorithm
        self.estimate_advantages = get_adv_estimator_fn(algo.adv_estimator)
        self.kl_ctrl = get_kl_controller(
            algo.kl_ctrl.type, algo.kl_ctrl.kl_coef, algo.kl_ctrl.target_kl, algo.kl_ctrl.horizon
        )
        self.uses_reference = algo.use_kl_in_reward or config.actor.use_kl_loss
        if self.uses_reference and roles.reference is None:
            raise ValueError("a reference role is needed when algorithm.use_kl_in_reward or actor.use_kl_loss is set")
        if algo.adv_estimator == "gae" and roles.critic is None:
            raise ValueError("algorithm.adv_estimator gae needs a critic role")

    def sampling(self, step: int) -> SamplingConfig:
        rollout = self.config.rollout
        return SamplingConfig(
            n=rollout.n,
            temperature=rollout.temperature,
            top_p=rollout.top_p,
            top_k=rollout.top_k,
            max_tokens=self.config.data.max_response_length,
            # A seed per step: reproducible runs, and a resumed run samples as the original did.
            seed=self.config.trainer.seed * 100_003 + step,
            ignore_eos=rollout.ignore_eos,
            # The loop recomputes old log-probs with the actor; the engine's are diagnostics.
            logprobs=rollout.calculate_log_probs,
        )

    def score(self, prompts: list[Prompt], rollout: RolloutBatch) -> tuple[list[float], Metrics]:
        """Scores each response (decoded without special tokens) against its prompt's ground truth."""
        rows = []
        for sample in rollout.samples:
            prompt = prompts[sample.prompt_index]
            text = str(self.decode(sample.token_ids, skip_special_tokens=True))
            rows.append(
                RewardInput(prompt.data_source, text, prompt.ground_truth, prompt.extra_info, prompt.raw_prompt)
            )
        scores, extra = self.roles.reward.score(rows)
        metrics = {f"reward_extra/{k}/mean": sum(v) / len(v) for k, v in extra.items() if v}
        return scores, metrics

    def step(self, prompts: list[Prompt], step: int) -> Metrics:
        """One PPO step on a batch of prompts; returns its metrics (verl's names)."""
        roles, algo = self.roles, self.config.algorithm
        timer = Timer()
        metrics: Metrics = {}
        with timer("step"):
            with timer("gen"):
                rollout = roles.rollout.generate([p.prompt_token_ids for p in prompts], self.sampling(step))
            batch = build_batch(prompts, rollout, self.pad_token_id)

            with timer("reward"):
                scores, reward_metrics = self.score(prompts, rollout)
                batch.token_level_scores = token_level_scores(scores, batch.response_mask)
            with timer("old_log_prob"):
                batch.old_log_probs = roles.actor.compute_log_prob(batch)
            if self.config.rollout.calculate_log_probs:
                metrics.update(rollout_probs_diff(batch))
            if self.uses_reference:
                assert roles.reference is not None
                with timer("ref"):
                    batch.ref_log_probs = roles.reference.compute_ref_log_prob(batch)
            if roles.critic is not None:
                with timer("values"):
                    batch.values = roles.critic.compute_values(batch)

            with timer("adv"):
                if algo.use_kl_in_reward:
                    assert batch.ref_log_probs is not None
                    batch.token_level_rewards, kl_metrics = apply_kl_penalty(
                        batch.token_level_scores,
                        batch.old_log_probs,
                        batch.ref_log_probs,
                        batch.response_mask,
                        self.kl_ctrl,
                        algo.kl_penalty,
                    )
                    metrics.update(kl_metrics)
                else:
                    batch.token_level_rewards = batch.token_level_scores
                batch.advantages, batch.returns = call_with(
                    self.estimate_advantages,
                    token_level_rewards=batch.token_level_rewards,
                    values=batch.values,
                    response_mask=batch.response_mask,
                    index=batch.group_index.tolist(),
                    gamma=algo.gamma,
                    lam=algo.lam,
                    norm_adv_by_std_in_grpo=algo.norm_adv_by_std_in_grpo,
                )

            if roles.critic is not None:
                with timer("update_critic"):
                    metrics.update(roles.critic.update(batch))
            with timer("update_actor"):
                metrics.update(roles.actor.update(batch))
            with timer("update_weights"):
                synced = roles.rollout.sync_weights()

        metrics.update(reward_metrics)
        metrics.update(compute_data_metrics(batch))
        metrics.update(timer.seconds)
        metrics.update(compute_throughput_metrics(batch, timer.seconds["timing_s/step"], self.num_gpus))
        if synced and timer.seconds["timing_s/update_weights"] > 0:
            metrics["perf/weight_sync_gb_per_s"] = synced / 1e9 / timer.seconds["timing_s/update_weights"]
        return metrics
