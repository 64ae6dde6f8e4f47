"""Hand-worked checks of rlkube_trainer.algos against the semantics in notes/rl-algorithms.md (verl).

Every expected number below was derived by hand (the derivation is in the comments); nothing
re-runs the implementation's own formula.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch

from rlkube_trainer.algos import (
    AdaptiveKLController,
    FixedKLController,
    advantage,
    agg_loss,
    apply_kl_penalty,
    compute_entropy_loss,
    compute_gae_advantage_return,
    compute_grpo_outcome_advantage,
    compute_policy_loss,
    compute_policy_loss_gspo,
    compute_reinforce_plus_plus_outcome_advantage,
    compute_rloo_outcome_advantage,
    compute_value_loss,
    entropy_from_logits,
    get_adv_estimator_fn,
    get_kl_controller,
    get_policy_loss_fn,
    keep_mixed_groups,
    kl_penalty,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
    policy_loss,
    register_adv_est,
    register_policy_loss,
)

EPS = 1e-6  # GRPO's default epsilon


def t(x: Any) -> torch.Tensor:
    return torch.as_tensor(x, dtype=torch.float64)


def close(actual: Any, expected: Any) -> None:
    if isinstance(actual, torch.Tensor):
        expected = t(expected)
    torch.testing.assert_close(actual, expected, atol=1e-12, rtol=1e-12)


# --------------------------------------------------------------------------- helpers

X = [[1.0, 2.0, 3.0], [4.0, 5.0, 100.0]]
M = [[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]]


def test_masked_sum_and_mean_ignore_padding_even_inf() -> None:
    x = t(X)
    x[1, 2] = math.inf  # a padded log-prob can be -inf/inf; 0*inf would be NaN
    # 1+2+3+4+5 = 15 over 5 tokens
    close(masked_sum(x, t(M)), 15.0)
    close(masked_mean(x, t(M)), 3.0)
    # per row: [6/3, 9/2]
    close(masked_sum(x, t(M), dim=-1), [6.0, 9.0])
    close(masked_mean(x, t(M), dim=-1), [2.0, 4.5])
    # a boolean mask means the same thing
    close(masked_mean(x, t(M).bool()), 3.0)


def test_masked_mean_of_empty_mask_is_zero_not_nan() -> None:
    mask = t([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    close(masked_mean(t(X), mask, dim=-1), [1.5, 0.0])
    close(masked_mean(t(X), torch.zeros(2, 3, dtype=torch.float64)), 0.0)


def test_masked_var_biased_and_unbiased() -> None:
    # masked values 1..5, mean 3, squared deviations 4+1+0+1+4 = 10
    close(masked_var(t(X), t(M), unbiased=False), 10.0 / 5)
    close(masked_var(t(X), t(M)), 10.0 / 4)


def test_masked_var_unbiased_needs_two_entries() -> None:
    with pytest.raises(ValueError, match="at least 2"):
        masked_var(t([[1.0, 2.0]]), t([[1.0, 0.0]]))


def test_masked_whiten() -> None:
    # mean 3, unbiased var 2.5 -> (x - 3)/sqrt(2.5 + 1e-8); the padded 100 is transformed too
    s = math.sqrt(2.5 + 1e-8)
    expected = [[-2 / s, -1 / s, 0.0], [1 / s, 2 / s, 97 / s]]
    out = masked_whiten(t(X), t(M))
    close(out, expected)
    # shift_mean=False adds the mean (3) back
    close(masked_whiten(t(X), t(M), shift_mean=False), t(expected) + 3.0)
    close(masked_mean(out, t(M)), 0.0)


# --------------------------------------------------------------------------- GAE

# gamma = 0.5, lam = 0.5 (gamma*lam = 0.25). Row order: full, right-padded, masked middle token.
GAE_R = [[0.0, 0.0, 1.0], [0.0, 2.0, 0.0], [0.0, 7.0, 3.0]]
GAE_V = [[1.0, 2.0, 4.0], [1.0, 1.0, 5.0], [1.0, 9.0, 2.0]]
GAE_M = [[1.0, 1.0, 1.0], [1.0, 1.0, 0.0], [1.0, 0.0, 1.0]]
# row 0: t2 delta=1-4=-3, gae=-3; t1 delta=0+.5*4-2=0, gae=.25*-3=-.75; t0 delta=0+.5*2-1=0, gae=-.1875
# row 1: t2 masked -> nextvalue=0, lastgae=0, stored 0; t1 delta=2-1=1, gae=1;
#        t0 delta=0+.5*1-1=-.5, gae=-.5+.25*1=-.25
# row 2: t2 delta=3-2=1, gae=1; t1 masked -> passes through (nextvalue=2, lastgae=1, stored 1; the 7 and 9
#        are ignored); t0 delta=0+.5*2-1=0, gae=.25*1=.25
GAE_RAW = [[-0.1875, -0.75, -3.0], [-0.25, 1.0, 0.0], [0.25, 1.0, 1.0]]


def test_gae_returns_and_pass_through_over_masked_tokens() -> None:
    adv, ret = compute_gae_advantage_return(t(GAE_R), t(GAE_V), t(GAE_M), gamma=0.5, lam=0.5)
    # returns = raw advantages + values
    close(ret, [[0.8125, 1.25, 1.0], [0.75, 2.0, 5.0], [1.25, 10.0, 3.0]])
    # whitening over the 7 masked-in raw values: sum = -1.9375, sum of squares = 11.72265625
    mean = -1.9375 / 7
    var = (11.72265625 - 1.9375**2 / 7) / 6
    close(adv, (t(GAE_RAW) - mean) / math.sqrt(var + 1e-8))


def test_gae_gamma_lam_one_is_reward_to_go_minus_value() -> None:
    # gamma=lam=1, r=[0,1,2], v=[1,1,2]: raw adv_t = reward-to-go - v_t = [3-1, 3-1, 2-2]
    _, ret = compute_gae_advantage_return(t([[0.0, 1.0, 2.0]]), t([[1.0, 1.0, 2.0]]), t([[1, 1, 1]]), 1.0, 1.0)
    # returns = raw adv + v = reward-to-go [3, 3, 2]
    close(ret, [[3.0, 3.0, 2.0]])


# --------------------------------------------------------------------------- GRPO / RLOO

# scores (sum of token rewards): [1, 2, 0, 3, 5, 2]; groups a={1,0,2}, b={2,3}, c={5} (a group of one)
OUT_R = [
    [0.0, 0.0, 1.0],
    [0.0, 2.0, 0.0],
    [0.0, 0.0, 0.0],
    [3.0, 0.0, 0.0],
    [0.0, 5.0, 0.0],
    [0.0, 2.0, 0.0],
]
OUT_M = [
    [1.0, 1.0, 1.0],
    [1.0, 1.0, 0.0],
    [1.0, 1.0, 1.0],
    [1.0, 0.0, 0.0],
    [1.0, 1.0, 0.0],
    [1.0, 1.0, 1.0],
]
OUT_IDX = ["a", "b", "a", "b", "c", "a"]


def _broadcast(per_seq: list[float]) -> torch.Tensor:
    return t(per_seq).unsqueeze(-1) * t(OUT_M)


@pytest.mark.parametrize(
    "index",
    [OUT_IDX, np.array(OUT_IDX, dtype=object), torch.tensor([0, 1, 0, 1, 2, 0])],
    ids=["list", "numpy", "tensor"],
)
def test_grpo_normalized(index: Any) -> None:
    # a: mean 1, unbiased std sqrt((0+1+1)/2) = 1; b: mean 2.5, std sqrt(.25+.25) = sqrt(.5);
    # c: lone sample -> mean 0, std 1
    sb = math.sqrt(0.5) + EPS
    expected = [0.0, -0.5 / sb, -1 / (1 + EPS), 0.5 / sb, 5 / (1 + EPS), 1 / (1 + EPS)]
    adv, ret = compute_grpo_outcome_advantage(t(OUT_R), t(OUT_M), index)
    close(adv, _broadcast(expected))
    close(ret, adv)
    assert adv[3, 1:].abs().sum() == 0  # padding stays 0


def test_dr_grpo_only_subtracts_the_group_mean() -> None:
    adv, _ = compute_grpo_outcome_advantage(t(OUT_R), t(OUT_M), OUT_IDX, norm_adv_by_std_in_grpo=False)
    close(adv, _broadcast([0.0, -0.5, -1.0, 0.5, 5.0, 1.0]))


def test_grpo_all_equal_group_gives_zero() -> None:
    adv, _ = compute_grpo_outcome_advantage(t([[1.0], [1.0]]), t([[1.0], [1.0]]), [7, 7])
    close(adv, [[0.0], [0.0]])


def test_grpo_rejects_index_of_wrong_length() -> None:
    with pytest.raises(ValueError, match="index has 2 entries"):
        compute_grpo_outcome_advantage(t(OUT_R), t(OUT_M), ["a", "b"])


def test_rloo_leave_one_out() -> None:
    # a (n=3): s*3/2 - 1*3/2 -> [0, -1.5, 1.5] (= s_i minus the mean of the other two)
    # b (n=2): s*2 - 2.5*2 -> [-1, 1]; c (n=1) keeps 5
    adv, ret = compute_rloo_outcome_advantage(t(OUT_R), t(OUT_M), OUT_IDX)
    close(adv, _broadcast([0.0, -1.0, -1.5, 1.0, 5.0, 1.5]))
    close(ret, adv)


# --------------------------------------------------------------------------- REINFORCE++


def test_reinforce_plus_plus() -> None:
    # gamma = 0.5; verl 0.9.1: a masked token stores return 0 and passes the running return on.
    # row 0: R2=2, R1=0+.5*2=1, R0=1+.5*1=1.5
    # row 1 (right-padded, junk reward 9 on the pad): R2 stored 0, running stays 0; R1=4, R0=2
    # row 2 (masked middle, a tool span): R2=2; R1 stored 0, running stays 2; R0=1+.5*2=2
    rewards = t([[1.0, 0.0, 2.0], [0.0, 4.0, 9.0], [1.0, 0.0, 2.0]])
    mask = t([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0], [1.0, 0.0, 1.0]])
    adv, ret = compute_reinforce_plus_plus_outcome_advantage(rewards, mask, gamma=0.5)
    close(ret, [[1.5, 1.0, 2.0], [2.0, 4.0, 0.0], [2.0, 0.0, 2.0]])
    # masked-in returns 1.5,1,2,2,4,2,2: sum 14.5, sum of squares 35.25
    mean = 14.5 / 7
    std = math.sqrt((35.25 - 14.5**2 / 7) / 6 + 1e-8)
    expected = [
        [(1.5 - mean) / std, (1 - mean) / std, (2 - mean) / std],
        [(2 - mean) / std, (4 - mean) / std, 0.0],
        [(2 - mean) / std, 0.0, (2 - mean) / std],
    ]
    close(adv, expected)


# --------------------------------------------------------------------------- agg_loss

LOSS = [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]
LOSS_M = [[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]]


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("token-mean", (1 + 2 + 3 + 4) / 4),
        ("seq-mean-token-sum", (6 + 4) / 2),
        ("seq-mean-token-mean", (2 + 4) / 2),
        ("token-sum", 1 + 2 + 3 + 4),
        # verl 0.9.1: the mean over sequences of their sums, divided by the response length 3
        ("seq-mean-token-sum-norm", (6 + 4) / 2 / 3),
    ],
)
def test_agg_loss_modes(mode: str, expected: float) -> None:
    close(agg_loss(t(LOSS), t(LOSS_M), mode), expected)
    # an extra fully padded row (with junk) changes none of them
    loss = torch.cat([t(LOSS), t([[math.nan, 1e9, -1e9]])])
    mask = torch.cat([t(LOSS_M), t([[0.0, 0.0, 0.0]])])
    close(agg_loss(loss, mask, mode), expected)


def test_agg_loss_unknown_mode() -> None:
    with pytest.raises(ValueError, match="seq-mean-token-sum-norm"):
        agg_loss(t(LOSS), t(LOSS_M), "sum")


def test_agg_loss_scale_factor() -> None:
    # seq-mean-token-sum-norm with a constant: (6 + 4) / 2 / 10; other modes ignore it
    close(agg_loss(t(LOSS), t(LOSS_M), "seq-mean-token-sum-norm", loss_scale_factor=10), 0.5)
    close(agg_loss(t(LOSS), t(LOSS_M), "token-mean", loss_scale_factor=10), 2.5)


# --------------------------------------------------------------------------- policy loss

# tokens (ratio, A) with cliprange 0.2, clip_ratio_c 3:
#  (1.5, +1): l1=-1.5, l2=-1.2 -> clip1=-1.2, clipped                 -> -1.2
#  (0.5, +1): l1=-0.5, l2=-0.8 -> clip1=-0.5                          -> -0.5
#  (0.5, -1): l1=0.5,  l2=0.8  -> clip1=0.8, clipped; l3=3, min=0.8     ->  0.8
#  (4.0, -1): l1=4,    l2=1.2  -> clip1=4; l3=3 -> dual clip, lower     ->  3.0
#  (1.5, -2): l1=3,    l2=2.4  -> clip1=3; l3=6 -> 3                    ->  3.0
#  padding: ratio e^30 (clamped to e^20), A=-5, masked out
PG_RATIO = [[1.5, 0.5, 0.5], [4.0, 1.5, math.exp(30.0)]]
PG_ADV = [[1.0, 1.0, -1.0], [-1.0, -2.0, -5.0]]
PG_M = [[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]]


def _log(ratios: list[list[float]]) -> torch.Tensor:
    return torch.log(t(ratios))


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("token-mean", (-1.2 - 0.5 + 0.8 + 3 + 3) / 5),
        ("seq-mean-token-sum", ((-1.2 - 0.5 + 0.8) + (3 + 3)) / 2),
        ("seq-mean-token-mean", ((-1.2 - 0.5 + 0.8) / 3 + (3 + 3) / 2) / 2),
    ],
)
def test_policy_loss_clip_and_dual_clip(mode: str, expected: float) -> None:
    old = torch.zeros(2, 3, dtype=torch.float64)
    pg_loss, clipfrac, ppo_kl, clipfrac_lower = compute_policy_loss(
        old, _log(PG_RATIO), t(PG_ADV), t(PG_M), cliprange=0.2, loss_agg_mode=mode
    )
    close(pg_loss, expected)
    close(clipfrac, 2 / 5)  # tokens 1 and 3
    close(clipfrac_lower, 1 / 5)  # token 4 only
    # ppo_kl = mean(old - new) = -(2 log1.5 + 2 log.5 + log4)/5 = -2 log1.5 / 5
    close(ppo_kl, -2 * math.log(1.5) / 5)


def test_policy_loss_clip_higher() -> None:
    # (1.25, +1): with high=0.28 the ratio is inside -> -1.25, not clipped; with 0.2 -> -1.2, clipped
    # (0.75, -1): low=0.2 -> l1=0.75, l2=0.8 -> 0.8, clipped
    old = torch.zeros(1, 2, dtype=torch.float64)
    new, adv, mask = _log([[1.25, 0.75]]), t([[1.0, -1.0]]), t([[1.0, 1.0]])
    loss, clipfrac, _, lower = compute_policy_loss(old, new, adv, mask, cliprange_low=0.2, cliprange_high=0.28)
    close(loss, (-1.25 + 0.8) / 2)
    close(clipfrac, 0.5)
    close(lower, 0.0)
    # cliprange fills in whichever side is not given
    loss2, clipfrac2, _, _ = compute_policy_loss(old, new, adv, mask, cliprange=0.2, cliprange_high=0.28)
    close(loss2, (-1.25 + 0.8) / 2)
    close(clipfrac2, 0.5)
    loss3, clipfrac3, _, _ = compute_policy_loss(old, new, adv, mask, cliprange=0.2)
    close(loss3, (-1.2 + 0.8) / 2)
    close(clipfrac3, 1.0)


def test_policy_loss_gradient_is_zero_on_clipped_and_padded_tokens() -> None:
    old = torch.zeros(2, 3, dtype=torch.float64)
    new = _log(PG_RATIO).requires_grad_(True)
    pg_loss, *_ = compute_policy_loss(old, new, t(PG_ADV), t(PG_M), cliprange=0.2)
    (grad,) = torch.autograd.grad(pg_loss, new)
    # unclipped tokens: d(-A*ratio)/dlogp / 5 = -A*ratio/5; clipped, dual-clipped and padded tokens: 0
    close(grad, [[0.0, -0.5 / 5, 0.0], [0.0, 2 * 1.5 / 5, 0.0]])


def test_policy_loss_checks_arguments() -> None:
    z = torch.zeros(1, 1, dtype=torch.float64)
    with pytest.raises(AssertionError, match="clip_ratio_c"):
        compute_policy_loss(z, z, z, z + 1, cliprange=0.2, clip_ratio_c=1.0)
    with pytest.raises(ValueError, match="cliprange"):
        compute_policy_loss(z, z, z, z + 1, cliprange_low=0.2)


# GSPO: one ratio per sequence, the geometric mean of its token ratios.
#  seq 1: token ratios 2, 0.5, 1 -> s = (2*0.5*1)^(1/3) = 1; A=+1: every token -1 (inside the clip)
#  seq 2: token ratios 1.21, 1 (a padded token with log-ratio 50 masked out) -> s = 1.21^(1/2) = 1.1;
#         A=+1, clip 0.05: l1 = -1.1, l2 = -1.05 -> -1.05 on both tokens, clipped
# seq-mean-token-mean: ((-1-1-1)/3 + (-1.05-1.05)/2) / 2 = -1.025; token-mean (verl 0.9.1 honours
# loss_agg_mode): (-1-1-1-1.05-1.05) / 5 = -1.02.
# The vanilla loss would instead clip seq 1's tokens with ratios 2 and 0.5 one by one.
GSPO_LOG_RATIO = [[math.log(2.0), math.log(0.5), 0.0], [math.log(1.21), 0.0, 50.0]]
GSPO_M = [[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]]
GSPO_ADV = [[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]]


@pytest.mark.parametrize(
    ("mode", "expected", "token_weight"),
    [("seq-mean-token-mean", ((-1 - 1 - 1) / 3 + (-1.05 - 1.05) / 2) / 2, 1 / 6), ("token-mean", -5.1 / 5, 1 / 5)],
)
def test_gspo_sequence_level_ratio(mode: str, expected: float, token_weight: float) -> None:
    old = torch.zeros(2, 3, dtype=torch.float64)
    new = t(GSPO_LOG_RATIO).requires_grad_(True)
    pg_loss, clipfrac, ppo_kl, lower = compute_policy_loss_gspo(
        old, new, t(GSPO_ADV), t(GSPO_M), cliprange=0.05, loss_agg_mode=mode
    )
    close(pg_loss, expected)
    close(clipfrac, 2 / 5)  # seq 2's two tokens
    close(lower, 0.0)  # no dual clip in GSPO
    # ppo_kl is the token-level masked mean of old - new: -(log2 + log.5 + log1.21) / 5
    close(ppo_kl, -math.log(1.21) / 5)
    # Gradient: each token of an unclipped sequence gets -A * s_i times its weight in the
    # aggregation (seq-mean-token-mean: 1/3 of 1/2; token-mean: 1/5); clipped and padded tokens get none.
    (grad,) = torch.autograd.grad(pg_loss, new)
    w = -token_weight
    close(grad, [[w, w, w], [0.0, 0.0, 0.0]])


def test_gspo_clip_higher_and_checks() -> None:
    # seq 2 of the example with low 0.05 and high 0.2: s = 1.1 is inside -> -1.1, not clipped
    old = torch.zeros(1, 2, dtype=torch.float64)
    new = t([[math.log(1.21), 0.0]])
    loss, clipfrac, _, _ = compute_policy_loss_gspo(
        old, new, t([[1.0, 1.0]]), t([[1.0, 1.0]]), cliprange_low=0.05, cliprange_high=0.2
    )
    close(loss, -1.1)
    close(clipfrac, 0.0)
    with pytest.raises(ValueError, match="cliprange"):
        compute_policy_loss_gspo(old, new, old, old + 1, cliprange_low=0.2)


def test_keep_mixed_groups_drops_groups_that_all_score_alike() -> None:
    # groups: a = {1, 1} (alike), b = {0, 1} (mixed), c = {0.5} (one sample: kept, as in verl),
    # d = {2, 2, 2} (alike)
    metric = [1.0, 1.0, 0.0, 1.0, 0.5, 2.0, 2.0, 2.0]
    index = ["a", "a", "b", "b", "c", "d", "d", "d"]
    assert keep_mixed_groups(metric, index) == [False, False, True, True, True, False, False, False]
    assert keep_mixed_groups(metric, torch.tensor([0, 0, 1, 1, 2, 3, 3, 3])) == keep_mixed_groups(metric, index)


# --------------------------------------------------------------------------- value loss


def test_value_loss_clipping() -> None:
    # cliprange_value 0.5; (vpred, value, R):
    #  (1, 0, 2): vclip=.5, (1-2)^2=1 < (.5-2)^2=2.25 -> 2.25, clipped
    #  (1, 0, 0): vclip=.5, 1 > .25 -> 1
    #  (.2, 0, 1): inside the range -> .64 both
    #  padding (100, 0, -100) masked out
    vpreds, values = t([[1.0, 1.0], [0.2, 100.0]]), t([[0.0, 0.0], [0.0, 0.0]])
    returns, mask = t([[2.0, 0.0], [1.0, -100.0]]), t([[1.0, 1.0], [1.0, 0.0]])
    vf_loss, vf_clipfrac = compute_value_loss(vpreds, returns, values, mask, cliprange_value=0.5)
    close(vf_loss, 0.5 * (2.25 + 1.0 + 0.64) / 3)
    close(vf_clipfrac, 1 / 3)
    vf_loss_seq, _ = compute_value_loss(vpreds, returns, values, mask, 0.5, "seq-mean-token-mean")
    close(vf_loss_seq, 0.5 * ((2.25 + 1.0) / 2 + 0.64) / 2)


# --------------------------------------------------------------------------- entropy


def test_entropy_of_uniform_is_log_vocab() -> None:
    logits = torch.full((2, 3, 7), 3.7, dtype=torch.float64)
    close(entropy_from_logits(logits), [[math.log(7)] * 3] * 2)


def test_entropy_known_distribution_and_large_logits() -> None:
    # p = (1/2, 1/4, 1/4): H = .5 log2 + 2 * .25 log4 = 1.5 log2
    close(entropy_from_logits(torch.log(t([0.5, 0.25, 0.25]))), 1.5 * math.log(2))
    # naive exp would overflow; two equal huge logits -> log 2
    close(entropy_from_logits(t([1000.0, 1000.0])), math.log(2))


def test_entropy_loss_aggregates() -> None:
    ent, mask = t([[1.0, 2.0], [3.0, 4.0]]), t([[1.0, 1.0], [1.0, 0.0]])
    close(compute_entropy_loss(ent, mask, "token-mean"), 2.0)  # (1+2+3)/3
    close(compute_entropy_loss(ent, mask, "seq-mean-token-mean"), 2.25)  # (1.5+3)/2


# --------------------------------------------------------------------------- KL

# d = lp - ref per token: 1, -1.5, -30 (low_var_kl clamps high), 30 (clamps k at -20, result at 10)
KL_LP = [-1.0, -2.0, -30.0, 0.0]
KL_REF = [-2.0, -0.5, 0.0, -30.0]


@pytest.mark.parametrize(
    ("names", "expected"),
    [
        (("kl", "k1"), [1.0, -1.5, -30.0, 30.0]),
        (("abs",), [1.0, 1.5, 30.0, 30.0]),
        (("mse", "k2"), [0.5, 1.125, 450.0, 450.0]),
        # k = ref - lp: -1 -> e^-1 + 1 - 1 = e^-1; 1.5 -> e^1.5 - 2.5; 30 -> 20 -> e^20-21 -> 10;
        # -30 -> -20 -> e^-20 + 19 -> 10
        (("low_var_kl", "k3"), [math.exp(-1.0), math.exp(1.5) - 2.5, 10.0, 10.0]),
    ],
)
def test_kl_penalty_types(names: tuple[str, ...], expected: list[float]) -> None:
    for name in names:
        close(kl_penalty(t(KL_LP), t(KL_REF), name), expected)
        # verl's straight-through variant: the same value, and k2's gradient lp - ref
        lp = t(KL_LP).requires_grad_(True)
        value = kl_penalty(lp, t(KL_REF), name + "+")
        close(value, expected)
        (grad,) = torch.autograd.grad(value.sum(), lp)
        close(grad, [1.0, -1.5, -30.0, 30.0])


def test_kl_penalty_unknown() -> None:
    with pytest.raises(ValueError, match="low_var_kl"):
        kl_penalty(t(KL_LP), t(KL_REF), "full")
    with pytest.raises(ValueError, match="low_var_kl"):
        kl_penalty(t(KL_LP), t(KL_REF), "full+")


def test_fixed_kl_controller() -> None:
    ctrl = FixedKLController(0.001)
    ctrl.update(current_kl=5.0, n_steps=100)
    assert ctrl.value == 0.001
    other = FixedKLController(0.5)
    other.load_state_dict(ctrl.state_dict())
    assert other.value == 0.001


def test_adaptive_kl_controller_arithmetic() -> None:
    ctrl = AdaptiveKLController(init_kl_coef=0.1, target_kl=0.05, horizon=100)
    # err = .06/.05 - 1 = .2 -> value *= 1 + .2*10/100 = 1.02
    ctrl.update(current_kl=0.06, n_steps=10)
    close(ctrl.value, 0.102)
    # err = 10 - 1 = 9, clipped to .2 -> *1.02
    ctrl.update(current_kl=0.5, n_steps=10)
    close(ctrl.value, 0.10404)
    # err = -1, clipped to -.2 -> *(1 - .2*50/100) = *.9
    ctrl.update(current_kl=0.0, n_steps=50)
    close(ctrl.value, 0.093636)
    # err = .9 - 1 = -.1 -> *(1 - .1*20/100) = *.98
    ctrl.update(current_kl=0.045, n_steps=20)
    close(ctrl.value, 0.09176328)


def test_adaptive_kl_controller_state_round_trip() -> None:
    a = AdaptiveKLController(0.1, 0.05, 100)
    a.update(0.06, 10)
    b = AdaptiveKLController(0.1, 0.05, 100)
    b.load_state_dict(a.state_dict())
    assert b.value == a.value == pytest.approx(0.102, rel=1e-12)
    a.update(0.5, 10)
    b.update(0.5, 10)
    assert b.value == a.value


def test_get_kl_controller() -> None:
    fixed = get_kl_controller("fixed", kl_coef=0.001)
    assert isinstance(fixed, FixedKLController)
    assert fixed.value == 0.001
    adaptive = get_kl_controller("adaptive", kl_coef=0.2, target_kl=6.0, horizon=10000)
    assert isinstance(adaptive, AdaptiveKLController)
    assert (adaptive.value, adaptive.target, adaptive.horizon) == (0.2, 6.0, 10000.0)
    with pytest.raises(ValueError, match="target_kl and horizon"):
        get_kl_controller("adaptive", kl_coef=0.2)
    with pytest.raises(ValueError, match="must be > 0"):
        get_kl_controller("adaptive", kl_coef=0.2, target_kl=6.0, horizon=0)
    with pytest.raises(ValueError, match="fixed, adaptive"):
        get_kl_controller("pid", kl_coef=0.2)


class _RecordingController:
    def __init__(self, value: float) -> None:
        self.value = value
        self.calls: list[tuple[float, int]] = []

    def update(self, current_kl: float, n_steps: int) -> None:
        self.calls.append((current_kl, n_steps))


def test_apply_kl_penalty() -> None:
    scores = t([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]])
    old = t([[-1.0, -2.0, -1.0], [-1.0, -1.0, -math.inf]])  # the pad's -inf must not leak
    ref = t([[-2.0, -1.0, -1.0], [-1.5, -1.0, 0.0]])
    mask = t([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    # kl = old - ref = [[1, -1, 0], [.5, 0, (masked) 0]]; beta = .1
    ctrl = _RecordingController(0.1)
    rewards, metrics = apply_kl_penalty(scores, old, ref, mask, ctrl, "kl")
    close(rewards, [[-0.1, 0.1, 1.0], [-0.05, 2.0, 0.0]])
    # per-row masked means [0/3, .5/2] averaged over the batch = .125
    assert metrics["actor/reward_kl_penalty"] == pytest.approx(0.125, rel=1e-12)
    assert metrics["actor/reward_kl_penalty_coeff"] == 0.1
    assert len(ctrl.calls) == 1
    current_kl, n_steps = ctrl.calls[0]
    assert current_kl == pytest.approx(0.125, rel=1e-12)
    assert n_steps == 2  # the batch size

    # with the adaptive controller: err = .125/.1 - 1 = .25 -> .2; value *= 1 + .2*2/20; metric has the old beta
    adaptive = AdaptiveKLController(0.1, target_kl=0.1, horizon=20)
    _, metrics = apply_kl_penalty(scores, old, ref, mask, adaptive, "kl")
    assert metrics["actor/reward_kl_penalty_coeff"] == 0.1
    close(adaptive.value, 0.102)


# --------------------------------------------------------------------------- registries


def test_adv_estimator_registry() -> None:
    assert get_adv_estimator_fn("gae") is compute_gae_advantage_return
    assert get_adv_estimator_fn("grpo") is compute_grpo_outcome_advantage
    assert get_adv_estimator_fn("rloo") is compute_rloo_outcome_advantage
    assert get_adv_estimator_fn("reinforce_plus_plus") is compute_reinforce_plus_plus_outcome_advantage
    with pytest.raises(
        ValueError, match=r"unknown advantage estimator 'ppo'.*gae, gdpo, gpg, grpo, grpo_passk, grpo_vectorized"
    ):
        get_adv_estimator_fn("ppo")


def test_policy_loss_registry() -> None:
    assert get_policy_loss_fn("vanilla") is compute_policy_loss
    assert get_policy_loss_fn("gspo") is compute_policy_loss_gspo
    with pytest.raises(ValueError, match=r"unknown policy loss 'ppo'.*gspo.*vanilla"):
        get_policy_loss_fn("ppo")


def test_registering_new_entries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(advantage, "ADV_ESTIMATOR_REGISTRY", dict(advantage.ADV_ESTIMATOR_REGISTRY))
    monkeypatch.setattr(policy_loss, "POLICY_LOSS_REGISTRY", dict(policy_loss.POLICY_LOSS_REGISTRY))

    @register_adv_est("mine")
    def mine(token_level_rewards: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return token_level_rewards, token_level_rewards

    @register_policy_loss("mine")
    def my_loss(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        return x, x, x, x

    assert get_adv_estimator_fn("mine") is mine
    assert get_policy_loss_fn("mine") is my_loss
    register_adv_est("mine")(mine)  # re-registering the same function is harmless
    with pytest.raises(ValueError, match="already registered"):
        register_adv_est("grpo")(mine)
    with pytest.raises(ValueError, match="already registered"):
        register_policy_loss("vanilla")(my_loss)
