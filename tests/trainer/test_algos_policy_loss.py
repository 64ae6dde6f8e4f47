"""Hand-worked checks of verl 0.9.1's further policy losses (rlkube_trainer.algos.policy_loss_*).

Each expected number is derived in the comments or from a plain-Python formula of the loss for
one token; the gradient is checked with respect to the current log-probs.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from rlkube_trainer.algos import (
    FIXED_LOSS_AGG_MODES,
    compute_policy_loss_cispo,
    compute_policy_loss_clip_cov,
    compute_policy_loss_dppo_kl,
    compute_policy_loss_dppo_tv,
    compute_policy_loss_dro,
    compute_policy_loss_geo_mean,
    compute_policy_loss_gpg,
    compute_policy_loss_kl_cov,
    compute_policy_loss_sapo,
    get_policy_loss_fn,
)


def t(x: Any) -> torch.Tensor:
    return x.to(torch.float64) if isinstance(x, torch.Tensor) else torch.tensor(x, dtype=torch.float64)


def close(actual: Any, expected: Any, atol: float = 1e-12) -> None:
    torch.testing.assert_close(actual, t(expected) if isinstance(actual, torch.Tensor) else expected, atol=atol, rtol=0)


def grad_of(loss: torch.Tensor, wrt: torch.Tensor) -> torch.Tensor:
    (grad,) = torch.autograd.grad(loss, wrt)
    return grad


# Old probability 0.5 everywhere; new 0.6, 0.8 (A > 0) and 0.4, 0.1 (A < 0), then a padded token.
P_NEW = [0.6, 0.8, 0.4, 0.1, 0.9]
ADV = [[1.0, 1.0, -1.0, -1.0, 1.0]]
MASK = [[1.0, 1.0, 1.0, 1.0, 0.0]]


def dppo_inputs() -> tuple[torch.Tensor, torch.Tensor]:
    old = torch.log(torch.full((1, 5), 0.5, dtype=torch.float64))
    new = torch.log(t([P_NEW])).requires_grad_(True)
    return old, new


def test_dppo_tv_keeps_tokens_inside_the_total_variation_bound() -> None:
    # p - p_old: .1 (A>0, <= .2 kept), .3 (A>0, > .2 left out), -.1 (A<0, >= -.2 kept), -.4 (left out)
    # kept tokens: -A * ratio * log p, ratios 1.2 and 0.8 (below clip_ratio_c 3: not truncated)
    old, new = dppo_inputs()
    loss, clipfrac, ppo_kl, lower = compute_policy_loss_dppo_tv(
        old, new, t(ADV), t(MASK), cliprange=0.2, clip_ratio_c=3.0
    )
    close(loss, (-1.2 * math.log(0.6) + 0.8 * math.log(0.4)) / 4)
    close(clipfrac, 2 / 4)
    close(lower, 0.0)
    close(ppo_kl, -sum(math.log(p / 0.5) for p in P_NEW[:4]) / 4)
    # the ratio is detached: d/dlog p = -A * ratio / 4 on kept tokens
    close(grad_of(loss, new), [[-1.2 / 4, 0.0, 0.8 / 4, 0.0, 0.0]])
    # truncation: with clip_ratio_c 1.1 the kept A>0 token's ratio 1.2 becomes 1.1 and counts in lower
    loss, _, _, lower = compute_policy_loss_dppo_tv(old, new, t(ADV), t(MASK), cliprange=0.2, clip_ratio_c=1.1)
    close(loss, (-1.1 * math.log(0.6) + 0.8 * math.log(0.4)) / 4)
    close(lower, 1 / 4)


def test_dppo_kl_uses_the_binary_kl_and_lets_tokens_moving_back_through() -> None:
    def binary_kl(old: float, new: float) -> float:
        return old * math.log(old / new) + (1 - old) * math.log((1 - old + 1e-8) / (1 - new + 1e-8))

    # binary KLs: .6 -> 0.0204 (kept), .8 -> 0.223 (> .2, moving with A: left out),
    # .4 -> 0.0204 (kept), .1 -> 0.511 (left out)
    assert binary_kl(0.5, 0.8) > 0.2 > binary_kl(0.5, 0.6)
    old, new = dppo_inputs()
    loss, clipfrac, _, _ = compute_policy_loss_dppo_kl(old, new, t(ADV), t(MASK), cliprange=0.2, clip_ratio_c=3.0)
    close(loss, (-1.2 * math.log(0.6) + 0.8 * math.log(0.4)) / 4)
    close(clipfrac, 2 / 4)
    # A > 0 on a token whose probability fell (.1): far in KL but kept, as it moves against A
    loss, clipfrac, _, _ = compute_policy_loss_dppo_kl(
        old[:, :1], torch.log(t([[0.1]])), t([[1.0]]), t([[1.0]]), cliprange=0.2, clip_ratio_c=3.0
    )
    close(clipfrac, 0.0)
    close(loss, -0.2 * math.log(0.1))


def test_sapo_gate_and_its_fixed_aggregation() -> None:
    # f(r) = sigmoid(tau (r - 1)) * 4 / tau; tau 1 for A > 0, 1.05 otherwise
    def gate(r: float, tau: float) -> float:
        return 1 / (1 + math.exp(-tau * (r - 1))) * 4 / tau

    old = torch.zeros(2, 2, dtype=torch.float64)
    new = t([[0.0, math.log(1.5)], [math.log(0.5), 0.0]]).requires_grad_(True)
    adv = t([[1.0, 1.0], [-1.0, -1.0]])
    mask = t([[1.0, 1.0], [1.0, 0.0]])
    loss, clipfrac, ppo_kl, lower = compute_policy_loss_sapo(old, new, adv, mask)
    # seq-mean-token-mean: row 0 mean of -f(1), -f(1.5); row 1 one token +f_neg(0.5)
    row0 = (-gate(1.0, 1.0) - gate(1.5, 1.0)) / 2
    row1 = gate(0.5, 1.05)
    close(loss, (row0 + row1) / 2)
    close(clipfrac, 0.0)
    close(lower, 0.0)
    close(ppo_kl, -(math.log(1.5) + math.log(0.5)) / 3)
    # at r = 1 the gate's slope is 1, so d/dlog p = -A * 1 * (1/2 of 1/2)
    close(grad_of(loss, new)[0, 0], -0.25)
    assert FIXED_LOSS_AGG_MODES["sapo"] == "seq-mean-token-mean"


def test_gpg_is_plain_policy_gradient() -> None:
    new = t([[-1.0, -2.0, 7.0]]).requires_grad_(True)
    adv, mask = t([[2.0, -1.0, 5.0]]), t([[1.0, 1.0, 0.0]])
    loss, clipfrac, ppo_kl, lower = compute_policy_loss_gpg(torch.zeros(1, 3, dtype=torch.float64), new, adv, mask)
    close(loss, (2.0 - 2.0) / 2)  # (-(-1)*2 + -(-2)*(-1)) / 2
    close(grad_of(loss, new), [[-1.0, 0.5, 0.0]])
    for metric in (clipfrac, ppo_kl, lower):
        close(metric, 0.0)


def test_clip_cov_cuts_the_gradient_of_the_high_covariance_token() -> None:
    # ratio 1 everywhere (nothing clipped by PPO). A = 3, 0, 0, -3 (mean 0); log p = 1, 0, 0, -2
    # (mean -0.25): cov = 3*1.25 = 3.75, 0, 0, -3*-1.75 = 5.25. Only 3.75 lies in (1, 5): its
    # gradient is cut (one token: max(1, 0.0002 * 4)).
    log_p = [[1.0, 0.0, 0.0, -2.0]]
    new = t(log_p).requires_grad_(True)
    adv, mask = t([[3.0, 0.0, 0.0, -3.0]]), t([[1.0, 1.0, 1.0, 1.0]])
    loss, clipfrac, ppo_kl, lower = compute_policy_loss_clip_cov(t(log_p), new, adv, mask, cliprange=0.2)
    close(loss, 3.0 / 4)  # -A * 1 on the three others: 0, 0, 3
    close(clipfrac, 1 / 4)
    close(ppo_kl, 0.0)
    close(lower, 0.0)
    close(grad_of(loss, new), [[0.0, 0.0, 0.0, 3 / 4]])


def test_kl_cov_penalises_the_highest_covariance_token() -> None:
    # as above, but token 3's old log-prob is 0.5 higher: log ratio -0.5 there; its covariance 5.25
    # is the largest, so it gets + 0.1 * |log r|
    log_p = [[1.0, 0.0, 0.0, -2.0]]
    old = t([[1.0, 0.0, 0.0, -1.5]])
    new = t(log_p).requires_grad_(True)
    adv, mask = t([[3.0, 0.0, 0.0, -3.0]]), t([[1.0, 1.0, 1.0, 1.0]])
    loss, clipfrac, ppo_kl, _ = compute_policy_loss_kl_cov(old, new, adv, mask, ppo_kl_coef=0.1)
    close(loss, (-3.0 + 3 * math.exp(-0.5) + 0.1 * 0.5) / 4)
    close(ppo_kl, 0.5 / 4)  # kl_cov reports the mean |log ratio|
    close(clipfrac, 0.0)
    # gradient at token 3: (-A * r + 0.1 * (old - new)) / 4 -> (3 e^-.5 - 0.1) / 4
    close(grad_of(loss, new)[0, 3], (3 * math.exp(-0.5) - 0.1) / 4)


def test_geo_mean_clips_log_ratios_pessimistically_per_sequence() -> None:
    # seq 0, A = +1, log ratios .3, -.1 -> clipped to .2, -.1 (min of x and clamp): ratio e^{.05}
    # seq 1, A = -1, log ratios .1, -.5 -> the larger of x and clamp: .1, -.2: ratio e^{-.05}
    # loss per sequence -mean(A) * ratio, then the mean over sequences (a padded third token ignored)
    old = torch.zeros(2, 3, dtype=torch.float64)
    new = t([[0.3, -0.1, 9.0], [0.1, -0.5, 9.0]]).requires_grad_(True)
    adv = t([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]])
    mask = t([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    loss, clipfrac, ppo_kl, lower = compute_policy_loss_geo_mean(old, new, adv, mask, cliprange=0.2)
    close(loss, (-math.exp(0.05) + math.exp(-0.05)) / 2, atol=1e-7)
    close(clipfrac, 1 / 4)  # the .3 of seq 0
    close(lower, 1 / 4)  # the -.5 of seq 1
    close(ppo_kl, -(0.3 - 0.1 + 0.1 - 0.5) / 4)
    # only unclipped tokens move the ratio: seq 0 token 1: -1 * e^{.05} / 2 (mean over 2 tokens) / 2 seqs
    close(grad_of(loss, new), [[0.0, -math.exp(0.05) / 4, 0.0], [math.exp(-0.05) / 4, 0.0, 0.0]], atol=1e-7)


def test_dro_quadratic_log_ratio_penalty() -> None:
    old = t([[-1.0, -2.0]])
    new = t([[-0.5, -2.0]]).requires_grad_(True)
    adv, mask = t([[2.0, 1.0]]), t([[1.0, 1.0]])
    loss, _, ppo_kl, _ = compute_policy_loss_dro(old, new, adv, mask, dro_beta=0.5)
    # -(lp*A - beta/2 * (lp - old)^2): -(-1 - 0.25*0.25) and -(-2 - 0)
    close(loss, ((1 + 0.0625) + 2) / 2)
    close(ppo_kl, -0.5 / 2)
    # d/dlp: -A + beta * (lp - old) -> -2 + 0.25, -1
    close(grad_of(loss, new), [[(-2 + 0.25) / 2, -1 / 2]])
    with pytest.raises(ValueError, match="dro_beta"):
        compute_policy_loss_dro(old, new, adv, mask)


def test_cispo_weighs_log_prob_by_the_clipped_detached_ratio() -> None:
    old = torch.zeros(1, 3, dtype=torch.float64)
    new = torch.log(t([[1.5, 0.5, 1.1]])).requires_grad_(True)
    adv, mask = t([[1.0, 1.0, -1.0]]), t([[1.0, 1.0, 1.0]])
    loss, clipfrac, _, lower = compute_policy_loss_cispo(old, new, adv, mask, cliprange=0.2)
    # clipped ratios 1.2, 0.8, 1.1; loss -clip * A * log p
    close(loss, (-1.2 * math.log(1.5) - 0.8 * math.log(0.5) + 1.1 * math.log(1.1)) / 3)
    close(clipfrac, 2 / 3)
    close(lower, 0.0)
    # every token keeps a gradient, even the clipped ones
    close(grad_of(loss, new), [[-1.2 / 3, -0.8 / 3, 1.1 / 3]])


@pytest.mark.parametrize(
    "name", ["vanilla", "dppo_tv", "dppo_kl", "gspo", "sapo", "gpg", "clip_cov", "kl_cov", "geo_mean", "dro", "cispo"]
)
def test_every_verl_policy_loss_is_registered(name: str) -> None:
    assert get_policy_loss_fn(name).__name__.startswith("compute_policy_loss")
