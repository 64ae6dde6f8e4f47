"""The contract between the trainer and a rollout (generation) engine.

The trainer hands an engine tokenized prompts and gets back token ids plus the log-probs the engine
sampled them with; after each optimizer step it pushes the new weights into the engine. Everything
is in token space: tokenizing prompts and detokenizing responses is the caller's job, so engines
never disagree with the trainer about tokenization.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Literal, Self

import torch

# "stop": the model emitted an end-of-sequence token (kept as the last response token);
# "length": max_tokens (or the engine's max_model_len) was reached.
FinishReason = Literal["stop", "length"]


@dataclass(frozen=True)
class SamplingConfig:
    """How to sample responses; the same meaning for every engine.

    `temperature == 0` means greedy decoding. `top_k=-1` and `top_p=1.0` disable those filters.
    `seed` makes sampling reproducible for a given engine (not across engines: each has its own
    random streams). With `logprobs`, each sampled token's log-probability is returned under the
    distribution it was sampled from, i.e. after temperature, top-k and top-p (vLLM's
    "processed_logprobs"): that is the behaviour policy's log-prob an importance-sampling correction
    needs. With temperature 0 it is the plain log-softmax of the logits.
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int = 128
    seed: int | None = None
    ignore_eos: bool = False
    logprobs: bool = True

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f"SamplingConfig.n must be >= 1, got {self.n}")
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ValueError(f"SamplingConfig.temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"SamplingConfig.top_p must be in (0, 1], got {self.top_p}")
        if self.top_k != -1 and self.top_k < 1:
            raise ValueError(f"SamplingConfig.top_k must be -1 (disabled) or >= 1, got {self.top_k}")
        if self.max_tokens < 1:
            raise ValueError(f"SamplingConfig.max_tokens must be >= 1, got {self.max_tokens}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass(frozen=True)
class RolloutSample:
    """One generated response."""

    prompt_index: int
    token_ids: list[int]
    # Log-prob of each token in `token_ids` (same length); None when not requested.
    logprobs: list[float] | None
    finish_reason: FinishReason
    # Set by a multi-turn episode (rollout/agent/sampler.py), None for one response: the prompt
    # as the episode rendered it (a chat template may render the tools into it), 1 on the tokens
    # the model sampled and 0 on tool turns, and the episode's numbers by metric name.
    prompt_token_ids: list[int] | None = None
    response_mask: list[int] | None = None
    episode: dict[str, float] | None = None
    # With partial rollouts (rollout/partial.py): the weight version that generated each token of
    # `token_ids` (same length); None when the engine does not track versions.
    token_versions: list[int] | None = None
    # Merged into the reward function's extra_info (verl's num_turns and rollout_reward_scores).
    reward_info: dict[str, Any] | None = None


@dataclass(frozen=True)
class RolloutBatch:
    """`n` samples per prompt, grouped in prompt order: prompt 0's n samples, then prompt 1's, ..."""

    samples: list[RolloutSample]
    n: int
    # Counts the sampler adds to the step's metrics by name (a harness's lost episodes, ...).
    metrics: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if len(self.samples) % self.n != 0:
            raise ValueError(f"{len(self.samples)} samples is not a multiple of n={self.n}")

    def __len__(self) -> int:
        return len(self.samples)

    def __iter__(self) -> Iterator[RolloutSample]:
        return iter(self.samples)

    @property
    def num_prompts(self) -> int:
        return len(self.samples) // self.n

    def group(self, prompt_index: int) -> list[RolloutSample]:
        """The n samples of one prompt."""
        if not 0 <= prompt_index < self.num_prompts:
            raise IndexError(f"prompt_index {prompt_index} out of range [0, {self.num_prompts})")
        return self.samples[prompt_index * self.n : (prompt_index + 1) * self.n]


def check_prompts(prompt_token_ids: list[list[int]]) -> None:
    """Reject input that engines would otherwise fail on deep inside (or, worse, accept)."""
    for i, ids in enumerate(prompt_token_ids):
        if len(ids) == 0:
            raise ValueError(f"prompt {i} is empty: every prompt needs at least one token")


class RolloutEngine(ABC):
    """A generation backend the trainer can sample from and push weights into.

    Engines are context managers; `close()` releases the engine (idempotent).
    """

    @abstractmethod
    def generate(self, prompt_token_ids: list[list[int]], sampling: SamplingConfig) -> RolloutBatch:
        """Sample `sampling.n` responses for each prompt."""

    @abstractmethod
    def update_weights(
        self, named_tensors: Iterable[tuple[str, torch.Tensor]], names: Collection[str] | None = None
    ) -> None:
        """Replace the engine's weights.

        Names are Hugging Face parameter names, as from `model.named_parameters()` or
        `model.state_dict()` of the `AutoModelForCausalLM` the engine was started from; the full set
        is expected (tied weights may be given once). Tensors may be on any device and in any
        floating dtype; the engine copies and casts them. Cached prefixes computed with the old
        weights are dropped.

        With `names` (the names `named_tensors` will yield, checked before any weight is touched)
        the tensors are consumed as they come, so a caller gathering them in buckets holds one
        bucket at a time; without, they are all taken first.
        """

    @abstractmethod
    def reset_prefix_cache(self) -> None:
        """Forget cached prompt prefixes (their KV was computed with the weights of that time)."""

    @abstractmethod
    def sleep(self) -> None:
        """Release the engine's memory (weights, KV cache) for the trainer's use, where possible."""

    @abstractmethod
    def wake_up(self) -> None:
        """Restore what `sleep()` released."""

    @abstractmethod
    def close(self) -> None:
        """Shut the engine down and free its memory. Idempotent."""

    # Partial rollouts (rollout/partial.py). Engines that support them are started with partial
    # rollouts on; the others refuse by name.
    def pause_generation(self) -> None:
        """From another thread than the one generating: stop the `generate` call in flight at
        its next step boundary and return once the engine is idle (at once if none runs); every
        `generate` then waits for `resume_generation`. Weights may be updated meanwhile."""
        raise NotImplementedError(f"{type(self).__name__} has no partial rollouts (async_training.partial_rollout)")

    def resume_generation(self, weight_version: int) -> None:
        """Let generation go on with the engine's weights, which are now `weight_version`:
        interrupted samples continue from their prompt and the tokens generated so far, and
        every token records the version that produced it (`RolloutSample.token_versions`)."""
        raise NotImplementedError(f"{type(self).__name__} has no partial rollouts (async_training.partial_rollout)")

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def streamed(
    named_tensors: Iterable[tuple[str, torch.Tensor]], names: Collection[str]
) -> Iterator[tuple[str, torch.Tensor]]:
    """The tensors as they come, refusing any not announced in `names` (a caller's bug: the
    update is then already partial) and any announced one that never came."""
    expected, seen = set(names), set()
    for name, tensor in named_tensors:
        if name not in expected:
            raise ValueError(f"update_weights: {name} was not among the names announced")
        seen.add(name)
        yield name, tensor
    if missing := expected - seen:
        raise ValueError(f"update_weights: announced but not given: {sorted(missing)[:10]}")
