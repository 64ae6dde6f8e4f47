"""The reward section: a reward function (in a pool of worker processes), a reward model, a
remote verifier or the built-in scorers, and DAPO's overlong penalty."""

from __future__ import annotations

from typing import Annotated, Literal

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


# An HTTP header name (RFC 9110 token).
HEADER_NAME_PATTERN = r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$"


class SecretHeader(ApiModel):
    """A request header whose value is a key of a Secret in the job's namespace."""

    header: str = Field(min_length=1, max_length=256, pattern=HEADER_NAME_PATTERN, description="Header name.")
    secret: Annotated[str, LONG_NAME] = Field(min_length=1, max_length=253, description="Secret name.")
    key: str = Field(min_length=1, max_length=253, pattern=CONFIG_MAP_KEY_PATTERN, description="Key holding the value.")


class RemoteVerifierConfig(ApiModel):
    """An HTTP endpoint scoring one response per request: a POST of the JSON object
    {data_source, solution_str, ground_truth, extra_info}, answered with a JSON number or an
    object with a "score" (and, like a reward function's dict, other numbers and texts)."""

    url: str = Field(
        min_length=1, max_length=4096, pattern=r"^https?://[^\s]+$", description="The endpoint (http:// or https://)."
    )
    headers: dict[str, str] | None = Field(
        None, max_length=32, description="Request headers with literal values (secrets go in secretHeaders)."
    )
    secret_headers: list[SecretHeader] | None = Field(
        None,
        max_length=16,
        description="Request headers from Secrets: the operator puts each into the controller pod's "
        "environment; outside a cluster set RLKUBE_REWARD_HEADER_<index> yourself.",
    )
    timeout_seconds: float = Field(30.0, gt=0, le=3600, description="Limit of one request, connecting included.")
    retries: int = Field(
        3,
        ge=0,
        le=20,
        description="Further attempts after a retryable failure (a connection error, a timeout, HTTP 429 or "
        "5xx); another 4xx is final.",
    )
    backoff_seconds: float = Field(
        1.0, ge=0, le=600, description="Wait before the first retry, doubling each time (or the Retry-After given)."
    )
    max_concurrent: int = Field(8, ge=1, le=1024, description="Requests in flight at once.")


RewardFailurePolicy = Literal["fail", "zero"]


class RewardConfig(ApiModel):
    """Where scores come from: a function, a reward model, or (neither set) the built-in
    scorer of each row's data_source (gsm8k, MATH-style boxed answers)."""

    cel_rules = (
        CelRule(
            "!(has(self.function) && has(self.model))",
            "at most one of reward.function and reward.model may be set (neither: built-in scorers by data_source)",
        ),
        CelRule(
            "!has(self.remote) || !(has(self.function) || has(self.model))",
            "reward.remote replaces reward.function and reward.model: set only one",
            ".remote",
        ),
        CelRule(
            "!(has(self.model) || has(self.remote)) || !(has(self.numWorkers) || has(self.timeoutSeconds))",
            "reward.numWorkers and reward.timeoutSeconds apply to reward functions (reward.function or the "
            "built-in scorers); reward.remote has its own timeoutSeconds and maxConcurrent",
            ".numWorkers",
        ),
        CelRule(
            "!has(self.timeoutSeconds) || !has(self.numWorkers) || self.numWorkers > 0",
            "reward.timeoutSeconds needs worker processes (numWorkers above 0, or unset): "
            "a call in the driver's own process cannot be stopped",
            ".timeoutSeconds",
        ),
        CelRule(
            "!has(self.model) || self.onFailure == 'fail'",
            "reward.onFailure applies to reward functions and remote verifiers, not to reward.model",
            ".onFailure",
        ),
    )

    function: RewardFunctionConfig | None = Field(
        None, description="A reward function from a file; overrides the built-in scorers."
    )
    model: RewardModelConfig | None = Field(None, description="A reward model.")
    remote: RemoteVerifierConfig | None = Field(None, description="A remote verifier: an HTTP endpoint per response.")
    num_workers: int | None = Field(
        None,
        ge=0,
        le=1024,
        description="Worker processes calling the reward function, each importing its file once (unset: "
        "the CPUs the driver may use, no more than its container's CPU limit). 0 calls it in the driver's "
        "own process, one row after another (for debugging; no timeoutSeconds).",
    )
    timeout_seconds: float | None = Field(
        None,
        gt=0,
        le=86400,
        description="Limit of one reward function call (unset: none); the worker is then replaced.",
    )
    on_failure: RewardFailurePolicy = Field(
        "fail",
        description="A reward function call that raises, times out or crashes its worker, or a remote "
        "verifier request that fails for good: fail the step with the row named (fail), or score the "
        "row 0 and count it in reward/failed_samples (zero).",
    )
    overlong_buffer: OverlongBufferConfig = Field(
        default_factory=OverlongBufferConfig, description="DAPO overlong reward shaping."
    )
