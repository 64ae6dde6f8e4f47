"""``loss_agg_mode``: how a per-token loss becomes one number (verl's ``agg_loss``)."""

from __future__ import annotations

import torch

from rlkube_trainer.algos.masked import masked_mean, masked_sum


def agg_loss(loss_mat: torch.Tensor, loss_mask: torch.Tensor, loss_agg_mode: str) -> torch.Tensor:
    """Reduce a per-token loss to a scalar with one of verl's four ``loss_agg_mode`` values."""
    if loss_agg_mode == "token-mean":
        return masked_mean(loss_mat, loss_mask)
    seq_sums = masked_sum(loss_mat, loss_mask, dim=-1)
    if loss_agg_mode == "seq-mean-token-sum-norm":
        return seq_sums.sum() / loss_mat.shape[-1]
    seq_lens = loss_mask.to(loss_mat.dtype).sum(dim=-1)
    # Fully masked rows (e.g. filler in a micro-batch) would otherwise dilute the sequence mean.
    seq_present = (seq_lens > 0).to(loss_mat.dtype)
    if loss_agg_mode == "seq-mean-token-sum":
        return masked_mean(seq_sums, seq_present)
    if loss_agg_mode == "seq-mean-token-mean":
        return masked_mean(masked_mean(loss_mat, loss_mask, dim=-1), seq_present)
    raise ValueError(
        f"unknown loss_agg_mode {loss_agg_mode!r}; choose one of: token-mean, seq-mean-token-sum, "
        "seq-mean-token-mean, seq-mean-token-sum-norm"
    )
