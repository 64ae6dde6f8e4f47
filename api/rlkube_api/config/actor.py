"""The actor section: the policy update (PPO clip objective, KL loss, entropy bonus, policy losses)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rlkube_api.base import ApiModel, CelRule
from rlkube_api.config.common import MAX_BATCH, KLPenalty, LossAggMode, TokenBudget
from rlkube_api.config.fsdp import COMPILE_DECODER_LAYERS, FSDPConfig, Strategy
from rlkube_api.config.optim import OptimConfig

PolicyLoss = Literal[
    "vanilla", "dppo_tv", "dppo_kl", "gspo", "sapo", "gpg", "clip_cov", "kl_cov", "geo_mean", "dro", "cispo"
]
RecomputeLogits = Literal["auto", "always", "never"]


class ActorConfig(ApiModel):
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

    optim: OptimConfig = Field(default_factory=OptimConfig, description="Optimizer of the actor.")
    ppo_mini_batch_size: int = Field(
        256,
        ge=1,
        le=MAX_BATCH,
        description="Prompts per optimizer step (times rollout.n samples); divides trainBatchSize.",
    )
    ppo_micro_batch_size_per_gpu: int = Field(
        8,
        ge=1,
        le=MAX_BATCH,
        description="Samples per forward/backward on each rank; a rank's share of a mini-batch "
        "(ppoMiniBatchSize × samplesPerPrompt / data-parallel ranks) must be a multiple of it.",
    )
    use_dynamic_bsz: bool = Field(
        False,
        description="Micro-batches by token count instead of ppoMicroBatchSizePerGpu samples: each holds "
        "as many samples as fit in ppoMaxTokenLenPerGpu (prompt + response tokens), for the update, the "
        "old log-probs and the reference's log-probs. Gradients are those of the whole mini-batch.",
    )
    ppo_max_token_len_per_gpu: TokenBudget = Field(
        16384, description="useDynamicBsz: tokens per update micro-batch on each rank."
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
    loss_agg_mode: LossAggMode = Field("token-mean", description="How token losses aggregate.")
    loss_scale_factor: int | None = Field(
        None,
        gt=0,
        description="seq-mean-token-sum-norm: the constant the sequence mean is divided by "
        "(default the batch's response length).",
    )
    entropy_coeff: float = Field(0.0, ge=0, description="Entropy bonus coefficient.")
    use_kl_loss: bool = Field(False, description="Add KL(actor||reference) to the loss (the GRPO way).")
    kl_loss_coef: float = Field(0.001, ge=0, description="Coefficient of the KL loss.")
    kl_loss_type: KLPenalty = Field("low_var_kl", description="KL estimator of the KL loss.")
    grad_clip: float = Field(1.0, gt=0, description="Gradient-norm clipping.")
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
    strategy: Strategy = Field(
        "auto", description="Data parallelism across the actor's ranks: fsdp2, replicate, or auto (fsdp2 on GPU)."
    )
    fsdp_config: FSDPConfig = Field(default_factory=FSDPConfig, description="FSDP2 settings of the actor.")
    compile_decoder_layers: bool = Field(
        False, description=COMPILE_DECODER_LAYERS.format(role="the actor's update and its old log-prob pass")
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
