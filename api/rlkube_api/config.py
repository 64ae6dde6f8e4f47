"""The trainer's configuration: model, data, algorithm, actor, critic, rollout,
reward, trainer and checkpoint sections, with verl's key names.

The same models are the sections of an RLJob's spec (camelCase there, e.g.
`advEstimator`) and of the trainer's YAML (verl's snake_case, e.g.
`adv_estimator`), so a recipe moves between `rlkube-trainer run` and a cluster
unchanged.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from rlkube_api.base import ApiModel, CelRule
from rlkube_api.kube_syntax import CONFIG_MAP_KEY_PATTERN, LONG_NAME
from rlkube_api.roles import Roles

# verl 0.9.1's registered estimators.
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
# Estimators that read the actor's sum over the vocabulary of pi^2 (verl's sum_pi_squared), which
# the trainer computes in the old log-prob pass.
SUM_PI_SQUARED_ESTIMATORS = ("optimal_token_baseline", "tir_optimal_token_baseline")
# Each estimator, and verl's straight-through "+" variant (its value, k2's gradient).
KLPenalty = Literal[
    "kl",
    "k1",
    "abs",
    "mse",
    "k2",
    "low_var_kl",
    "k3",
    "kl+",
    "k1+",
    "abs+",
    "mse+",
    "k2+",
    "low_var_kl+",
    "k3+",
]
PolicyLoss = Literal[
    "vanilla", "dppo_tv", "dppo_kl", "gspo", "sapo", "gpg", "clip_cov", "kl_cov", "geo_mean", "dro", "cispo"
]
Logger = Literal["console", "tensorboard", "mlflow", "wandb"]
LossAggMode = Literal["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]

# Estimators that compare samples of the same prompt need more than one sample each.
GROUP_ESTIMATORS = (
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

# Token budgets of dynamic micro-batches (verl's *_max_token_len_per_gpu), bounded for the same reason.
MAX_TOKEN_BUDGET = 1 << 30
TokenBudget = Annotated[int, Field(ge=1, le=MAX_TOKEN_BUDGET)]

# Bounds on batch sizes keep the batch arithmetic below (products of three of them) far from
# CEL's 64-bit overflow, which the API server would report as an evaluation error.
MAX_BATCH = 1_048_576

FilePath = Annotated[str, Field(min_length=1, max_length=4096)]

MAX_LORA_RANK = 4096
LoraModules = Annotated[list[Annotated[str, Field(min_length=1, max_length=256)]], Field(max_length=256)]
_REGEX_CHARACTERS = frozenset("*+?[](){}|^$\\")


def _module_names(value: Any) -> Any:
    """verl writes target_modules / exclude_modules as a list of names or a single string. A single
    name (all-linear among them) becomes a list of it; a string that is a regular expression (PEFT
    matches it against the whole dotted name) is refused, as its meaning would change in a list."""
    if value is None:
        return []
    if isinstance(value, str):
        if _REGEX_CHARACTERS & set(value):
            raise ValueError(
                f"{value!r} is a regular expression: rlkube takes a list of module names here (e.g. [q_proj, v_proj])"
            )
        return [value]
    return value


class ModelConfig(ApiModel):
    """The policy model (actor, and reference unless stated otherwise)."""

    # A running job's checkpoints, optimizer state and rollout engines all hold this model.
    cel_rules = (CelRule("self == oldSelf", "model is immutable", transition=True),)

    path: str = Field(
        min_length=1,
        max_length=4096,
        description="Directory of a Hugging Face causal-LM (config, weights, tokenizer) on a mounted "
        "volume. Nothing is downloaded at run time.",
    )
    tokenizer_path: str | None = Field(
        None, max_length=4096, description="Tokenizer directory when it differs from path."
    )
    trust_remote_code: bool = Field(False, description="Allow model code shipped with the checkpoint.")
    enable_gradient_checkpointing: bool = Field(
        False, description="Recompute activations in the backward pass to save memory."
    )
    use_remove_padding: bool = Field(
        False,
        description="Sequence packing for the actor and the reference: a micro-batch's sequences are "
        "concatenated into one row without padding and attend only within themselves (FlexAttention with a "
        "document mask on GPU), so no compute goes to padding. The same numbers as padded batches.",
    )
    use_liger: bool = Field(
        False,
        description="liger-kernel's Triton kernels for RMSNorm, the SwiGLU MLP and rotary embeddings in the actor "
        "and reference models (verl's model.use_liger; the trainer image must hold the liger-kernel package). The "
        "log-probs still come from the trainer's chunked LM head.",
    )
    use_shm: bool = Field(
        False,
        description="Copy the model directory into shared memory (/dev/shm) once per host and load every role "
        "and engine from there (verl's model.use_shm): faster loads from a slow volume, at the cost of host memory "
        "the size of the checkpoint.",
    )
    lora_rank: int = Field(
        0,
        ge=0,
        le=MAX_LORA_RANK,
        description="LoRA (verl's model.lora_rank): above 0, the actor trains low-rank adapters of this rank "
        "on a frozen base; the reference is the base with the adapters disabled (no second copy of the weights), "
        "and the rollout engine gets the merged weights.",
    )
    lora_alpha: int = Field(
        16, ge=1, description="LoRA scaling: the adapter's update is scaled by loraAlpha / loraRank."
    )
    target_modules: LoraModules = Field(
        default_factory=lambda: ["all-linear"],
        description="Modules that get adapters: names matched as the end of a module's dotted name (q_proj, "
        "mlp.down_proj), or all-linear (every linear layer but the LM head). verl also takes a regular "
        "expression as a single string; here list the names.",
    )
    exclude_modules: LoraModules = Field(
        default_factory=list, description="Modules kept without adapters, matched as targetModules."
    )

    _lora_lists = field_validator("target_modules", "exclude_modules", mode="before")(_module_names)


class DataConfig(ApiModel):
    """Training prompts in verl's row format (data_source, prompt, reward_model.ground_truth, extra_info)."""

    train_files: list[FilePath] = Field(
        min_length=1,
        max_length=256,
        description="Parquet, Arrow or JSON-lines files of training rows.",
    )
    val_files: list[FilePath] = Field(
        default_factory=list,
        max_length=256,
        description="Held-out rows scored every trainer.testFreq steps (same format as trainFiles).",
    )
    val_batch_size: int | None = Field(
        None, ge=1, description="Validation prompts per generate call (default: all in one)."
    )
    prompt_key: str = Field("prompt", description="Column holding the chat-message list (or plain text).")
    reward_fn_key: str = Field("data_source", description="Column passed to the reward function as data_source.")
    ground_truth_key: str = Field(
        "reward_model.ground_truth", description="Dotted path of the ground truth inside a row."
    )
    extra_info_key: str = Field("extra_info", description="Column passed to the reward function as extra_info.")
    max_prompt_length: int = Field(512, ge=1, le=1_048_576, description="Longest prompt, in tokens.")
    max_response_length: int = Field(512, ge=1, le=1_048_576, description="Longest response, in tokens.")
    train_batch_size: int = Field(
        256, ge=1, le=MAX_BATCH, description="Prompts per step (each sampled rollout.n times)."
    )
    truncation: Literal["error", "left", "right"] = Field(
        "error",
        description="A prompt longer than maxPromptLength: error stops with the row named; left/right "
        "drop whole tokens from that side.",
    )
    filter_overlong_prompts: bool = Field(
        False, description="Drop prompts longer than maxPromptLength (and report how many) instead."
    )
    apply_chat_template: bool = Field(True, description="Use the tokenizer's chat template when it has one.")
    shuffle: bool = Field(True, description="Shuffle rows each epoch.")
    seed: int = Field(1, description="Seed of the data order.")


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


