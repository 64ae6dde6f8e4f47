"""``loss_agg_mode``: how a per-token loss becomes one number (verl 0.9.1's ``agg_loss``).

The modes, over the tokens where ``loss_mask`` is 1:

- ``token-mean``: mean over every token of the batch;
- ``token-sum``: sum over every token;
- ``seq-mean-token-sum``: per-sequence sum, then mean over sequences;
- ``seq-mean-token-mean``: per-sequence mean, then mean over sequences;
- ``seq-mean-token-sum-norm`` (Dr.GRPO's constant normaliser): ``seq-mean-token-sum`` divided by
  ``loss_scale_factor``, by default the response length ``loss_mat.shape[-1]`` (verl >= 0.8.0;
  older verl divided the plain sum of sequence sums, a loss (sequences) times larger).

Sequence means count only sequences with at least one token. A micro-batch's share of a
mini-batch is weighed by ``packing.LossScale`` with the same counts, so a step's gradient does not
depend on how it is split across micro-batches and ranks.
"""

from __future__ import annotations

from typing import Literal, get_args

import torch

from rlkube_trainer.algos.masked import masked_mean, masked_sum

__all__ = ["LOSS_AGG_MODES", "LossAggMode", "agg_loss"]

LossAggMode = Literal["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
LOSS_AGG_MODES: tuple[str, ...] = get_args(LossAggMode)


def agg_loss(
    loss_mat: torch.Tensor,
    loss_mask: torch.Tensor,
    loss_agg_mode: str,
    loss_scale_factor: float | None = None,
) -> torch.Tensor:
    """Reduce a per-token loss to a scalar with one of verl's ``loss_agg_mode`` values."""
    if loss_agg_mode == "token-mean":
        return masked_mean(loss_mat, loss_mask)
    if loss_agg_mode == "token-sum":
        return masked_sum(loss_mat, loss_mask)
    seq_lens = loss_mask.to(loss_mat.dtype).sum(dim=-1)
    # Fully masked rows (e.g. filler in a micro-batch) would otherwise dilute the sequence mean.
    seq_present = (seq_lens > 0).to(loss_mat.dtype)
    if loss_agg_mode in ("seq-mean-token-sum", "seq-mean-token-sum-norm"):
        loss = masked_mean(masked_sum(loss_mat, loss_mask, dim=-1), seq_present)
        if loss_agg_mode == "seq-mean-token-sum-norm":
            loss = loss / (loss_mat.shape[-1] if loss_scale_factor is None else loss_scale_factor)
        return loss
    if loss_agg_mode == "seq-mean-token-mean":
        return masked_mean(masked_mean(loss_mat, loss_mask, dim=-1), seq_present)
    raise ValueError(f"unknown loss_agg_mode {loss_agg_mode!r}; choose one of: {', '.join(LOSS_AGG_MODES)}")
