"""The reward section: a reward function, a reward model or the built-in scorers, and DAPO's
overlong penalty."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from rlkube_api.base import ApiModel, CelRule
from rlkube_api.config.common import TokenBudget
from rlkube_api.kube_syntax import CONFIG_MAP_KEY_PATTERN, LONG_NAME


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