# verl's rollout_rs options: a divergence estimator (k1/k2/k3) of log(pi_train / pi_rollout) per
# token, or summed / averaged / maximised over a sequence.
ROLLOUT_RS_OPTIONS = (
    "token_k1",
    "token_k2",
    "token_k3",
    "seq_sum_k1",
    "seq_sum_k2",
    "seq_sum_k3",
    "seq_mean_k1",
    "seq_mean_k2",
    "seq_mean_k3",
    "seq_max_k2",
    "seq_max_k3",
)
# A threshold is a positive number, or lower_upper ("0.5_2.0"); several rollout_rs options take one
# each, comma separated. Strings in the RLJob (a CRD field has one type); numbers accepted in YAML.
THRESHOLD_PATTERN = r"^[0-9.eE+-]+(_[0-9.eE+-]+)?(,[0-9.eE+-]+(_[0-9.eE+-]+)?)*$"


def parse_rollout_is_threshold(spec: str) -> tuple[float, float | None]:
    """verl's rollout_is_threshold: "2.0" is TIS's upper bound (weights clamped to it);
    "lower_upper" is IcePop's (weights outside are zeroed). Returns (upper, lower or None)."""
    lower_text, _, upper_text = spec.strip().rpartition("_")
    try:
        upper = float(upper_text)
        lower = float(lower_text) if lower_text else None
    except ValueError:
        raise ValueError(f"rollout_is_threshold {spec!r} is not a number or lower_upper (e.g. 0.5_2.0)") from None
    if upper <= 0 or (lower is not None and lower <= 0):
        raise ValueError(f"rollout_is_threshold {spec!r}: bounds must be positive")
    if lower is not None and lower > upper:
        raise ValueError(f"rollout_is_threshold {spec!r}: lower bound above the upper")
    return upper, lower


def parse_rollout_rs_options(rollout_rs: str) -> list[str]:
    """The comma-separated rollout_rs options, each once, in order; unknown ones refused."""
    options = list(dict.fromkeys(o.strip() for o in rollout_rs.split(",") if o.strip()))
    unknown = [o for o in options if o not in ROLLOUT_RS_OPTIONS]
    if not options or unknown:
        raise ValueError(f"rollout_rs {rollout_rs!r}: options must be among {', '.join(ROLLOUT_RS_OPTIONS)}")
    return options


def parse_rollout_rs_thresholds(options: list[str], spec: str) -> dict[str, tuple[float | None, float]]:
    """verl's rollout_rs_threshold: one entry shared by every option or one per option. A k1 option
    bounds the log-ratio both ways: "lower_upper" ratios, or "upper" meaning 1/upper_upper; the
    others take an upper bound only. Returns option -> (lower ratio or None, upper)."""
    parts = [p.strip() for p in spec.split(",") if p.strip()]
    if len(parts) not in (1, len(options)):
        raise ValueError(
            f"rollout_rs_threshold {spec!r}: give one threshold for all or one per rollout_rs option ({len(options)})"
        )
    parts = parts * len(options) if len(parts) == 1 else parts
    out: dict[str, tuple[float | None, float]] = {}
    for option, part in zip(options, parts, strict=True):
        try:
            if option.endswith("k1"):
                lower_text, _, upper_text = part.rpartition("_")
                upper = float(upper_text)
                lower: float | None = float(lower_text) if lower_text else 1.0 / upper
            elif "_" in part:
                raise ValueError
            else:
                upper, lower = float(part), None
        except (ValueError, ZeroDivisionError):
            kind = "a ratio or lower_upper" if option.endswith("k1") else "one positive upper bound"
            raise ValueError(f"rollout_rs_threshold {part!r} for {option}: expected {kind}") from None
        if upper <= 0 or (lower is not None and (lower <= 0 or lower > upper)):
            raise ValueError(f"rollout_rs_threshold {part!r} for {option}: bounds must be positive, lower <= upper")
        out[option] = (lower, upper)
    return out


def _number_as_text(value: Any) -> Any:
    # verl's YAML writes thresholds as numbers; the RLJob field is a string.
    return str(value) if isinstance(value, int | float) and not isinstance(value, bool) else value


class RolloutCorrectionConfig(ApiModel):
    """verl's algorithm.rollout_correction: importance weights and rejection of tokens or sequences
    whose training-policy probability differs from the engine's that sampled them (engine-vs-trainer
    mismatch, or off-policy samples), from the engine's log-probs of its sampled tokens."""

    cel_rules = (
        CelRule(
            "!has(self.rolloutRs) || has(self.rolloutRsThreshold)",
            "rolloutRsThreshold is required when rolloutRs is set",
            ".rolloutRsThreshold",
        ),
    )

    rollout_is: Literal["token", "sequence"] | None = Field(
        None,
        description="Importance weights pi_old/pi_rollout per token, or per sequence (their product); unset: "
        "none with trainer.v1.trainerMode sync, token (TIS) in the asynchronous modes.",
    )
    rollout_is_threshold: str = Field(
        "2.0",
        max_length=64,
        pattern=THRESHOLD_PATTERN,
        description='A string: "2.0" clamps weights to 2.0 (TIS); "0.5_2.0" zeroes weights outside [0.5, 2.0] '
        "(IcePop).",
    )
    rollout_rs: str | None = Field(
        None,
        max_length=256,
        description="Rejection sampling: comma-separated criteria that must all pass, among "
        + ", ".join(ROLLOUT_RS_OPTIONS)
        + "; rejected tokens (or whole sequences) leave the loss.",
    )
    rollout_rs_threshold: str | None = Field(
        None,
        max_length=256,
        pattern=THRESHOLD_PATTERN,
        description="A string, required with rolloutRs: one bound for all criteria or one per criterion, comma "
        'separated; k1 criteria take ratios "lower_upper" (or "upper", lower = 1/upper), the others an upper bound.',
    )
    bypass_mode: bool = Field(
        False,
        description="Use the engine's log-probs as the old ones (no old log-prob pass): two policies instead of three.",
    )
    loss_type: Literal["ppo_clip", "reinforce"] = Field(
        "ppo_clip",
        description="bypassMode's loss: ppo_clip (the ratio to the engine's policy, clipped; no extra weights) or "
        "reinforce (-A * log pi * weight, unclipped).",
    )
    rollout_is_batch_normalize: bool = Field(False, description="Scale the importance weights to mean 1 per batch.")

    _as_text = field_validator("rollout_is_threshold", "rollout_rs_threshold", mode="before")(_number_as_text)

    @field_validator("rollout_is_threshold")
    @classmethod
    def _valid_is_threshold(cls, value: str) -> str:
        parse_rollout_is_threshold(value)
        return value

    @field_validator("rollout_rs")
    @classmethod
    def _valid_rs(cls, value: str | None) -> str | None:
        if value is not None:
            parse_rollout_rs_options(value)
        return value

    @model_validator(mode="after")
    def _rs_threshold_fits(self) -> RolloutCorrectionConfig:
        if self.rollout_rs is not None:
            if self.rollout_rs_threshold is None:
                raise ValueError("rollout_rs_threshold is required when rollout_rs is set")
            parse_rollout_rs_thresholds(parse_rollout_rs_options(self.rollout_rs), self.rollout_rs_threshold)
        return self

    @property
    def enabled(self) -> bool:
        """Whether anything here changes training (and so the engine's log-probs are needed)."""
        return self.rollout_is is not None or self.rollout_rs is not None or self.bypass_mode


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
        description="Advantage estimator (verl's names): gae (PPO with critic), grpo, rloo, reinforce_plus_plus, "
        "reinforce_plus_plus_baseline, remax (a greedy response per prompt is generated and scored as its "
        "baseline), opo, grpo_passk, gpg, gdpo (gdpoRewardKeys), optimal_token_baseline and "
        "tir_optimal_token_baseline (the actor's old log-prob pass also computes its sum of pi^2), "
        "grpo_vectorized (grpo), rloo_vectorized (rloo, a lone sample 0).",
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


