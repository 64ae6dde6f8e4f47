"""The critic's model: a causal-LM backbone (without its LM head) under a scalar value head, and
the values of the response tokens the critic's loss and GAE read.

A module of its own because the critic is the one role whose model is not a causal LM: it is
loaded through `AutoModel` and scored by its value head, not through the log-probs path.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.attention.flex_attention import BlockMask
from transformers import AutoConfig, AutoModel

from rlkube_trainer.model.packing import pack
from rlkube_trainer.model.token_scores import position_ids_from_mask


class CriticModel(nn.Module):
    """A causal-LM backbone (without its LM head) and a scalar value head."""

    def __init__(self, backbone: nn.Module, hidden_size: int) -> None:
        super().__init__()
        self.backbone = backbone
        self.value_head = nn.Linear(hidden_size, 1)
        # Start from V = 0: early advantages are then the raw returns, not noise.
        nn.init.zeros_(self.value_head.weight)
        nn.init.zeros_(self.value_head.bias)

    @classmethod
    def from_pretrained(
        cls, path: str, dtype: torch.dtype = torch.float32, trust_remote_code: bool = False
    ) -> CriticModel:
        config = AutoConfig.from_pretrained(path, local_files_only=True, trust_remote_code=trust_remote_code)
        backbone = AutoModel.from_pretrained(
            path, dtype=dtype, local_files_only=True, trust_remote_code=trust_remote_code
        )
        critic = cls(backbone, config.hidden_size)
        critic.value_head.to(dtype)
        return critic

    @classmethod
    def skeleton(cls, path: str, dtype: torch.dtype = torch.float32, trust_remote_code: bool = False) -> CriticModel:
        """The critic's architecture without weights (see causal_lm_skeleton)."""
        config = AutoConfig.from_pretrained(path, local_files_only=True, trust_remote_code=trust_remote_code)
        critic = cls(
            AutoModel.from_config(config, dtype=dtype, trust_remote_code=trust_remote_code),  # type: ignore[no-untyped-call]
            config.hidden_size,
        )
        critic.value_head.to(dtype)
        return critic

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | BlockMask, position_ids: torch.Tensor
    ) -> torch.Tensor:
        """[batch, seq] values, one per position."""
        hidden = self.backbone(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
        ).last_hidden_state
        values: torch.Tensor = self.value_head(hidden).squeeze(-1)
        return values


def response_values(
    critic: CriticModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    response_length: int,
    packed: bool = False,
) -> torch.Tensor:
    """[batch, response_length]: the value at the position before each response token,
    i.e. of the state in which that token was chosen. `packed` as in `token_scores.response_scores`."""
    if packed:
        rows = pack(input_ids, attention_mask, response_length)
        packed_values = critic(rows.input_ids, rows.attention_mask, rows.position_ids)
        return rows.unpack(packed_values[0, rows.score_index].float())
    values: torch.Tensor = critic(input_ids, attention_mask, position_ids_from_mask(attention_mask))
    return values[:, -response_length - 1 : -1].float()
