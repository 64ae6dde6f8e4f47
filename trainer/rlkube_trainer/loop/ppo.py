"""The PPO / GRPO loop. One step reads like the algorithm:

    generate → score (→ keep informative groups, DAPO) → old and reference log-probs
    → values → advantages → update critic → update actor → sync weights → metrics

The roles are objects with a few methods (roles.py); where they run (one process, or Ray
rank groups across pods) is not this module's business.
Estimators and losses are looked up by their registered names, so the loop never
branches on an algorithm's name.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from rlkube_api.config import TrainerConfig
from rlkube_trainer.algos import (
    apply_kl_penalty,
    call_with,
    get_adv_estimator_fn,
    get_kl_controller,
    keep_mixed_groups,
    masked_mean,
    takes,
)
from rlkube_trainer.algos.rollout_correction import compute_rollout_correction_and_rejection_mask
from rlkube_trainer.batch import TrainBatch, build_batch, token_level_scores
from rlkube_trainer.data.prompts import Prompt
from rlkube_trainer.loop.metrics import compute_data_metrics, compute_throughput_metrics, compute_variance_proxy_metrics
from rlkube_trainer.loop.roles import Episodes, Metrics, Roles
from rlkube_trainer.loop.scored import Scored, greedy_reward_baselines, reward_components
from rlkube_trainer.reward.scoring import FAILED_METRIC, RewardInput, overlong_reward, score_with_labels
from rlkube_trainer.rollout import RolloutBatch, RolloutSample, SamplingConfig

# tokenizer.decode: token ids -> text (the response the reward function reads).
Detokenize = Callable[..., Any]
# The next batch of prompts (DAPO's dynamic sampling asks for more than one per step).
MorePrompts = Callable[[], list[Prompt]]
# A generation round's seed offset: rounds of one step never share a seed with other steps.
ROUND_SEED_STRIDE = 2**32


class TooManyGenerations(RuntimeError):
    """algorithm.filter_groups: max_num_gen_batches rounds left too few informative groups."""


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


def on_policy(config: TrainerConfig, samples: int) -> bool:
    """Whether the actor update is one optimizer step over the whole batch (one PPO epoch,
    one mini-batch) with nothing reading the old log-probs before it (no KL in the reward, no
    rollout-probs comparison, no estimator that takes them). The weights then do not change
    between the old log-probs' forward and the update's, so the update's own log-probs,
    detached, are the old ones and their separate forward pass over the batch is skipped."""
    return (
        config.actor.ppo_epochs == 1
        and samples <= config.actor.ppo_mini_batch_size * config.rollout.n
        and not config.algorithm.use_kl_in_reward
        and not config.rollout.calculate_log_probs
        # Decoupled rollout correction compares the old log-probs with the engine's before the update.
        and not config.rollout_correction.enabled
        # The optimal token baseline's path variance reads them (and its sum_pi_squared comes
        # from the same pass).
        and not takes(get_adv_estimator_fn(config.algorithm.adv_estimator), "old_log_probs")
    )


def engine_log_probs_needed(config: TrainerConfig) -> bool:
    """The engine returns its log-probs of the sampled tokens: for the rollout-probs comparison,
    or for rollout correction (its pi_rollout). The asynchronous modes turn them on (rather than
    refusing configs without them): their batches come from older weights, and
    algorithm.rolloutCorrection needs pi_rollout to correct that staleness."""
    return (
        config.rollout.calculate_log_probs
        or config.rollout_correction.enabled
        or config.trainer.v1.trainer_mode != "sync"
    )


class PPOTrainer:
    def __init__(
        self,
        config: TrainerConfig,
        roles: Roles,
        decode: Detokenize,
        pad_token_id: int,
        num_gpus: int = 1,
        episodes: Episodes | None = None,
    ) -> None:
        self.config = config
        self.roles = roles
        self.episodes = episodes
        self.decode = decode
        self.pad_token_id = pad_token_id
        self.num_gpus = max(num_gpus, 1)
        algo = config.algorithm
        self.estimate_advantages = get_adv_estimator_fn(algo.adv_estimator)
        # Inputs only some estimators read, produced only for them: ReMax's greedy baseline
        # rollout, the optimal token baseline's sum of pi^2 from the old log-prob pass.
        self.greedy_baseline = takes(self.estimate_advantages, "reward_baselines")
        self.with_sum_pi_squared = takes(self.estimate_advantages, "sum_pi_squared")
        self.kl_ctrl = get_kl_controller(
            algo.kl_ctrl.type, algo.kl_ctrl.kl_coef, algo.kl_ctrl.target_kl, algo.kl_ctrl.horizon
        )
        self.uses_reference = algo.use_kl_in_reward or config.actor.use_kl_loss
        if self.uses_reference and roles.reference is None:
            raise ValueError("a reference role is needed when algorithm.use_kl_in_reward or actor.use_kl_loss is set")
        if algo.adv_estimator == "gae" and roles.critic is None:
            raise ValueError("algorithm.adv_estimator gae needs a critic role")

    def sampling(self, step: int, round_: int = 0) -> SamplingConfig:
        rollout = self.config.rollout
        return SamplingConfig(
            n=rollout.n,
            temperature=rollout.temperature,
            top_p=rollout.top_p,
            top_k=rollout.top_k,
            max_tokens=self.config.data.max_response_length,
            # A seed per step: reproducible runs, and a resumed run samples as the original did.
            seed=self.config.trainer.seed * 100_003 + step + round_ * ROUND_SEED_STRIDE,
            ignore_eos=rollout.ignore_eos,
            # The engine's log-probs: diagnostics, or rollout correction's pi_rollout.
            logprobs=engine_log_probs_needed(self.config),
        )

    def greedy_sampling(self, step: int, round_: int = 0) -> SamplingConfig:
        """One greedy response per prompt (verl's do_sample=False: temperature 0, no top-k or
        top-p), ReMax's baseline."""
        return dataclasses.replace(
            self.sampling(step, round_), n=1, temperature=0.0, top_p=1.0, top_k=-1, logprobs=False
        )

    def generate(self, prompts: list[Prompt], sampling: SamplingConfig) -> RolloutBatch:
        """The samples of `prompts`: one response each from the engine, or with
        rollout.multi_turn a whole tool-calling episode each, or with rollout.harness an episode
        of the user's harness each."""
        if self.episodes is not None:
            return self.episodes.generate(prompts, sampling)
        return self.roles.rollout.generate([p.prompt_token_ids for p in prompts], sampling)

    def score(self, prompts: list[Prompt], rollout: RolloutBatch) -> Scored:
        """Scores each response (decoded without special tokens) against its prompt's ground
        truth; with reward.overlong_buffer, DAPO's overlong penalty is added (training and
        validation alike, as in verl)."""
        rows, responses = [], []
        for sample in rollout.samples:
            prompt = prompts[sample.prompt_index]
            text = str(self.decode(sample.token_ids, skip_special_tokens=True))
            responses.append(text)
            extra_info = prompt.extra_info
            if sample.reward_info is not None:
                # A multi-turn episode's num_turns and rollout_reward_scores, as verl's reward managers add.
                extra_info = {**(extra_info if isinstance(extra_info, dict) else {}), **sample.reward_info}
            rows.append(RewardInput(prompt.data_source, text, prompt.ground_truth, extra_info, prompt.raw_prompt))
        result, labels = score_with_labels(self.roles.reward, rows)
        raw, extra = list(result.scores), dict(result.extra)
        scores = raw
        buffer = self.config.reward.overlong_buffer
        if buffer.enable:
            max_length = self.config.data.max_response_length
            penalty = [
                overlong_reward(len(s.token_ids), max_length, buffer.len, buffer.penalty_factor)
                for s in rollout.samples
            ]
            scores = [r + p for r, p in zip(raw, penalty, strict=True)]
            if buffer.log:
                extra["overlong_reward"] = penalty
                extra["overlong"] = [float(p < 0) for p in penalty]
        return Scored(responses, scores, raw, extra, labels)

    def sample(
        self, prompts: list[Prompt], step: int, more_prompts: MorePrompts | None, timer: Timer
    ) -> tuple[TrainBatch, Metrics]:
        """Generates and scores the step's samples. With algorithm.filter_groups (DAPO's dynamic
        sampling) only groups whose metric varies are kept, and further batches of prompts are
        generated until train_batch_size prompts are kept, for at most max_num_gen_batches rounds."""
        filter_groups = self.config.algorithm.filter_groups
        # Without filtering every prompt given is kept, whatever its number.
        wanted = self.config.data.train_batch_size if filter_groups.enable else len(prompts)
        kept_prompts: list[Prompt] = []
        kept_samples: list[RolloutSample] = []
        kept_scored: list[Scored] = []
        kept_baselines: list[torch.Tensor] = []
        generated_groups = 0
        rounds = 0
        counted: Metrics = {}  # the sampler's counts (a harness's lost episodes), over the rounds
        while True:
            with timer("gen"):
                rollout = self.generate(prompts, self.sampling(step, rounds))
                for name, count in rollout.metrics.items():
                    counted[name] = counted.get(name, 0.0) + count
                # verl times ReMax's greedy rollout within gen (one request with the samples).
                greedy = self.generate(prompts, self.greedy_sampling(step, rounds)) if self.greedy_baseline else None
            with timer("reward"):
                scored = self.score(prompts, rollout)
                if greedy is not None:
                    # Scored as the samples are (overlong penalty included), before any filtering.
                    baselines = greedy_reward_baselines(
                        [s.prompt_index for s in rollout.samples],
                        [s.prompt_index for s in greedy.samples],
                        self.score(prompts, greedy).scores,
                    )
            rounds += 1
            keep = [True] * len(rollout.samples)
            if filter_groups.enable:
                index = [prompts[s.prompt_index].index for s in rollout.samples]
                keep = keep_mixed_groups(scored.metric(filter_groups.metric), index)
            # Whole groups in prompt order, up to the batch size (the last round may bring more).
            kept_here = sorted({s.prompt_index for s, k in zip(rollout.samples, keep, strict=True) if k})
            kept_here = kept_here[: wanted - len(kept_prompts)]
            position = {p: len(kept_prompts) + i for i, p in enumerate(kept_here)}
            keep = [k and s.prompt_index in position for s, k in zip(rollout.samples, keep, strict=True)]
            kept_samples += [
                dataclasses.replace(s, prompt_index=position[s.prompt_index])
                for s, k in zip(rollout.samples, keep, strict=True)
                if k
            ]
            kept_prompts += [prompts[p] for p in kept_here]
            kept_scored.append(scored.select(keep))
            if greedy is not None:
                kept_baselines.append(baselines[torch.tensor(keep, dtype=torch.bool)])
            generated_groups += len(prompts)
            if not filter_groups.enable or len(kept_prompts) >= wanted:
                break
            cap = filter_groups.max_num_gen_batches
            if cap > 0 and rounds >= cap:
                raise TooManyGenerations(
                    f"step {step}: {len(kept_prompts)} of {wanted} prompts kept after {rounds} generation rounds "
                    "(algorithm.filter_groups.max_num_gen_batches); the data may be too easy or too hard "
                    "for the policy, or set max_num_gen_batches to 0 for no cap"
                )
            if more_prompts is None:
                raise TooManyGenerations("algorithm.filter_groups needs more prompts and none were given")
            prompts = more_prompts()

        batch = build_batch(kept_prompts, RolloutBatch(kept_samples, rollout.n), self.pad_token_id)
        scored = Scored.concat(kept_scored)
        batch.token_level_scores = token_level_scores(scored.scores, batch.response_mask)
        batch.reward_extra = {k: torch.tensor(v, dtype=torch.float32) for k, v in scored.extra.items()}
        if self.greedy_baseline:
            batch.reward_baselines = torch.cat(kept_baselines)
        metrics = {f"reward_extra/{k}/mean": sum(v) / len(v) for k, v in scored.extra.items() if v} | counted
        if FAILED_METRIC in scored.extra:  # reward.onFailure zero: the rows scored 0 for want of a result
            metrics["reward/failed_samples"] = sum(scored.extra[FAILED_METRIC])
        if filter_groups.enable:
            metrics["train/num_gen_batches"] = float(rounds)
            metrics["train/kept_groups_ratio"] = len(kept_prompts) / generated_groups
        return batch, metrics

    def step(self, prompts: list[Prompt], step: int, more_prompts: MorePrompts | None = None) -> Metrics:
        """One PPO step on a batch of prompts (and, with DAPO's dynamic sampling, on as many
        further batches from `more_prompts` as it needs); returns its metrics (verl's names)."""
        timer = Timer()
        with timer("step"):
            batch, reward_metrics = self.sample(prompts, step, more_prompts, timer)
            metrics = self.update(batch, timer)
            with timer("update_weights"):
                synced = self.roles.rollout.sync_weights()
        return self.step_metrics(batch, metrics | reward_metrics, timer, synced)

    def update(self, batch: TrainBatch, timer: Timer) -> Metrics:
        """Everything after sampling up to the actor's update: old and reference log-probs,
        rollout correction, values, advantages, critic and actor updates. The asynchronous
        schedule calls it on batches generated with older weights; the weight push is the
        caller's (between generations)."""
        roles, algo = self.roles, self.config.algorithm
        metrics: Metrics = {}
        correction = self.config.rollout_correction
        if correction.enabled and batch.rollout_log_probs is None:
            raise ValueError("algorithm.rollout_correction needs the engine's log-probs, which it did not return")
        if correction.bypass_mode:
            # verl's bypass mode: the engine's log-probs are the old ones (no old log-prob pass).
            batch.old_log_probs = batch.rollout_log_probs
        elif not on_policy(self.config, len(batch)):
            with timer("old_log_prob"):
                if self.with_sum_pi_squared:
                    batch.old_log_probs, batch.sum_pi_squared = roles.actor.compute_log_prob_and_sum_pi_squared(batch)
                else:
                    batch.old_log_probs = roles.actor.compute_log_prob(batch)
        if self.config.rollout.calculate_log_probs:
            metrics.update(rollout_probs_diff(batch))
        if correction.enabled and not correction.bypass_mode:
            # Decoupled: once per batch against the old log-probs, before the advantages (as verl).
            assert batch.old_log_probs is not None and batch.rollout_log_probs is not None
            batch.rollout_is_weights, batch.response_mask, corr_metrics = compute_rollout_correction_and_rejection_mask(
                batch.old_log_probs, batch.rollout_log_probs, batch.response_mask, correction
            )
            metrics.update(corr_metrics)
        if self.uses_reference:
            assert roles.reference is not None
            with timer("ref"):
                batch.ref_log_probs = roles.reference.compute_ref_log_prob(batch)
        if roles.critic is not None:
            with timer("values"):
                batch.values = roles.critic.compute_values(batch)

        with timer("adv"):
            assert batch.token_level_scores is not None
            if algo.use_kl_in_reward:
                assert batch.ref_log_probs is not None and batch.old_log_probs is not None  # not on_policy
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
                reward_baselines=batch.reward_baselines,
                old_log_probs=batch.old_log_probs,
                sum_pi_squared=batch.sum_pi_squared,
                rollout_is_weights=batch.rollout_is_weights,
                gamma=algo.gamma,
                lam=algo.lam,
                norm_adv_by_std_in_grpo=algo.norm_adv_by_std_in_grpo,
                reward_components=reward_components(batch, algo.gdpo_reward_keys),
                reward_weights=algo.gdpo_reward_weights,
            )

        if roles.critic is not None:
            with timer("update_critic"):
                metrics.update(roles.critic.update(batch))
        with timer("update_actor"):
            metrics.update(roles.actor.update(batch))
        return metrics

    def step_metrics(self, batch: TrainBatch, metrics: Metrics, timer: Timer, synced: int) -> Metrics:
        """A step's metrics beyond its phases': data, timings, throughput (verl's names)."""
        metrics.update(compute_data_metrics(batch, self.config.data.max_prompt_length))
        metrics.update(compute_variance_proxy_metrics(batch, metrics.get("actor/grad_norm")))
        metrics.update(timer.seconds)
        metrics.update(compute_throughput_metrics(batch, timer.seconds["timing_s/step"], self.num_gpus))
        if synced and timer.seconds["timing_s/update_weights"] > 0:
            metrics["perf/weight_sync_gb_per_s"] = synced / 1e9 / timer.seconds["timing_s/update_weights"]
        return metrics
