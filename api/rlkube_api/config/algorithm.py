"""The algorithm section: the advantage estimator, KL in the reward, DAPO's dynamic sampling,
and the estimator names every other part of rlkube reads."""

from __future__ import annotations

import itertools
from typing import Annotated, Literal, get_args

from pydantic import Field

from rlkube_api.base import ApiModel, CelRule
from rlkube_api.config.common import KLPenalty
from rlkube_api.config.rollout_correction import RolloutCorrectionConfig

# verl 0.9.1's registered advantage estimators: the one list of their names. The trainer
# registers a function under each of them (rlkube_trainer.algos.advantage; a test ties the two).
AdvEstimator = Literal[
    "gae",
    "grpo",
    "rloo",
    "reinforce_plus_plus",
    "reinforce_plus_plus_baseline",
    "remax",
    "opo",
    "grpo_passk",
    "gpg",
    "gdpo",
    "optimal_token_baseline",
    "tir_optimal_token_baseline",
    "grpo_vectorized",
    "rloo_vectorized",
]
ADV_ESTIMATORS: tuple[AdvEstimator, ...] = get_args(AdvEstimator)

# Estimators that read the actor's sum over the vocabulary of pi^2 (verl's sum_pi_squared), which
# the trainer computes in the old log-prob pass.
SUM_PI_SQUARED_ESTIMATORS: tuple[AdvEstimator, ...] = ("optimal_token_baseline", "tir_optimal_token_baseline")

# Estimators that compare samples of the same prompt need more than one sample each.
GROUP_ESTIMATORS: tuple[AdvEstimator, ...] = (
    "grpo",
    "grpo_vectorized",
    "rloo",
    "rloo_vectorized",
    "reinforce_plus_plus_baseline",
    "opo",
    "grpo_passk",
    "gpg",
    "gdpo",
    *SUM_PI_SQUARED_ESTIMATORS,
)

# What algorithm.advEstimator's description adds to a name; neighbours in ADV_ESTIMATORS with
# the same note share it ("a and b (note)").
_ESTIMATOR_NOTES: dict[AdvEstimator, str] = {
    "gae": "PPO with critic",
    "remax": "a greedy response per prompt is generated and scored as its baseline",
    "gdpo": "gdpoRewardKeys",
    **dict.fromkeys(SUM_PI_SQUARED_ESTIMATORS, "the actor's old log-prob pass also computes its sum of pi^2"),
    "grpo_vectorized": "grpo",
    "rloo_vectorized": "rloo, a lone sample 0",
}


def _estimators_text() -> str:
    """Every estimator's name, in ADV_ESTIMATORS' order, each with its note."""
    parts: list[str] = []
    for note, group in itertools.groupby(ADV_ESTIMATORS, key=_ESTIMATOR_NOTES.get):
        names = list(group)
        parts += names if note is None else [f"{' and '.join(names)} ({note})"]
    return ", ".join(parts)


class KLControlConfig(ApiModel):
    """The coefficient of KL-in-reward (algorithm.use_kl_in_reward)."""

    type: Literal["fixed", "adaptive"] = Field("fixed", description="fixed or adaptive (target_kl, horizon).")
    kl_coef: float = Field(0.001, ge=0, description="Initial (or fixed) KL coefficient.")
    target_kl: float = Field(0.1, gt=0, description="Adaptive: the KL to steer towards.")
    horizon: int = Field(10000, ge=1, description="Adaptive: steps over which the coefficient adapts.")


class FilterGroupsConfig(ApiModel):
    """DAPO's dynamic sampling: groups whose samples all score alike carry no signal for a
    group estimator; they are dropped and more prompts generated until the batch is full."""

    enable: bool = Field(False, description="Drop groups whose metric is the same for every sample.")
    metric: str = Field(
        "score",
        min_length=1,
        description="What must differ within a group: score (the scorer's), seq_reward "
        "(the reward, overlong penalty included), or a key of the reward function's dict such as acc.",
    )
    max_num_gen_batches: int = Field(
        10, description="Generation rounds per step before the step fails (0 or less: no cap)."
    )


class AlgorithmConfig(ApiModel):
    """Advantage estimation and KL-in-reward."""

    cel_rules = (
        CelRule(
            "!has(self.advEstimator) || self.advEstimator != 'gdpo' || "
            "(has(self.gdpoRewardKeys) && size(self.gdpoRewardKeys) > 0)",
            "advEstimator gdpo needs gdpoRewardKeys: the reward components (keys of the reward function's "
            "dict) it normalises one by one",
            ".gdpoRewardKeys",
        ),
        CelRule(
            "!has(self.gdpoRewardWeights) || !has(self.gdpoRewardKeys) || "
            "size(self.gdpoRewardWeights) == size(self.gdpoRewardKeys)",
            "gdpoRewardWeights needs one weight per key of gdpoRewardKeys",
            ".gdpoRewardWeights",
        ),
    )

    adv_estimator: AdvEstimator = Field(
        "grpo",
        description=f"Advantage estimator (verl's names): {_estimators_text()}.",
    )
    gamma: float = Field(1.0, ge=0, le=1, description="Discount factor.")
    lam: float = Field(1.0, ge=0, le=1, description="GAE lambda.")
    norm_adv_by_std_in_grpo: bool = Field(True, description="GRPO: divide by the group's std (false gives Dr.GRPO).")
    gdpo_reward_keys: list[Annotated[str, Field(min_length=1, max_length=256)]] = Field(
        default_factory=list,
        max_length=32,
        description="gdpo: keys of the reward function's dict whose numbers are normalised one by one "
        "within their group before being summed.",
    )
    gdpo_reward_weights: list[float] | None = Field(
        None, max_length=32, description="gdpo: a weight per key of gdpoRewardKeys (default 1 each)."
    )
    use_kl_in_reward: bool = Field(False, description="Subtract beta*KL(actor||reference) from the reward.")
    kl_penalty: KLPenalty = Field("kl", description="KL estimator used in the reward.")
    kl_ctrl: KLControlConfig = Field(default_factory=KLControlConfig, description="KL coefficient control.")
    filter_groups: FilterGroupsConfig = Field(default_factory=FilterGroupsConfig, description="DAPO dynamic sampling.")
    rollout_correction: RolloutCorrectionConfig = Field(
        default_factory=RolloutCorrectionConfig,
        description="Importance weights and rejection sampling against the engine's own log-probs.",
    )
