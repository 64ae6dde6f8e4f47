"""Value types that more than one section declares: bounded batch sizes and token budgets,
file paths, verl's loss aggregation modes and KL estimators."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

# Bounds on batch sizes keep the batch arithmetic of the cross-section rules (products of three
# of them) far from CEL's 64-bit overflow, which the API server would report as an evaluation error.
MAX_BATCH = 1_048_576

# Token budgets of dynamic micro-batches (verl's *_max_token_len_per_gpu), bounded for the same reason.
MAX_TOKEN_BUDGET = 1 << 30
TokenBudget = Annotated[int, Field(ge=1, le=MAX_TOKEN_BUDGET)]

FilePath = Annotated[str, Field(min_length=1, max_length=4096)]

# Each estimator, and verl's straight-through "+" variant (its value, k2's gradient).
KLPenalty = Literal[
    "kl",
    "k1",
    "abs",
    "mse",
    "k2",
    "low_var_kl",
    "k3",
    "kl+",
    "k1+",
    "abs+",
    "mse+",
    "k2+",
    "low_var_kl+",
    "k3+",
]
LossAggMode = Literal["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
