"""algorithm.rollout_correction: importance weights and rejection sampling against the
engine's own log-probs, and the parsers of verl's threshold strings (the trainer reads them too)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from rlkube_api.base import ApiModel, CelRule

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
