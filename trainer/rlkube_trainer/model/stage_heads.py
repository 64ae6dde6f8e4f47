"""The last pipeline stage's heads: what the actor's and the critic's losses read, made on the
stage that holds the final norm, from the same functions the unpipelined models use
(`model.token_scores.chunked_scores`, the critic's value head), at the same positions: the one
before each response token."""

from __future__ import annotations

import torch
from torch import nn

from rlkube_trainer.model.token_scores import ALWAYS_RECOMPUTE, LogitsRecompute, chunked_scores


class ResponseScoresHead(nn.Module):
    """[batch, response_length, SCORES]: each response token's log-prob under the
    temperature-scaled policy, and (when asked for through `with_entropy`,
    `with_sum_pi_squared`, set by the caller before a pass) the entropy and the sum of pi^2."""

    def __init__(self, lm_head: nn.Linear, temperature: float, recompute: LogitsRecompute = ALWAYS_RECOMPUTE) -> None:
        super().__init__()
        self.lm_head = lm_head
        self.temperature = temperature
        self.recompute = recompute
        self.with_entropy = False
        self.with_sum_pi_squared = False

    def forward(self, hidden: torch.Tensor, input_ids: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
        length = response_mask.shape[1]
        return chunked_scores(
            hidden[:, -length - 1 : -1],
            self.lm_head,
            input_ids[:, -length:],
            self.temperature,
            self.with_entropy,
            self.with_sum_pi_squared,
            self.recompute,
        )


class ResponseValuesHead(nn.Module):
    """[batch, response_length] fp32: the critic's value of the state before each response token."""

    def __init__(self, value_head: nn.Linear) -> None:
        super().__init__()
        self.value_head = value_head

    def forward(self, hidden: torch.Tensor, input_ids: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
        length = response_mask.shape[1]
        values: torch.Tensor = self.value_head(hidden[:, -length - 1 : -1]).squeeze(-1)
        return values.float()
