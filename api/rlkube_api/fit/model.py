"""A model's dimensions, as the memory estimate needs them, and the fit settings of an RLJob.

The operator cannot read the model's config.json: model.path is on a volume only the pods mount.
So the job states the dimensions (spec.fit.modelDimensions, config.json's names in camelCase) or
names a known architecture (spec.fit.modelArchitecture, a table of published config.json values).
"""

from __future__ import annotations

from pydantic import Field

from rlkube_api.base import ApiModel, CelRule


class ModelDimensions(ApiModel):
    """The decoder's sizes, by config.json's names (Llama-style: Qwen2/2.5/3, Llama, Mistral)."""

    num_hidden_layers: int = Field(ge=1, le=1024, description="Decoder layers.")
    hidden_size: int = Field(ge=1, le=1_048_576, description="Hidden size.")
    intermediate_size: int = Field(ge=1, le=4_194_304, description="The MLP's inner size.")
    num_attention_heads: int = Field(ge=1, le=4096, description="Attention (query) heads.")
    num_key_value_heads: int | None = Field(None, ge=1, le=4096, description="Key/value heads (default: all).")
    head_dim: int | None = Field(None, ge=1, le=4096, description="Per head (default hiddenSize / heads).")
    vocab_size: int = Field(ge=1, le=16_777_216, description="Vocabulary.")
    tie_word_embeddings: bool = Field(False, description="The LM head shares the embedding matrix.")

    @property
    def kv_heads(self) -> int:
        return self.num_key_value_heads or self.num_attention_heads

    @property
    def head_size(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def layer_parameters(self) -> int:
        """One decoder layer: attention (with Qwen's q/k/v biases), the gated MLP, two norms."""
        h, q, kv = self.hidden_size, self.num_attention_heads * self.head_size, self.kv_heads * self.head_size
        attention = h * q + 2 * h * kv + q * h + q + 2 * kv
        return attention + 3 * h * self.intermediate_size + 2 * h

    @property
    def embedding_parameters(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def head_parameters(self) -> int:
        """The LM head's own parameters (none when tied to the embeddings)."""
        return 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size

    @property
    def parameters(self) -> int:
        layers = self.num_hidden_layers * self.layer_parameters
        return layers + self.embedding_parameters + self.head_parameters + self.hidden_size


def _dims(layers: int, hidden: int, inner: int, heads: int, kv: int, vocab: int, tied: bool) -> ModelDimensions:
    return ModelDimensions(
        num_hidden_layers=layers,
        hidden_size=hidden,
        intermediate_size=inner,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        vocab_size=vocab,
        tie_word_embeddings=tied,
    )


# Published config.json values of the architectures named most often.
KNOWN_ARCHITECTURES: dict[str, ModelDimensions] = {
    "qwen2.5-0.5b": _dims(24, 896, 4864, 14, 2, 151936, True),
    "qwen2.5-1.5b": _dims(28, 1536, 8960, 12, 2, 151936, True),
    "qwen2.5-3b": _dims(36, 2048, 11008, 16, 2, 151936, True),
    "qwen2.5-7b": _dims(28, 3584, 18944, 28, 4, 152064, False),
    "qwen2.5-14b": _dims(48, 5120, 13824, 40, 8, 152064, False),
    "qwen2.5-32b": _dims(64, 5120, 27648, 40, 8, 152064, False),
    "llama-3.1-8b": _dims(32, 4096, 14336, 32, 8, 128256, False),
    "llama-3.1-70b": _dims(80, 8192, 28672, 64, 8, 128256, False),
}


class FitSpec(ApiModel):
    """The memory estimate per rank the operator checks before it creates any pod: a job whose
    estimate exceeds the GPU memory of a role's nodes is held, with the numbers, and no pod is made."""

    cel_rules = (
        CelRule(
            "!(has(self.modelArchitecture) && has(self.modelDimensions))",
            "set modelArchitecture or modelDimensions, not both",
            ".modelDimensions",
        ),
        CelRule(
            "!has(self.gpuMemoryMiB) || has(self.modelArchitecture) || has(self.modelDimensions)",
            "gpuMemoryMiB needs modelArchitecture or modelDimensions (without them nothing is estimated)",
            ".gpuMemoryMiB",
        ),
    )

    model_architecture: str | None = Field(
        None,
        max_length=64,
        pattern="^(" + "|".join(name.replace(".", r"\.") for name in KNOWN_ARCHITECTURES) + ")$",
        description="The policy's architecture by name: " + ", ".join(KNOWN_ARCHITECTURES) + ".",
    )
    model_dimensions: ModelDimensions | None = Field(
        None, description="The policy's sizes, as its config.json states them (when no name fits)."
    )
    gpu_memory_mib: int | None = Field(
        None,
        alias="gpuMemoryMiB",
        ge=1024,
        le=16_777_216,
        description="Memory of one GPU in MiB. Unset: the smallest nvidia.com/gpu.memory label (GPU feature "
        "discovery) among the nodes of each role's pool; nodes without it are not checked.",
    )

    def dimensions(self) -> ModelDimensions | None:
        if self.model_dimensions is not None:
            return self.model_dimensions
        return KNOWN_ARCHITECTURES.get(self.model_architecture or "")
