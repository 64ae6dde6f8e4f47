"""Per-token log-probs from a causal LM: of every token (`token_log_probs`) or of the response
tokens only (`response_scores`, `response_log_probs`), with the entropy and the sum of squared
probabilities when asked for, padded or packed.

The LM head's output is the largest tensor of an actor update ([tokens, vocab] in fp32), so this
module is mostly about not making it whole: the head runs on the response positions only and,
where the model's forward returns the head's output unchanged, computes the scores chunk by chunk
(`chunked_scores`), each chunk's logits kept for the backward or recomputed there
(`LogitsRecompute`).

Positions come from the attention mask, so a sequence gives the same numbers whether it is
padded on the left or on the right.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from rlkube_api.config import RecomputeLogits
from rlkube_trainer.model.packing import PackedBatch, pack


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """0, 1, 2, ... over the real tokens, whatever side the padding is on."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def sum_pi_squared_from_logits(logits: torch.Tensor, logsumexp: torch.Tensor | None = None) -> torch.Tensor:
    """``sum_v pi(v)^2`` of softmax(logits) over the last dim, as ``exp(lse(2z) - 2*lse(z))``: no
    [..., vocab] probability tensor is written, and large logits do not overflow. `logsumexp`
    (of `logits`, when the caller has it) saves a pass over the vocabulary."""
    lse = torch.logsumexp(logits, dim=-1) if logsumexp is None else logsumexp
    return torch.exp(torch.logsumexp(2.0 * logits, dim=-1) - 2.0 * lse)