class OptimConfig(ApiModel):
    """AdamW with linear warmup, then constant or cosine decay."""

    lr: float = Field(1e-6, gt=0, description="Peak learning rate.")
    lr_warmup_steps: int = Field(0, ge=0, description="Linear warmup steps (optimizer steps).")
    lr_warmup_steps_ratio: float = Field(
        0.0, ge=0, le=1, description="Warmup as a fraction of all steps, when lrWarmupSteps is 0."
    )
    warmup_style: Literal["constant", "cosine"] = Field("constant", description="Schedule after warmup.")
    min_lr_ratio: float = Field(0.0, ge=0, le=1, description="Cosine: floor as a fraction of lr.")
    weight_decay: float = Field(0.01, ge=0, description="AdamW weight decay.")
    betas: list[float] = Field(
        default_factory=lambda: [0.9, 0.999], min_length=2, max_length=2, description="AdamW betas."
    )


# How a role's ranks share a model: FSDP2 shards parameters, gradients and optimizer state
# (`fully_shard` per decoder layer; HSDP with roles.<role>.fsdpSize); replicate keeps a full
# copy per rank and all-reduces gradients. auto = fsdp2 on GPU (one rank too: its mixed
# precision is how the weights compute in bf16), replicate on CPU.
Strategy = Literal["auto", "fsdp2", "replicate"]
FSDPDtype = Literal["bf16", "fp32"]


class MixedPrecisionConfig(ApiModel):
    """FSDP2 mixed precision (verl's fsdp_config.mixed_precision); applies where the role is
    sharded with FSDP2 (strategy fsdp2, or auto on GPU)."""

    param_dtype: FSDPDtype = Field(
        "bf16",
        description="Dtype the forward and backward compute in; the master weights and the optimizer state stay fp32.",
    )
    reduce_dtype: FSDPDtype = Field("fp32", description="Dtype gradients are reduced in across ranks.")


class FSDPConfig(ApiModel):
    """How a role is sharded (verl's fsdp_config); applies where the role is sharded with FSDP2
    (strategy fsdp2, or auto on GPU)."""

    mixed_precision: MixedPrecisionConfig = Field(
        default_factory=MixedPrecisionConfig, description="Compute and gradient-reduction dtypes."
    )
    model_dtype: FSDPDtype = Field(
        "fp32",
        description="Dtype of the sharded parameters the optimizer steps (the master weights), and so of "
        "their gradients and the optimizer state: bf16 halves all three (what TRL trains with by default), "
        "at the precision of bf16 updates.",
    )
    param_offload: bool = Field(
        False,
        description="Keep the sharded parameters, their gradients and the optimizer state in host memory; "
        "each layer's weights reach the GPU only for its forward and backward, and the optimizer steps on "
        "the CPU. The most GPU memory saved, at the optimizer's speed on the CPU.",
    )
    optimizer_offload: bool = Field(
        False,
        description="Keep the optimizer state (AdamW's moments) in host memory between updates: it moves to "
        "the GPU just before the update's first optimizer step and back to the host after the update, so it "
        "is off the GPU while the rollout engine generates and syncs. Actor and critic (the reference has "
        "no optimizer); with paramOffload the state is in host memory anyway.",
    )
    reshard_after_forward: bool = Field(
        True,
        description="Free each layer's gathered weights after its forward and gather them again for the "
        "backward. false keeps them from the forward to the backward: fewer gathers (on one GPU, fewer "
        "casts to the compute dtype) for the memory of a full compute-dtype copy of the model.",
    )


# The decoder-layer compile (issue 34): not verl's use_torch_compile, which in verl 0.9.1's FSDP
# engine compiles only its entropy-from-logits helper (rlkube's log-probs and entropy come from
# its chunked LM head, uncompiled either way).
COMPILE_DECODER_LAYERS = (
    "torch.compile each decoder layer's forward ({role}); FSDP2's hooks around the layers stay "
    "eager. The first micro-batches pay the compile (tens of seconds on GPU), later ones run the "
    "fused kernels: on an H100 the actor update went from 22.8 % to 31.7 % of the bf16 matmul rate "
    "(bench/gpu/liger_bench.py). Not verl's useTorchCompile, which compiles only verl's "
    "entropy-from-logits helper."
)
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


class CriticConfig(ApiModel):
    """The value model for gae: a causal-LM backbone with a scalar head."""

    model_path: str | None = Field(None, max_length=4096, description="Backbone (defaults to model.path).")
    optim: OptimConfig = Field(default_factory=lambda: OptimConfig(lr=1e-5), description="Optimizer of the critic.")
    ppo_mini_batch_size: int | None = Field(None, ge=1, le=MAX_BATCH, description="Defaults to the actor's.")
    ppo_micro_batch_size_per_gpu: int = Field(
        8, ge=1, le=MAX_BATCH, description="Samples per forward/backward on each rank (as the actor's)."
    )
    ppo_epochs: int | None = Field(None, ge=1, description="Defaults to the actor's.")
    use_remove_padding: bool | None = Field(
        None, description="Sequence packing for the critic (as model.useRemovePadding, its default)."
    )
    use_dynamic_bsz: bool = Field(
        False, description="Micro-batches by token count (as actor.useDynamicBsz) for the critic."
    )
    ppo_max_token_len_per_gpu: TokenBudget = Field(
        32768, description="useDynamicBsz: tokens per update micro-batch on each rank."
    )
    forward_max_token_len_per_gpu: TokenBudget | None = Field(
        None, description="useDynamicBsz: tokens per micro-batch of the value pass; default ppoMaxTokenLenPerGpu."
    )
    cliprange_value: float = Field(0.5, gt=0, description="Value clipping range.")
    loss_agg_mode: LossAggMode = Field("token-mean", description="How token losses aggregate.")
    loss_scale_factor: int | None = Field(
        None,
        gt=0,
        description="seq-mean-token-sum-norm: the constant the sequence mean is divided by "
        "(default the batch's response length).",
    )
    grad_clip: float = Field(1.0, gt=0, description="Gradient-norm clipping.")
    strategy: Strategy = Field(
        "auto", description="Data parallelism across the critic's ranks: fsdp2, replicate, or auto (fsdp2 on GPU)."
    )
    fsdp_config: FSDPConfig = Field(default_factory=FSDPConfig, description="FSDP2 settings of the critic.")
    compile_decoder_layers: bool = Field(
        False, description=COMPILE_DECODER_LAYERS.format(role="the critic's update and its value pass")
    )
    lora_rank: int = Field(
        0,
        ge=0,
        le=MAX_LORA_RANK,
        description="LoRA for the critic (verl's critic.model.lora_rank): above 0, adapters of this rank on a "
        "frozen backbone; the value head trains in full.",
    )
    lora_alpha: int = Field(16, ge=1, description="The critic's LoRA scaling (as model.loraAlpha).")
    target_modules: LoraModules = Field(
        default_factory=lambda: ["all-linear"], description="The critic's adapted modules (as model.targetModules)."
    )
    exclude_modules: LoraModules = Field(
        default_factory=list, description="The critic's modules kept without adapters (as model.excludeModules)."
    )

    _lora_lists = field_validator("target_modules", "exclude_modules", mode="before")(_module_names)


