"""The batch one PPO step works on: prompts and sampled responses as padded tensors,
filled in as the step proceeds (scores, log-probs, values, advantages).

Layout, as in verl: `input_ids = [prompt (left-padded) | response (right-padded)]`,
`[batch, prompt_length + response_length]`; every per-token quantity of the
algorithm is `[batch, response_length]` with `response_mask` marking real tokens.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Self

import torch

from rlkube_trainer.data.prompts import Prompt
from rlkube_trainer.rollout import RolloutBatch


@dataclass
class TrainBatch:
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    responses: torch.Tensor
    response_mask: torch.Tensor
    # The prompt (row of the dataset) each sample answers: GRPO/RLOO groups by it.
    group_index: torch.Tensor
    # Real (unpadded) prompt lengths, for metrics.
    prompt_lengths: torch.Tensor
    # Filled in by the step.
    rollout_log_probs: torch.Tensor | None = None
    # Partial rollouts: the weight version that generated each response token (-1 on padding).
    token_versions: torch.Tensor | None = None
    token_level_scores: torch.Tensor | None = None
    old_log_probs: torch.Tensor | None = None
    # The actor's sum over the vocabulary of pi^2 per response token, from the old log-prob pass
    # (verl's sum_pi_squared), when the advantage estimator reads it (optimal token baseline).
    sum_pi_squared: torch.Tensor | None = None
    # ReMax's baseline, [batch]: the reward of the greedy response to each sample's prompt.
    reward_baselines: torch.Tensor | None = None
    # Rollout correction's importance weights (decoupled mode; rollout_correction.py).
    rollout_is_weights: torch.Tensor | None = None
    ref_log_probs: torch.Tensor | None = None
    values: torch.Tensor | None = None
    token_level_rewards: torch.Tensor | None = None
    advantages: torch.Tensor | None = None
    returns: torch.Tensor | None = None
    # The reward function's other per-sample numbers by key (verl's reward_extra_info): GDPO's
    # reward components. Indexed with the samples like every tensor field.
    reward_extra: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)
    # A multi-turn episode's numbers by metric name (num_turns, tool_call_counts, ...; verl's
    # __num_turns__ and tool_call_counts), per sample; empty for single responses.
    episode: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def response_length(self) -> int:
        return int(self.responses.shape[1])

    def select(self, index: torch.Tensor | slice) -> Self:
        """The samples at `index` (every per-sample tensor indexed alike)."""
        fields: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, dict):
                value = {k: v[index] for k, v in value.items()}
            fields[f.name] = value[index] if isinstance(value, torch.Tensor) else value
        return type(self)(**fields)

    def split(self, size: int) -> list[Self]:
        return [self.select(slice(i, i + size)) for i in range(0, len(self), size)]

    def to(self, device: torch.device | str) -> Self:
        fields: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, dict):
                value = {k: v.to(device) for k, v in value.items()}
            fields[f.name] = value.to(device) if isinstance(value, torch.Tensor) else value
        return type(self)(**fields)


def build_batch(prompts: list[Prompt], rollout: RolloutBatch, pad_token_id: int) -> TrainBatch:
    """Pads prompts on the left and responses on the right into one batch; sample i
    answers prompt i // n. A multi-turn sample brings its own rendered prompt and its mask
    (tool turns attended, out of the response mask)."""
    samples = rollout.samples
    prompt_ids = [
        s.prompt_token_ids if s.prompt_token_ids is not None else prompts[s.prompt_index].prompt_token_ids
        for s in samples
    ]
    prompt_length = max(len(p) for p in prompt_ids)
    response_length = max(1, *(len(s.token_ids) for s in samples))
    batch = len(samples)
    input_ids = torch.full((batch, prompt_length + response_length), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    with_log_probs = all(s.logprobs is not None for s in samples)
    rollout_log_probs = torch.zeros(batch, response_length)
    with_versions = all(s.token_versions is not None for s in samples)
    token_versions = torch.full((batch, response_length), -1, dtype=torch.long)
    for i, (prompt, sample) in enumerate(zip(prompt_ids, samples, strict=True)):
        start = prompt_length - len(prompt)
        input_ids[i, start:prompt_length] = torch.tensor(prompt)
        attention_mask[i, start:prompt_length] = 1
        end = prompt_length + len(sample.token_ids)
        input_ids[i, prompt_length:end] = torch.tensor(sample.token_ids, dtype=torch.long)
        attention_mask[i, prompt_length:end] = 1
        if sample.logprobs is not None:
            rollout_log_probs[i, : len(sample.logprobs)] = torch.tensor(sample.logprobs)
        if sample.token_versions is not None:
            token_versions[i, : len(sample.token_versions)] = torch.tensor(sample.token_versions, dtype=torch.long)
    response_mask = attention_mask[:, prompt_length:].float()
    for i, sample in enumerate(samples):
        if sample.response_mask is not None:
            response_mask[i, : len(sample.response_mask)] = torch.tensor(sample.response_mask, dtype=torch.float32)
    episodes = [s.episode for s in samples if s.episode is not None]
    return TrainBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        responses=input_ids[:, prompt_length:],
        response_mask=response_mask,
        group_index=torch.tensor([prompts[s.prompt_index].index for s in samples]),
        prompt_lengths=torch.tensor([len(p) for p in prompt_ids]),
        rollout_log_probs=rollout_log_probs if with_log_probs else None,
        token_versions=token_versions if with_versions else None,
        episode=(
            {k: torch.tensor([e[k] for e in episodes], dtype=torch.float32) for k in episodes[0]}
            if len(episodes) == len(samples) and episodes
            else {}
        ),
    )


def token_level_scores(scores: list[float], response_mask: torch.Tensor) -> torch.Tensor:
    """Each sequence's score on its last response token, zeros elsewhere.

    The last token is the last one the mask marks, not `sum(mask) - 1`: a multi-turn response's
    mask has holes (tool turns), which would put the score inside the response.
    """
    out = torch.zeros_like(response_mask, dtype=torch.float32)
    positions = torch.arange(response_mask.shape[-1]).expand_as(response_mask)
    last = torch.where(response_mask > 0, positions, torch.zeros_like(positions)).amax(-1)
    out[torch.arange(len(scores)), last] = torch.tensor(scores, dtype=torch.float32)
    return out
