"""The entropy bonus: the entropy of the actor's token distribution, and its aggregation into the
term the actor subtracts from its loss (``entropy_coeff``)."""

from __future__ import annotations

import torch

from rlkube_trainer.algos.aggregation import agg_loss

__all__ = ["compute_entropy_loss", "entropy_from_logits"]


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(logits) over the last dim, as ``logsumexp(logits) - sum(softmax * logits)``."""
    probs = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - torch.sum(probs * logits, dim=-1)


def compute_entropy_loss(
    entropy: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    loss_scale_factor: float | None = None,
) -> torch.Tensor:
    """``agg_loss(entropy)``; the actor adds ``-entropy_coeff * entropy_loss`` to its loss."""
    return agg_loss(entropy, response_mask, loss_agg_mode, loss_scale_factor)