class ReferenceConfig(ApiModel):
    """The frozen reference policy (verl's ref section)."""

    cel_rules = (
        CelRule(
            "!has(self.fsdpConfig) || !has(self.fsdpConfig.optimizerOffload) || !self.fsdpConfig.optimizerOffload",
            "the reference has no optimizer: optimizerOffload applies to actor and critic",
            ".fsdpConfig.optimizerOffload",
        ),
    )

    log_prob_max_token_len_per_gpu: TokenBudget | None = Field(
        None,
        description="actor.useDynamicBsz: tokens per micro-batch of the reference's log-prob pass; default "
        "the actor's logProbMaxTokenLenPerGpu.",
    )

    fsdp_config: FSDPConfig = Field(
        default_factory=FSDPConfig,
        description="FSDP2 settings of the reference; it computes in bf16 on GPU whatever mixedPrecision "
        "says (it has no master weights), so paramOffload is what applies.",
    )
    compile_decoder_layers: bool | None = Field(
        None,
        description=COMPILE_DECODER_LAYERS.format(role="the reference's log-prob pass")
        + " Unset: as actor.compileDecoderLayers. With model.loraRank the reference is the actor's model, "
        "compiled as the actor's is: another value is refused.",
    )


class ValidationSampling(ApiModel):
    """How validation samples (verl's rollout.val_kwargs); greedy by default."""

    n: int = Field(
        1, ge=1, le=1024, alias="samplesPerPrompt", description="Samples per validation prompt (best/worst/maj@N)."
    )
    temperature: float = Field(0.0, ge=0, description="Sampling temperature (0 = greedy).")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling.")
    top_k: int = Field(-1, ge=-1, description="Top-k sampling (-1 = off).")
    do_sample: bool = Field(False, description="Sample; false decodes greedily whatever the temperature.")


class SandboxConfig(ApiModel):
    """Limits of the built-in code interpreter's sandbox (one process per call, no network, only its
    scratch directory). Unset fields keep the sandbox's defaults; a tool config's own `config` keys
    of the same names (cpu_seconds, ...) override them for that tool."""

    cpu_seconds: int | None = Field(
        None, ge=1, le=3600, description="CPU time of one run, in seconds (RLIMIT_CPU; default 5)."
    )
    wall_seconds: float | None = Field(
        None, gt=0, le=3600, description="Timeout of one run, in seconds: the process group is killed (default 10)."
    )
    memory_bytes: int | None = Field(
        None,
        ge=16 * 1024 * 1024,
        le=64 * 1024**3,
        description="Address space of one run, in bytes (RLIMIT_AS; default 512 MiB).",
    )
    max_processes: int | None = Field(
        None, ge=1, le=4096, description="Processes and threads one run may have (RLIMIT_NPROC; default 32)."
    )
    max_output_bytes: int | None = Field(
        None, ge=1, le=64 * 1024 * 1024, description="Bytes of stdout (and of stderr) kept (default 16 KiB)."
    )
    max_file_bytes: int | None = Field(
        None,
        ge=0,
        le=64 * 1024**3,
        description="Largest file one run may write in its scratch directory, in bytes (RLIMIT_FSIZE; default 16 MiB).",
    )


class AgentFilesConfigMap(ApiModel):
    """A ConfigMap in the job's namespace whose keys the operator mounts as files in one folder."""

    name: Annotated[str, LONG_NAME] = Field(min_length=1, max_length=253, description="ConfigMap name.")


# The paths that may name a key of multiTurn.configMap instead of a file in the image.
_AGENT_FILE_FIELDS = ("toolConfigPath", "functionToolPath", "interactionConfigPath")


def _key_rule(field: str) -> CelRule:
    return CelRule(
        f"!has(self.configMap) || !has(self.{field}) || "
        f"(self.{field}.matches('^[-._a-zA-Z0-9]+$') && self.{field} != '.' && !self.{field}.startsWith('..'))",
        f"with multiTurn.configMap, {field} is a key of that ConfigMap (a file name such as tools.py), not a path",
        f".{field}",
    )


class MultiTurnConfig(ApiModel):
    """Multi-turn rollout with tool calls (verl 0.9.1's rollout.multi_turn): the model's tool calls
    are parsed from its output, run, and their results appended as tool turns until it answers
    without a call or a limit is hit; an interaction (a user-simulating environment) may answer
    each turn the model ends without a call. Only the model's own tokens are trained."""

    cel_rules = (
        CelRule(
            "!self.enable || has(self.toolConfigPath) || has(self.functionToolPath) || has(self.interactionConfigPath)",
            "multiTurn.enable needs tools or an interaction: set toolConfigPath, functionToolPath or "
            "interactionConfigPath",
            ".enable",
        ),
        CelRule(
            "self.enable || !(has(self.toolConfigPath) || has(self.functionToolPath) || "
            "has(self.interactionConfigPath) || has(self.configMap) || has(self.sandbox))",
            "toolConfigPath, functionToolPath, interactionConfigPath, configMap and sandbox are only read when "
            "multiTurn.enable is true",
            ".enable",
        ),
        *(_key_rule(f) for f in _AGENT_FILE_FIELDS),
    )

    enable: bool = Field(False, description="Run multi-turn episodes with tool calls instead of one response.")
    max_assistant_turns: int | None = Field(
        None, ge=1, le=1024, description="Most model turns per episode (unlimited when unset)."
    )
    max_user_turns: int | None = Field(
        None,
        ge=1,
        le=1024,
        description="Most tool and interaction (user-side) turns per episode (unlimited when unset).",
    )
    max_parallel_calls: int = Field(
        1, ge=1, le=1024, description="Most tool calls of one model turn that run (at once); the rest are dropped."
    )
    max_tool_response_length: int = Field(
        256, ge=1, description="Characters of a tool's response kept in the conversation (truncated beyond)."
    )
    tool_response_truncate_side: Literal["left", "right", "middle"] = Field(
        "middle", description="Which part of a long tool response is cut: left, right or middle."
    )
    format: Literal["hermes"] = Field(
        "hermes", description="Tool-call syntax the model writes: hermes (<tool_call>{json}</tool_call>)."
    )
    tool_config_path: FilePath | None = Field(
        None,
        description="verl's tool config YAML (tools: class_name, config, tool_schema): a file in the image, or "
        "with configMap a key of it. A class_name's module may be a .py file beside it.",
    )
    function_tool_path: FilePath | None = Field(
        None,
        description="Python file whose @function_tool functions are tools (schema from their signatures): a "
        "file in the image, or with configMap a key of it.",
    )
    tokenization_sanity_check_mode: Literal["strict"] = Field(
        "strict",
        description="strict: a chat template that renders earlier turns differently once tool turns follow "
        "ends the run with an error (rlkube extends the tokens turn by turn, never re-renders).",
    )
    interaction_config_path: FilePath | None = Field(
        None,
        description="Interaction config YAML (interaction: name, class_name, config), as verl 0.5-0.8's: "
        "user-simulating environments that answer each model turn without a tool call, end the episode "
        "and give turn rewards; a row picks one by extra_info.interaction_kwargs.name. A file in the image, "
        "or with configMap a key of it.",
    )
    config_map: AgentFilesConfigMap | None = Field(
        None,
        description="In an RLJob: a ConfigMap holding the tool and interaction files, mounted into every pod; "
        "toolConfigPath, functionToolPath and interactionConfigPath then name its keys.",
    )
    sandbox: SandboxConfig | None = Field(
        None,
        description="Limits of the code interpreter tool's sandbox; refused at the start of a run whose "
        "tools have no code interpreter.",
    )


