"""The critic's clipped value loss."""

from __future__ import annotations

import torch

from rlkube_trainer.algos.aggregation import agg_loss
from rlkube_trainer.algos.masked import masked_mean

__all__ = ["compute_value_loss"]


def compute_value_loss(
    vpreds: torch.Tensor,
    returns: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange_value: float,
    loss_agg_mode: str = "token-mean",
    loss_scale_factor: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Clipped value loss ``0.5*agg(max((v-R)^2, (vclip-R)^2))``; returns (vf_loss, vf_clipfrac)."""
    vpred_clipped = torch.clamp(vpreds, values - cliprange_value, values + cliprange_value)
    vf_losses1 = (vpreds - returns) ** 2
    vf_losses2 = (vpred_clipped - returns) ** 2
    vf_loss = 0.5 * agg_loss(torch.maximum(vf_losses1, vf_losses2), response_mask, loss_agg_mode, loss_scale_factor)
    vf_clipfrac = masked_mean((vf_losses2 > vf_losses1).to(vpreds.dtype), response_mask)
    return vf_loss, vf_clipfrac