def _taken_token_scores(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float, with_entropy: bool, with_sum_pi_squared: bool
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Log-prob of each target under softmax(logits / temperature), in fp32, and optionally the
    entropy and the sum of squared probabilities of that distribution. logits [..., vocab],
    targets [...]."""
    logits = logits.float()
    if temperature != 1.0 and temperature > 0:
        logits = logits / temperature
    # gather - logsumexp instead of log_softmax then gather: no [..., vocab] log-prob tensor is
    # written, and the backward keeps only the logits and the [...] logsumexp.
    logsumexp = torch.logsumexp(logits, dim=-1)
    log_probs = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - logsumexp
    entropy = None
    if with_entropy:
        # algos.entropy_from_logits (logsumexp - sum(softmax * logits)), reusing the logsumexp
        # above rather than making a second pass over the vocabulary.
        entropy = logsumexp - torch.sum(torch.softmax(logits, dim=-1) * logits, dim=-1)
    # Of the temperature-scaled distribution, as verl's actor: the policy the rollout sampled.
    sum_pi_squared = sum_pi_squared_from_logits(logits, logsumexp) if with_sum_pi_squared else None
    return log_probs, entropy, sum_pi_squared


def _taken_token_log_probs(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`_taken_token_scores` without the sum of squared probabilities."""
    log_probs, entropy, _ = _taken_token_scores(logits, targets, temperature, with_entropy, False)
    return log_probs, entropy


def token_log_probs(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    temperature: float = 1.0,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-prob of every token given the ones before it: column t scores token t+1.

    Returns ([batch, seq-1] log-probs, [batch, seq-1] entropies or None). Logits are
    divided by the sampling temperature, as the rollout sampled with it.
    """
    logits = model(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids_from_mask(attention_mask)
    ).logits[:, :-1, :]
    return _taken_token_log_probs(logits, input_ids[:, 1:], temperature, with_entropy)


def _logits_to_keep_argument(model: nn.Module) -> str | None:
    """The name under which the model's forward takes "compute the LM head on the last k
    positions only": `logits_to_keep` in transformers 5 and late 4.x, `num_logits_to_keep` in
    earlier 4.x and some remote-code models; None if it takes neither."""
    parameters = inspect.signature(model.forward).parameters
    return next((name for name in ("logits_to_keep", "num_logits_to_keep") if name in parameters), None)


# One chunk of fp32 logits is at most this many elements ([tokens, vocab]; 512 MiB): the LM
# head's output for a whole batch ([batch, tokens, vocab] in fp32) is never made.
LOGITS_CHUNK_ELEMENTS = 2**27
# auto keeps the logits when they take at most this share of the accelerator's memory: at the
# benchmark's shape (16 × 513 scored tokens × 151,936 vocabulary × 4 bytes = 4.6 GiB) that is kept on
# an 80 GB H100 (10 GB budget), and a 7B update's micro-batch of 4 still fits beside its weights.
LOGITS_BUDGET_SHARE = 8
# On CPU (tests, tiny models) there is no device memory to read; host memory is shared.
CPU_LOGITS_BUDGET_BYTES = 2 * 2**30


def logits_budget_bytes(device: torch.device) -> int:
    """The memory `recompute_logits: auto` lets the update keep logits in (see LOGITS_BUDGET_SHARE)."""
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory) // LOGITS_BUDGET_SHARE
    return CPU_LOGITS_BUDGET_BYTES


def kept_logits_bytes(tokens: int, vocab: int, with_entropy: bool) -> int:
    """What the backward holds when no chunk is recomputed: each scored token's fp32 logits (saved
    by the logsumexp) and, with the entropy in the loss, its fp32 probabilities (saved by the
    softmax). The temperature-scaled copy replaces the unscaled one; nothing else is [tokens, vocab]."""
    return tokens * vocab * 4 * (2 if with_entropy else 1)


@dataclass(frozen=True)
class LogitsRecompute:
    """actor.recompute_logits: whether the LM head's chunks are recomputed in the backward
    (activation checkpointing, one chunk of logits alive at a time) or kept from the forward (the
    head's matmul runs twice instead of three times). `auto` keeps them when they fit `budget_bytes`."""

    mode: RecomputeLogits = "always"
    budget_bytes: int = 0

    def recomputes(self, tokens: int, vocab: int, with_entropy: bool) -> bool:
        if self.mode == "auto":
            return kept_logits_bytes(tokens, vocab, with_entropy) > self.budget_bytes
        return self.mode == "always"


# What a caller that does not say gets: the bounded-memory path.
ALWAYS_RECOMPUTE = LogitsRecompute("always")
# Models whose forward returns the LM head's output as is (no soft-capping or scaling of the
# logits), so the head may be swapped for one that returns the scores directly.
PLAIN_HEAD_MODEL_TYPES = frozenset({"llama", "qwen2", "qwen3", "mistral", "qwen2_moe", "qwen3_moe"})


def _chunk_scores(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    temperature: float,
    with_entropy: bool,
    with_sum_pi_squared: bool = False,
) -> torch.Tensor:
    """[tokens, SCORES]: log-prob of each target, the entropy and the sum of squared probabilities
    (each 0 unless asked for), from one chunk of hidden states through the LM head."""
    log_probs, entropy, sum_pi_squared = _taken_token_scores(
        nn.functional.linear(hidden, weight, bias), targets, temperature, with_entropy, with_sum_pi_squared
    )
    zeros = torch.zeros_like(log_probs)
    return torch.stack(
        [log_probs, zeros if entropy is None else entropy, zeros if sum_pi_squared is None else sum_pi_squared],
        dim=-1,
    )


# The per-token numbers a chunk of the LM head yields: log-prob, entropy, sum of pi^2.
SCORES = 3


def chunked_scores(
    hidden: torch.Tensor,
    head: nn.Linear,
    targets: torch.Tensor,
    temperature: float,
    with_entropy: bool,
    with_sum_pi_squared: bool = False,
    recompute: LogitsRecompute = ALWAYS_RECOMPUTE,
) -> torch.Tensor:
    """[batch, positions, SCORES] (log-prob, entropy, sum of pi^2) of `targets` [batch, positions]
    from hidden states [batch, positions, hidden], chunk by chunk. With gradients each chunk is
    recomputed in the backward (activation checkpointing), so that at most one chunk of logits is
    alive at a time, unless `recompute` keeps them."""
    batch, positions, width = hidden.shape
    per_chunk = max(1, LOGITS_CHUNK_ELEMENTS // head.out_features)
    parts = []
    needs_grad = torch.is_grad_enabled() and (hidden.requires_grad or head.weight.requires_grad)
    recomputing = needs_grad and recompute.recomputes(batch * positions, head.out_features, with_entropy)
    hidden_chunks = torch.split(hidden.reshape(-1, width), per_chunk)
    for h, t in zip(hidden_chunks, torch.split(targets.reshape(-1), per_chunk), strict=True):
        args = (h, head.weight, head.bias, t, temperature, with_entropy, with_sum_pi_squared)
        if recomputing:
            parts.append(checkpoint(_chunk_scores, *args, use_reentrant=False))
        else:
            parts.append(_chunk_scores(*args))
    return torch.cat(parts).view(batch, positions, SCORES)


def _plain_head(model: nn.Module) -> nn.Linear | None:
    """The model's LM head when its forward returns the head's output unchanged, else None."""
    config = getattr(model, "config", None)
    if getattr(config, "model_type", None) not in PLAIN_HEAD_MODEL_TYPES:
        return None
    get_head = getattr(model, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else None
    return head if isinstance(head, nn.Linear) else None


@contextmanager
def _head_returns(head: nn.Linear, forward: Callable[[torch.Tensor], torch.Tensor]) -> Iterator[None]:
    """Within the block the LM head returns `forward(hidden)` instead of its logits: the scores of
    the positions that matter. It still runs inside the model's own forward, where FSDP2 has
    gathered the root's parameters (the head among them)."""
    head.forward = forward  # type: ignore[method-assign,assignment]  # this instance only, for this block
    try:
        yield
    finally:
        del head.forward


def _head_returns_scores(
    head: nn.Linear,
    input_ids: torch.Tensor,
    temperature: float,
    with_entropy: bool,
    with_sum_pi_squared: bool,
    recompute: LogitsRecompute,
) -> contextlib.AbstractContextManager[None]:
    """The LM head returns the (log-prob, entropy, sum of pi^2) of each kept position's next token."""
    # Position t scores token t + 1; the last position predicts past the sequence (target 0).
    targets = torch.cat([input_ids[:, 1:], input_ids.new_zeros(input_ids.shape[0], 1)], dim=1)

    def forward(hidden: torch.Tensor) -> torch.Tensor:
        return chunked_scores(
            hidden, head, targets[:, -hidden.shape[1] :], temperature, with_entropy, with_sum_pi_squared, recompute
        )

    return _head_returns(head, forward)


@dataclass
class ResponseScores:
    """Per response token, [batch, response_length]: the log-prob of the sampled token, and
    (when asked for) the entropy and the sum over the vocabulary of pi^2 (verl's
    sum_pi_squared, the optimal token baseline's input) of the distribution it was drawn from."""

    log_probs: torch.Tensor
    entropy: torch.Tensor | None = None
    sum_pi_squared: torch.Tensor | None = None


def response_log_probs(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    response_length: int,
    temperature: float = 1.0,
    with_entropy: bool = False,
    packed: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """[batch, response_length] log-probs (and entropies) of the response tokens: `response_scores`
    without the sum of squared probabilities."""
    scores = response_scores(model, input_ids, attention_mask, response_length, temperature, with_entropy, packed)
    return scores.log_probs, scores.entropy


def response_scores(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    response_length: int,
    temperature: float = 1.0,
    with_entropy: bool = False,
    packed: bool = False,
    with_sum_pi_squared: bool = False,
    recompute: LogitsRecompute = ALWAYS_RECOMPUTE,
) -> ResponseScores:
    """[batch, response_length] log-probs (and entropies, and sums of pi^2) of the response tokens,
    for sequences laid out as prompt (left-padded) followed by response (right-padded); 0 at
    response padding when `packed`, whatever the model computes there otherwise.

    `packed`: the sequences run as one packed row (`packing.py`; the model must have
    `enable_packed_attention`), and the LM head only at the positions that score response
    tokens.

    The LM head runs on the last response_length + 1 positions only: the [batch, seq, vocab]
    logits of the prompt are never made (with a 32-150 k vocabulary they dominate the memory
    and the non-matmul time of an actor update). Where the model allows, the head computes the
    scores chunk by chunk (`chunked_scores`), so no [batch, response, vocab] fp32 logits are
    made either.
    """
    # Through the model's own forward rather than its backbone and head separately: under
    # FSDP2 the root module's pre-forward hook is what gathers the root's own parameters
    # (embeddings, final norm, LM head), so calling model.model / model.lm_head directly would
    # see them still sharded. An int, unlike a tensor of positions, is understood by every
    # version of the argument; it keeps one position too many, the last, whose logits predict
    # past the sequence and are dropped below (1/(response_length+1) extra head work).
    if packed:
        rows = pack(input_ids, attention_mask, response_length)
        return _packed_scores(model, rows, temperature, with_entropy, with_sum_pi_squared, recompute)
    keep = _logits_to_keep_argument(model)
    extra = {keep: response_length + 1} if keep is not None else {}
    position_ids = position_ids_from_mask(attention_mask)
    head = _plain_head(model)
    if head is not None:
        with _head_returns_scores(head, input_ids, temperature, with_entropy, with_sum_pi_squared, recompute):
            scores = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, **extra)
        scores = scores.logits[:, -response_length - 1 : -1, :]
        return ResponseScores(
            scores[..., 0],
            scores[..., 1] if with_entropy else None,
            scores[..., 2] if with_sum_pi_squared else None,
        )
    logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, **extra).logits
    # Position t predicts token t+1: the response tokens [-R:] are scored at [-R-1:-1]. The
    # same slice is right whether the model kept R+1 positions or (ignoring the argument) all.
    logits = logits[:, -response_length - 1 : -1, :]
    return ResponseScores(
        *_taken_token_scores(logits, input_ids[:, -response_length:], temperature, with_entropy, with_sum_pi_squared)
    )


def _packed_scores(
    model: nn.Module,
    packed: PackedBatch,
    temperature: float,
    with_entropy: bool,
    with_sum_pi_squared: bool,
    recompute: LogitsRecompute,
) -> ResponseScores:
    inputs = {
        "input_ids": packed.input_ids,
        "attention_mask": packed.attention_mask,
        "position_ids": packed.position_ids,
    }
    head = _plain_head(model)
    if head is not None:
        index, targets = packed.score_index, packed.targets.unsqueeze(0)

        def forward(hidden: torch.Tensor) -> torch.Tensor:
            return chunked_scores(
                hidden[:, index], head, targets, temperature, with_entropy, with_sum_pi_squared, recompute
            )

        with _head_returns(head, forward):
            scores = model(**inputs).logits[0]
        row = ResponseScores(
            scores[:, 0], scores[:, 1] if with_entropy else None, scores[:, 2] if with_sum_pi_squared else None
        )
    else:
        logits = model(**inputs).logits[0, packed.score_index]
        row = ResponseScores(
            *_taken_token_scores(logits, packed.targets, temperature, with_entropy, with_sum_pi_squared)
        )
    return ResponseScores(
        packed.unpack(row.log_probs),
        None if row.entropy is None else packed.unpack(row.entropy),
        None if row.sum_pi_squared is None else packed.unpack(row.sum_pi_squared),
    )