class RolloutConfig(ApiModel):
    """Sampling and engine settings (where rollout runs is roles.rollout)."""

    name: Literal["vllm", "hf"] = Field("vllm", description="Engine: vllm, or hf generate as a fallback.")
    # verl's key is `n`; on the wire it is spelled out because Kubernetes' YAML
    # parser reads a bare `n:` key as the boolean false.
    n: int = Field(
        1, ge=1, le=1024, alias="samplesPerPrompt", description="Samples per prompt (grpo and rloo need 2 or more)."
    )
    temperature: float = Field(1.0, ge=0, description="Sampling temperature (0 = greedy).")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling.")
    top_k: int = Field(-1, ge=-1, description="Top-k sampling (-1 = off).")
    ignore_eos: bool = Field(False, description="Generate maxResponseLength tokens regardless of EOS.")
    gpu_memory_utilization: float = Field(
        0.5, gt=0, le=1, description="Fraction of GPU memory (host RAM on CPU) vLLM may take."
    )
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field("auto", description="Engine dtype.")
    enforce_eager: bool = Field(False, description="Disable CUDA graphs / compilation.")
    free_cache_engine: bool = Field(True, description="Colocated: release the engine's memory while the actor trains.")
    calculate_log_probs: bool = Field(
        False,
        description="Also return the engine's log-probs of sampled tokens and report how far they are from "
        "the actor's (training/rollout_probs_diff_*); costs rollout speed.",
    )
    update_weights_bucket_megabytes: int = Field(
        512,
        ge=1,
        description="Weight sync, in MiB of full tensors: colocated, each bucket is one gather from the "
        "FSDP shards and reaches the engine before the next (its extra GPU memory: about twice this, or "
        "twice the largest tensor); separate, each is one broadcast. verl's default is 2048.",
    )
    enable_prefix_caching: bool = Field(
        True,
        description="vLLM's prefix caching: the samples of a prompt share its prefill. Off saves the "
        "engine's per-step block hashing.",
    )
    max_num_seqs: int | None = Field(
        None, ge=1, description="Most sequences the engine schedules in one step (vLLM's default when unset)."
    )
    max_num_batched_tokens: int | None = Field(
        None, ge=1, description="Most tokens the engine schedules in one step (vLLM's default when unset)."
    )
    layered_summon: bool = Field(
        False,
        description="Weight sync gathers the policy for the engine at most one decoder layer at a time (each "
        "bucket capped at one layer's full tensors, whatever updateWeightsBucketMegabytes says): the least extra "
        "GPU memory, the most collectives (verl's rollout.layered_summon).",
    )
    val_kwargs: ValidationSampling = Field(
        default_factory=ValidationSampling, description="Sampling during validation."
    )
    multi_turn: MultiTurnConfig = Field(
        default_factory=MultiTurnConfig,
        description="Multi-turn episodes with tool calls, in training and validation alike.",
    )


class ConfigMapKeyRef(ApiModel):
    """A key of a ConfigMap in the job's namespace."""

    # The key is also the file name the operator mounts it as.
    cel_rules = (
        CelRule("self.key != '.' && !self.key.startsWith('..')", "key may not be '.' or start with '..'", ".key"),
    )

    name: Annotated[str, LONG_NAME] = Field(min_length=1, max_length=253, description="ConfigMap name.")
    key: str = Field(min_length=1, max_length=253, pattern=CONFIG_MAP_KEY_PATTERN, description="Key holding the file.")


class RewardFunctionConfig(ApiModel):
    """A Python function `compute_score(data_source, solution_str, ground_truth, extra_info=None)`."""

    cel_rules = (
        CelRule(
            "has(self.path) != has(self.configMap)",
            "exactly one of path and configMap must be set",
        ),
    )

    path: str | None = Field(None, min_length=1, max_length=4096, description="Python file defining the function.")
    config_map: ConfigMapKeyRef | None = Field(
        None, description="In an RLJob: a ConfigMap key holding the file; the operator mounts it."
    )
    name: str = Field("compute_score", min_length=1, description="Function name in that file.")


class RewardModelConfig(ApiModel):
    """A sequence-classification model scoring prompt + response."""

    path: str = Field(min_length=1, max_length=4096, description="Hugging Face model directory.")
    use_remove_padding: bool = Field(
        False,
        description="Sequence packing: the rows of a forward pass are concatenated without padding and "
        "attend only within themselves; each score is read at its row's last token.",
    )
    use_dynamic_bsz: bool = Field(
        False, description="Forward passes by token count (forwardMaxTokenLenPerGpu) instead of 8 rows each."
    )
    forward_max_token_len_per_gpu: TokenBudget = Field(
        32768, description="useDynamicBsz: tokens (the reward model's own tokenization) per forward pass."
    )


class OverlongBufferConfig(ApiModel):
    """DAPO's soft overlong punishment: a response longer than maxResponseLength - len loses
    up to penaltyFactor, linearly over the last len tokens."""

    enable: bool = Field(False, description="Add the overlong penalty to every score.")
    len: int = Field(1, ge=1, description="Buffer length in tokens, at the end of maxResponseLength.")
    penalty_factor: float = Field(1.0, ge=0, description="Penalty of a response that fills maxResponseLength.")
    log: bool = Field(False, description="Report reward_extra/overlong_reward and reward_extra/overlong.")


class RewardConfig(ApiModel):
    """Where scores come from: a function, a reward model, or (neither set) the built-in
    scorer of each row's data_source (gsm8k, MATH-style boxed answers)."""

    cel_rules = (
        CelRule(
            "!(has(self.function) && has(self.model))",
            "at most one of reward.function and reward.model may be set (neither: built-in scorers by data_source)",
        ),
    )

    function: RewardFunctionConfig | None = Field(
        None, description="A reward function from a file; overrides the built-in scorers."
    )
    model: RewardModelConfig | None = Field(None, description="A reward model.")
    overlong_buffer: OverlongBufferConfig = Field(
        default_factory=OverlongBufferConfig, description="DAPO overlong reward shaping."
    )


def _console_only() -> list[Logger]:
    return ["console"]


class ColocateAsyncConfig(ApiModel):
    """trainer.v1.colocate_async (verl 0.9.1)."""

    # verl allows fractional warmups (1.5 batches); the one-step-off schedule generates exactly one
    # batch ahead, so only 1 is accepted (the bounds refuse others by this field's name).
    num_warmup_batches: float = Field(
        1.0, ge=1, le=1, description="Batches generated before the first update; only 1 is supported."
    )


class SeparateAsyncConfig(ApiModel):
    """trainer.v1.separate_async (verl 0.9.1)."""

    num_warmup_batches: float = Field(
        1.0, ge=1, le=1, description="Batches generated before the first update; only 1 is supported."
    )
    parameter_sync_step: int = Field(
        4,
        ge=1,
        description="Updates between weight pushes into the rollout engines (rlkube: a push every N "
        "full-batch updates, or earlier when the staleness bound needs it; verl splits one global step "
        "into N local updates).",
    )


class SamplerConfig(ApiModel):
    """trainer.v1.sampler: the staleness bound of asynchronous modes (verl 0.9.1; no effect in sync)."""

    max_off_policy_threshold: int | None = Field(
        8,
        ge=1,
        description="Most weight versions a trained sample may lag the actor by (span = version trained "
        "at - version generated with + 1); null: no bound.",
    )
    max_off_policy_strategy: Literal["drop", "wait"] = Field(
        "drop",
        description="drop: discard samples past the bound (training/off_policy/evicted_samples); wait: "
        "delay generation so none exceeds it.",
    )


