"""The policy model section (`model`): its checkpoint, memory settings and LoRA adapters."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar

from pydantic import Field, field_validator

from rlkube_api.base import ApiModel, CelRule

MAX_LORA_RANK = 4096
LoraModules = Annotated[list[Annotated[str, Field(min_length=1, max_length=256)]], Field(max_length=256)]
_REGEX_CHARACTERS = frozenset("*+?[](){}|^$\\")


def lora_module_names(value: Any) -> Any:
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
    cel_rules: ClassVar[tuple[CelRule, ...]] = (CelRule("self == oldSelf", "model is immutable", transition=True),)

    path: str = Field(
        min_length=1,
        max_length=4096,
        description="Directory of a Hugging Face causal-LM (config, weights, tokenizer) on a mounted "
        "volume. The trainer downloads nothing; in an RLJob, model.uri fetches it there once before the pods start.",
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

    _lora_lists = field_validator("target_modules", "exclude_modules", mode="before")(lora_module_names)
