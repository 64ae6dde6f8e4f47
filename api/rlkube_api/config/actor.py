"""The actor section: the policy update (PPO clip objective, KL loss, entropy bonus, policy losses)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rlkube_api.base import CelRule
from rlkube_api.config.common import MAX_BATCH, KLPenalty, TokenBudget
from rlkube_api.config.update import UpdateConfig

PolicyLoss = Literal[
    "vanilla", "dppo_tv", "dppo_kl", "gspo", "sapo", "gpg", "clip_cov", "kl_cov", "geo_mean", "dro", "cispo"
]
RecomputeLogits = Literal["auto", "always", "never"]


class ActorConfig(UpdateConfig):
    """The policy update (PPO clip objective, KL loss, entropy bonus)."""

    cel_rules = (
        CelRule(
            "!has(self.clipRatioLow) || self.clipRatioLow < 1.0",
            "clipRatioLow must be below 1",
            ".clipRatioLow",
        ),
        CelRule(
            "!has(self.policyLoss) || self.policyLoss != 'dro' || has(self.droBeta)",
            "policyLoss dro needs droBeta",
            ".droBeta",
        ),
    )

    ppo_mini_batch_size: int = Field(
        256,
        ge=1,
        le=MAX_BATCH,
        description="Prompts per optimizer step (times rollout.n samples); divides trainBatchSize.",
    )
    log_prob_max_token_len_per_gpu: TokenBudget | None = Field(
        None,
        description="useDynamicBsz: tokens per micro-batch of the forward-only log-prob passes (old "
        "log-probs; the reference's too unless ref.logProbMaxTokenLenPerGpu); default ppoMaxTokenLenPerGpu.",
    )
    ppo_epochs: int = Field(1, ge=1, description="Passes over each batch.")
    shuffle: bool = Field(False, description="Shuffle samples between PPO epochs.")
    clip_ratio: float = Field(0.2, gt=0, description="PPO clip range (both sides unless set apart).")
    clip_ratio_low: float | None = Field(None, gt=0, description="Lower clip range (defaults to clipRatio).")
    clip_ratio_high: float | None = Field(
        None, gt=0, description="Upper clip range (defaults to clipRatio; larger = DAPO's clip-higher)."
    )
    clip_ratio_c: float = Field(3.0, gt=1, description="Dual-clip bound for negative advantages (> 1).")
    entropy_coeff: float = Field(0.0, ge=0, description="Entropy bonus coefficient.")
    use_kl_loss: bool = Field(False, description="Add KL(actor||reference) to the loss (the GRPO way).")
    kl_loss_coef: float = Field(0.001, ge=0, description="Coefficient of the KL loss.")
    kl_loss_type: KLPenalty = Field("low_var_kl", description="KL estimator of the KL loss.")
    policy_loss: PolicyLoss = Field(
        "vanilla",
        description="Registered policy-loss function (verl's policy_loss.loss_mode): vanilla (token-level "
        "PPO ratio), gspo (sequence-level ratio; use small clip ratios such as 3e-4/4e-4), dppo_tv, dppo_kl "
        "(clip ratios are divergence thresholds), sapo (tauPos/tauNeg), gpg, clip_cov, kl_cov, geo_mean, "
        "dro (droBeta), cispo.",
    )
    tau_pos: float = Field(1.0, gt=0, description="sapo: gate temperature for positive advantages.")
    tau_neg: float = Field(1.05, gt=0, description="sapo: gate temperature for other advantages.")
    clip_cov_ratio: float = Field(0.0002, gt=0, le=1, description="clip_cov: share of tokens whose gradient is cut.")
    clip_cov_lb: float = Field(1.0, description="clip_cov: lower bound of the covariance of the tokens cut.")
    clip_cov_ub: float = Field(5.0, description="clip_cov: upper bound of the covariance of the tokens cut.")
    kl_cov_ratio: float = Field(0.0002, gt=0, le=1, description="kl_cov: share of tokens given the KL penalty.")
    ppo_kl_coef: float = Field(0.1, ge=0, description="kl_cov: coefficient of the |log ratio| penalty.")
    dro_beta: float | None = Field(
        None, gt=0, description="dro: coefficient of the quadratic log-ratio penalty (required for dro)."
    )
    recompute_logits: RecomputeLogits = Field(
        "auto",
        description="The LM head in the update's backward. The log-probs (and entropy) come from the "
        "head chunk by chunk; always: each chunk's logits are freed after the forward and recomputed in the "
        "backward (one chunk alive at a time, the head's matmul runs three times); never: every chunk's fp32 "
        "logits stay until the backward (the head runs twice; on an H100, 22.8 % to 25.6 % of the matmul "
        "rate); auto: never when the micro-batch's kept logits (scored tokens × vocabulary × 4 bytes, ×2 "
        "with the entropy in the loss) fit in an eighth of the GPU's memory (2 GiB on CPU), always otherwise. "
        "verl's model.useFusedKernels true (its chunked head, recomputed in the backward) is always.",
    )