class AsyncTrainingConfig(ApiModel):
    """async_training (verl 0.9.1's fully-async recipe): of its keys rlkube reads partial_rollout;
    the others are refused by name by `rlkube-trainer convert`."""

    partial_rollout: bool = Field(
        False,
        description="Partial rollouts: a weight push interrupts the generation in flight at a step boundary; "
        "unfinished samples resume from their tokens with the new weights, each token recording its weight "
        "version. Needs an asynchronous trainer.v1.trainerMode, rollout.name vllm, no rollout.multiTurn and, "
        "with the rollout colocated, roles.rollout.tensorParallelSize 1. verl: on in its v1 async modes, "
        "default true in its fully-async recipe; rlkube: off by default.",
    )


class TrainerV1Config(ApiModel):
    """verl 0.9.1's trainer.v1: synchronous or one-step-off asynchronous training."""

    trainer_mode: Literal["sync", "colocate_async", "separate_async"] = Field(
        "sync",
        description="sync: generate then update; colocate_async: the next batch generates in the actor's "
        "engine while the actor updates; separate_async: the same with separate rollout pods.",
    )
    colocate_async: ColocateAsyncConfig = Field(default_factory=ColocateAsyncConfig, description="colocate_async.")
    separate_async: SeparateAsyncConfig = Field(default_factory=SeparateAsyncConfig, description="separate_async.")
    sampler: SamplerConfig = Field(default_factory=SamplerConfig, description="Staleness bound (async modes).")


class TrainerSection(ApiModel):
    """Loop length, logging and devices."""

    # 0 would be a modulo by zero in the loop; "never" is spelled -1.
    cel_rules = (
        CelRule("self.saveFreq != 0", "saveFreq must be positive, or -1 (only at the end)", ".saveFreq"),
        CelRule("self.testFreq != 0", "testFreq must be positive, or -1 (never)", ".testFreq"),
    )

    total_training_steps: int | None = Field(None, ge=1, description="Steps to run (default: from totalEpochs).")
    total_epochs: int = Field(1, ge=1, description="Epochs over the training data.")
    save_freq: int = Field(-1, ge=-1, description="Checkpoint every N steps (-1: only at the end).")
    test_freq: int = Field(
        -1, ge=-1, description="Validate on data.valFiles every N steps and after the last (-1: never)."
    )
    val_before_train: bool = Field(True, description="Validate before the first step (when valFiles are set).")
    val_only: bool = Field(False, description="Only validate (the initial or resumed model), then stop.")
    log_val_generations: int = Field(
        0,
        ge=0,
        description="Write this many prompt/response/score rows per validation to validation_generations.jsonl.",
    )
    seed: int = Field(42, description="Seed of model init, sampling and dropout.")
    logger: list[Logger] = Field(
        default_factory=_console_only,
        max_length=4,
        description="Where metrics go: console, tensorboard, mlflow ($MLFLOW_TRACKING_URI, else a file store "
        "in the checkpoint directory), wandb (offline unless $WANDB_API_KEY is set).",
    )
    project_name: str = Field("rlkube", description="Groups runs in the loggers.")
    experiment_name: str = Field("default", description="Names this run in the loggers.")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto picks cuda when present.")
    nccl_timeout: int = Field(
        300,
        ge=10,
        le=86400,
        description="Seconds a collective (NCCL on GPU, gloo on CPU) waits for its peers before it fails, in the "
        "role groups and the weight-sync group (verl's actor_rollout_ref.nccl_timeout). A dead peer then ends "
        "the run, and the gang restarts, this soon.",
    )
    v1: TrainerV1Config = Field(
        default_factory=TrainerV1Config, description="Trainer mode (sync or asynchronous) and staleness bound."
    )


# Object stores a checkpoint.uri may name, by their fsspec protocol: S3, Google Cloud Storage and
# Azure Blob Storage, all three through obstore's fsspec filesystem (in the trainer images).
OBJECT_STORE_SCHEMES = ("s3", "gs", "gcs", "az", "abfs", "abfss")
OBJECT_STORE_URL = "^(" + "|".join(OBJECT_STORE_SCHEMES) + ")://[a-z0-9][-a-z0-9._]*[a-z0-9](/.*)?$"


def _checkpoint_path(field: str) -> str:
    """CEL: the field is an absolute path or an object-store URL."""
    return f"(self.{field}.startsWith('/') || self.{field}.matches('{OBJECT_STORE_URL}'))"


class CheckpointConfig(ApiModel):
    """Checkpoints: complete ones only, the latest marker written last."""

    cel_rules: ClassVar[tuple[CelRule, ...]] = (
        CelRule(
            f"self.resume == 'auto' || self.resume == 'disable' || {_checkpoint_path('resume')}",
            "resume must be auto, disable, an absolute checkpoint path or an object-store URL (s3://...)",
            ".resume",
        ),
        CelRule(
            f"!has(self.resumeFrom) || (self.resume == 'auto' && {_checkpoint_path('resumeFrom')})",
            "resumeFrom must be an absolute path or an object-store URL (s3://...), and needs resume: auto "
            "(it seeds a run whose dir has no checkpoint yet; an explicit resume path or disable would never "
            "read it)",
            ".resumeFrom",
        ),
        CelRule(
            "!has(self.endpointUrl) || (has(self.uri) && self.uri.startsWith('s3://'))",
            "endpointUrl needs an s3:// uri (it is the address of the S3-compatible server uri names)",
            ".endpointUrl",
        ),
    )

    dir: str = Field(
        "checkpoints",
        min_length=1,
        max_length=4096,
        description="Checkpoint folder (the mounted volume in pods). With uri set: only the local working "
        "folder (metrics.jsonl's working copy, TensorBoard, curves); checkpoints go to uri.",
    )
    uri: str | None = Field(
        None,
        max_length=4096,
        pattern=OBJECT_STORE_URL,
        description="Object store for checkpoints, the HF export and a copy of metrics.jsonl, through fsspec: "
        "s3://bucket/prefix, gs://bucket/prefix or az://container/prefix. Ranks write their parts "
        "directly, the manifest and COMPLETE marker last; the latest complete checkpoint is found there on "
        "resume. Credentials: the backend's environment variables (credentialsSecret in a cluster).",
    )
    endpoint_url: str | None = Field(
        None,
        max_length=2048,
        pattern=r"^https?://[^ /]+(/[^ ]*)?$",
        description="An S3-compatible server's address (http(s)://host:port) for an s3:// uri; default AWS S3.",
    )
    resume: str = Field(
        "auto",
        max_length=4096,
        description="auto (latest complete checkpoint), disable, or a checkpoint's path or URL.",
    )
    resume_from: str | None = Field(
        None,
        min_length=1,
        max_length=4096,
        description="Seed a new run from another run's checkpoint (verl's resume_from_path): a complete "
        "step_* dir or a checkpoint root (its latest), read while dir holds no complete checkpoint of its "
        "own; later restarts resume from this run's own checkpoints. Any number of actor/critic ranks, "
        "and another strategy or fsdpSize, may resume it. Needs resume: auto.",
    )
    max_to_keep: int = Field(3, ge=1, description="Complete checkpoints kept; older ones are deleted.")
    max_actor_ckpt_to_keep: int | None = Field(
        None,
        ge=1,
        description="verl's name: checkpoints kept for the actor (default maxToKeep). A checkpoint holds "
        "every role and is resumed whole, so the job keeps the larger of this and maxCriticCkptToKeep; "
        "the newest complete checkpoint is never deleted.",
    )
    max_critic_ckpt_to_keep: int | None = Field(
        None,
        ge=1,
        description="verl's name: checkpoints kept for the critic (default maxToKeep); see maxActorCkptToKeep.",
    )
    adopt: bool = Field(
        False,
        description="In a cluster: continue the run another RLJob left in dir (the same name created "
        "again, or another job): resume auto picks up its checkpoints and metrics.jsonl. Off: the driver "
        "refuses a dir holding another job's run, naming that job (the dir's rljob.json).",
    )
    async_save: bool = Field(
        False,
        description="verl's actor.checkpoint.async_save: a save blocks the step only while every rank "
        "copies its state into host memory; the files are written in the background while training goes "
        "on, and the checkpoint becomes the one a resume takes (COMPLETE, latest) only once every rank's "
        "files are written. At most one save is in flight: the next waits for it. Off (the default): the "
        "step waits for the whole write, so a checkpoint is complete before the next step starts; on, a "
        "crash during a background write resumes from the checkpoint before it. Needs host memory for one "
        "more copy of each rank's trainable state.",
    )
    export_hf: Literal["never", "final", "every_save"] = Field(
        "final",
        description="Export the actor as a Hugging Face model: final (into dir/hf at the end), every_save "
        "(also into each checkpoint's hf/), or never. true/false in the trainer YAML mean final/never.",
    )

    @field_validator("export_hf", mode="before")
    @classmethod
    def _export_hf_from_bool(cls, value: Any) -> Any:
        # The trainer YAML used to take a boolean here.
        if isinstance(value, bool):
            return "final" if value else "never"
        return value


