"""Trajectories to the trainer's `TrainBatch`: the whole trajectory is attended, only the model's
tokens are in `response_mask` (so loss, values and advantages skip tool turns)."""

from __future__ import annotations

import torch

from rlkube_trainer.batch import TrainBatch
from rlkube_trainer.rollout.agent.episode import Trajectory


def build_agent_batch(trajs: list[Trajectory], group_index: list[int], pad_token_id: int) -> TrainBatch:
    prompt_length = max(len(t.prompt_ids) for t in trajs)
    response_length = max(1, *(len(t.response_ids) for t in trajs))
    n = len(trajs)
    input_ids = torch.full((n, prompt_length + response_length), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    response_mask = torch.zeros(n, response_length)
    log_probs = torch.zeros(n, response_length)
    for i, t in enumerate(trajs):
        start, end = prompt_length - len(t.prompt_ids), prompt_length + len(t.response_ids)
        input_ids[i, start:prompt_length] = torch.tensor(t.prompt_ids)
        input_ids[i, prompt_length:end] = torch.tensor(t.response_ids, dtype=torch.long)
        attention_mask[i, start:end] = 1
        response_mask[i, : len(t.response_mask)] = torch.tensor(t.response_mask, dtype=torch.float32)
        log_probs[i, : len(t.response_logprobs)] = torch.tensor(t.response_logprobs)
    return TrainBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        responses=input_ids[:, prompt_length:],
        response_mask=response_mask,
        group_index=torch.tensor(group_index),
        prompt_lengths=torch.tensor([len(t.prompt_ids) for t in trajs]),
        rollout_log_probs=log_probs,
    )