# --- batch arithmetic across ranks, as verl normalises it ---------------------------------------
# A step has trainBatchSize × samplesPerPrompt samples; a mini-batch (one optimizer step) has
# ppoMiniBatchSize × samplesPerPrompt. Each of a role's data-parallel ranks (one per process: one
# per GPU, or one per pod without GPUs, whatever fsdpSize is) takes an equal share of every
# mini-batch and runs it in micro-batches of ppoMicroBatchSizePerGpu. A share that does not
# divide leaves ranks doing different numbers of collectives, and they hang until a timeout.
_N = "self.rollout.samplesPerPrompt"


def _world(role: str) -> str:
    return (
        f"(self.roles.{role}.replicas * (has(self.roles.{role}.gpusPerReplica) && "
        f"self.roles.{role}.gpusPerReplica > 0 ? self.roles.{role}.gpusPerReplica : 1))"
    )


_ACTOR_WORLD = _world("actor")
_ACTOR_MINI = f"(self.actor.ppoMiniBatchSize * {_N})"
# A critic colocated with the actor runs on the actor's ranks.
_CRITIC_WORLD = f"(has(self.roles.critic.colocateWith) ? {_ACTOR_WORLD} : {_world('critic')})"
_CRITIC_PROMPTS = "(has(self.critic.ppoMiniBatchSize) ? self.critic.ppoMiniBatchSize : self.actor.ppoMiniBatchSize)"
_CRITIC_MINI = f"({_CRITIC_PROMPTS} * {_N})"
_RANKS = "data-parallel ranks (replicas × gpusPerReplica, or replicas without GPUs)"

BATCH_SPLIT_RULES = (
    CelRule(
        f"{_ACTOR_MINI} % {_ACTOR_WORLD} == 0",
        f"the actor's mini-batch (ppoMiniBatchSize × rollout.samplesPerPrompt samples) must split evenly "
        f"over roles.actor's {_RANKS}",
        ".actor.ppoMiniBatchSize",
    ),
    CelRule(
        f"{_ACTOR_MINI} % {_ACTOR_WORLD} != 0 || ({_ACTOR_MINI} / {_ACTOR_WORLD}) % self.actor.ppoMicroBatchSizePerGpu == 0",
        "each actor rank's share of a mini-batch (ppoMiniBatchSize × rollout.samplesPerPrompt / data-parallel "
        "ranks) must be a multiple of ppoMicroBatchSizePerGpu",
        ".actor.ppoMicroBatchSizePerGpu",
    ),
    CelRule(
        f"!has(self.roles.critic) || self.data.trainBatchSize % {_CRITIC_PROMPTS} == 0",
        "critic.ppoMiniBatchSize (default: the actor's) must divide data.trainBatchSize",
        ".critic.ppoMiniBatchSize",
    ),
    CelRule(
        f"!has(self.roles.critic) || {_CRITIC_MINI} % {_CRITIC_WORLD} == 0",
        "the critic's mini-batch (critic.ppoMiniBatchSize, default the actor's, × rollout.samplesPerPrompt "
        f"samples) must split evenly over roles.critic's {_RANKS}; the actor's when colocated",
        ".critic.ppoMiniBatchSize",
    ),
    CelRule(
        f"!has(self.roles.critic) || {_CRITIC_MINI} % {_CRITIC_WORLD} != 0"
        f" || ({_CRITIC_MINI} / {_CRITIC_WORLD}) % self.critic.ppoMicroBatchSizePerGpu == 0",
        "each critic rank's share of a mini-batch must be a multiple of critic.ppoMicroBatchSizePerGpu",
        ".critic.ppoMicroBatchSizePerGpu",
    ),
)

# A dynamic micro-batch holds at least one sequence: every budget must fit the longest.
_LONGEST = "(self.data.maxPromptLength + self.data.maxResponseLength)"
_LONGEST_TEXT = "the longest sequence (data.maxPromptLength + data.maxResponseLength)"


def _budget_rule(use: str, budget: str, optional: bool = False) -> CelRule:
    present = f"!has({budget}) || " if optional else ""
    field = budget.removeprefix("self")
    return CelRule(
        f"!{use} || {present}{budget} >= {_LONGEST}",
        f"{field.lstrip('.')} must hold {_LONGEST_TEXT} when {use.removeprefix('self.')} is set",
        field,
    )


TOKEN_BUDGET_RULES = (
    _budget_rule("self.actor.useDynamicBsz", "self.actor.ppoMaxTokenLenPerGpu"),
    _budget_rule("self.actor.useDynamicBsz", "self.actor.logProbMaxTokenLenPerGpu", optional=True),
    _budget_rule("self.actor.useDynamicBsz", "self.ref.logProbMaxTokenLenPerGpu", optional=True),
    _budget_rule("self.critic.useDynamicBsz", "self.critic.ppoMaxTokenLenPerGpu"),
    _budget_rule("self.critic.useDynamicBsz", "self.critic.forwardMaxTokenLenPerGpu", optional=True),
)

# A role with pods of its own that the algorithm never calls would hold its nodes (GPUs) idle
# for the whole run.
ROLE_USE_RULES = (
    CelRule(
        "!has(self.roles.critic) || has(self.roles.critic.colocateWith) || self.algorithm.advEstimator == 'gae'",
        "roles.critic has pods of its own, but only algorithm.advEstimator gae uses a critic: they would sit idle",
        ".roles.critic",
    ),
    CelRule(
        "!has(self.roles.reference) || has(self.roles.reference.colocateWith)"
        " || self.actor.useKlLoss || self.algorithm.useKlInReward",
        "roles.reference has pods of its own, but only actor.useKlLoss or algorithm.useKlInReward use a "
        "reference policy: they would sit idle",
        ".roles.reference",
    ),
    CelRule(
        "!has(self.roles.reward) || has(self.roles.reward.colocateWith) || has(self.reward.model)",
        "roles.reward has pods of its own, but only reward.model runs there: they would sit idle",
        ".roles.reward",
    ),
)


_MODE = "self.trainer.v1.trainerMode"
# What the one-step-off schedule cannot honour yet is refused by name, never ignored.
ASYNC_RULES: tuple[CelRule, ...] = (
    CelRule(
        f"{_MODE} != 'separate_async' || self.roles.rollout.placement == 'separate'",
        "trainer.v1.trainerMode separate_async needs separate rollout pods (roles.rollout.placement: separate)",
        ".trainer.v1.trainerMode",
    ),
    CelRule(
        f"{_MODE} != 'colocate_async' || self.roles.rollout.placement == 'colocated'",
        "trainer.v1.trainerMode colocate_async needs roles.rollout.placement colocated (separate pods: separate_async)",
        ".trainer.v1.trainerMode",
    ),
    # Partial rollouts interrupt a generation for a weight push: only the asynchronous modes push
    # while one runs, and only the vLLM engine can be interrupted and resumed.
    CelRule(
        f"!self.asyncTraining.partialRollout || {_MODE} != 'sync'",
        "asyncTraining.partialRollout needs an asynchronous trainer.v1.trainerMode (colocate_async or "
        "separate_async): in sync no weight push happens during a generation",
        ".asyncTraining.partialRollout",
    ),
    CelRule(
        "!self.asyncTraining.partialRollout || self.rollout.name == 'vllm'",
        "asyncTraining.partialRollout needs rollout.name vllm (the hf engine cannot be interrupted)",
        ".asyncTraining.partialRollout",
    ),
    # A tensor-parallel engine's generation is a chain of collectives across its ranks: a rank
    # that also trains keeps it in call order with its other collectives (ray_group.py), where a
    # push cannot reach it until it ends.
    CelRule(
        "!self.asyncTraining.partialRollout || self.roles.rollout.placement == 'separate' || "
        "self.roles.rollout.tensorParallelSize == 1",
        "asyncTraining.partialRollout with roles.rollout.placement colocated needs roles.rollout.tensorParallelSize 1 "
        "(a colocated tensor-parallel generation cannot be paused for a weight push)",
        ".asyncTraining.partialRollout",
    ),
    CelRule(
        "!self.asyncTraining.partialRollout || !self.rollout.multiTurn.enable",
        "asyncTraining.partialRollout is not supported with rollout.multiTurn (an episode's turns would "
        "need resuming between tool calls)",
        ".asyncTraining.partialRollout",
    ),
    # A colocated engine put to sleep after each generation is woken by reloading the actor's
    # weights, which would then happen on the rollout thread while the actor updates them.
    CelRule(
        f"{_MODE} != 'colocate_async' || !self.rollout.freeCacheEngine",
        "trainer.v1.trainerMode colocate_async needs rollout.freeCacheEngine false (the engine generates "
        "while the actor trains)",
        ".rollout.freeCacheEngine",
    ),
)


class TrainerConfig(ApiModel):
    """Everything the trainer reads; loaded from YAML by `rlkube-trainer run`."""

    cel_rules: ClassVar[tuple[CelRule, ...]] = (
        CelRule(
            f"!(self.algorithm.advEstimator in {list(GROUP_ESTIMATORS)}) || self.rollout.samplesPerPrompt > 1",
            "rollout.samplesPerPrompt (verl: rollout.n) must be at least 2 for group estimators "
            f"({', '.join(GROUP_ESTIMATORS)})",
            ".rollout.samplesPerPrompt",
        ),
        CelRule(
            "!has(self.algorithm.rolloutCorrection) || !has(self.algorithm.rolloutCorrection.bypassMode) || "
            "!self.algorithm.rolloutCorrection.bypassMode || !has(self.actor) || !has(self.actor.policyLoss) || "
            "self.actor.policyLoss == 'vanilla'",
            "algorithm.rolloutCorrection.bypassMode replaces the policy loss with its own (ppo_clip or "
            "reinforce, rolloutCorrection.lossType): actor.policyLoss must be vanilla",
            ".actor.policyLoss",
        ),
        # verl's bypass mode takes the engine's log-probs as the old ones and skips the actor's pass,
        # the one that computes sum_pi_squared.
        CelRule(
            f"!(self.algorithm.advEstimator in {list(SUM_PI_SQUARED_ESTIMATORS)}) || "
            "!has(self.algorithm.rolloutCorrection) || !has(self.algorithm.rolloutCorrection.bypassMode) || "
            "!self.algorithm.rolloutCorrection.bypassMode",
            "algorithm.rolloutCorrection.bypassMode skips the actor's old log-prob pass, which computes the "
            f"sum of pi^2 that advEstimator {' and '.join(SUM_PI_SQUARED_ESTIMATORS)} need",
            ".algorithm.rolloutCorrection.bypassMode",
        ),
        CelRule(
            "self.algorithm.advEstimator != 'gae' || has(self.roles.critic)",
            "roles.critic is required when algorithm.advEstimator is gae",
            ".roles",
        ),
        CelRule(
            "self.data.trainBatchSize % self.actor.ppoMiniBatchSize == 0",
            "actor.ppoMiniBatchSize must divide data.trainBatchSize",
            ".actor.ppoMiniBatchSize",
        ),
        CelRule(
            "self.rollout.name != 'hf' || self.roles.rollout.tensorParallelSize == 1",
            "rollout.name hf runs one engine per process: roles.rollout.tensorParallelSize must be 1",
            ".roles.rollout.tensorParallelSize",
        ),
        *ASYNC_RULES,
        CelRule(
            # Otherwise accepted, and the pod exits 1 at the first validation (issue 32).
            "self.trainer.testFreq == -1 || (has(self.data.valFiles) && size(self.data.valFiles) > 0)",
            "trainer.testFreq needs data.valFiles (set testFreq to -1 to never validate)",
            ".trainer.testFreq",
        ),
        *BATCH_SPLIT_RULES,
        *TOKEN_BUDGET_RULES,
        *ROLE_USE_RULES,
        CelRule(
            "!has(self.model.loraRank) || self.model.loraRank == 0 || !has(self.roles.reference)"
            " || has(self.roles.reference.colocateWith)",
            "model.loraRank: with LoRA the reference is the actor's base model (adapters off), so "
            "roles.reference cannot have pods of its own",
            ".roles.reference",
        ),
        CelRule(
            "!has(self.model.loraRank) || self.model.loraRank == 0 || !has(self.ref) "
            "|| !has(self.ref.compileDecoderLayers) || self.ref.compileDecoderLayers == "
            "(has(self.actor) && has(self.actor.compileDecoderLayers) && self.actor.compileDecoderLayers)",
            "ref.compileDecoderLayers: with model.loraRank the reference is the actor's model, compiled as "
            "actor.compileDecoderLayers says",
            ".ref.compileDecoderLayers",
        ),
    )

    model: ModelConfig = Field(description="The policy model.")
    data: DataConfig = Field(description="Training data.")
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig, description="Advantage and KL.")
    actor: ActorConfig = Field(default_factory=ActorConfig, description="Policy update.")
    critic: CriticConfig = Field(default_factory=CriticConfig, description="Value update (gae).")
    ref: ReferenceConfig = Field(default_factory=ReferenceConfig, description="The reference policy (KL).")
    rollout: RolloutConfig = Field(default_factory=RolloutConfig, description="Generation.")
    reward: RewardConfig = Field(
        default_factory=RewardConfig, description="Scores (default: built-in scorers by data_source)."
    )
    trainer: TrainerSection = Field(default_factory=TrainerSection, description="Loop and logging.")
    async_training: AsyncTrainingConfig = Field(
        default_factory=AsyncTrainingConfig, description="Partial rollouts (asynchronous modes)."
    )
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig, description="Checkpoints.")
    roles: Roles = Field(description="Workers per role: replicas, GPUs, parallelism, placement.")

    @property
    def rollout_correction(self) -> RolloutCorrectionConfig:
        """algorithm.rollout_correction as it applies. In the asynchronous trainer modes every
        batch comes from older weights than the actor's, so an unset rollout_is means token-level
        TIS there (at rollout_is_threshold, 2.0 by default); in sync, unset means none."""
        correction = self.algorithm.rollout_correction
        if self.trainer.v1.trainer_mode == "sync" or correction.rollout_is is not None or correction.bypass_mode:
            return correction
        return correction.model_copy(update={"rollout_is": "token"})
