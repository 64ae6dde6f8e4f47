"""Rollout correction (verl 0.9.1's algorithm.rollout_correction) on numbers worked by hand:
truncation (TIS), IcePop's bounds, sequence weights, batch normalisation, rejection sampling,
the off-policy metrics, padding masked out everywhere, and the bypass losses."""

from __future__ import annotations

import math

import pytest
import torch
from pydantic import ValidationError

from rlkube_api.config import RolloutCorrectionConfig
from rlkube_trainer.algos import compute_policy_loss
from rlkube_trainer.algos.rollout_correction import (
    bypass_policy_loss,
    compute_offpolicy_metrics,
    compute_rollout_correction_and_rejection_mask,
    compute_rollout_correction_weights,
    compute_rollout_rejection_mask,
)

# Two responses; the second's last token is padding. Ratios pi_train/pi_rollout: 3, 0.5 | 1.5, pad.
# The padded log-ratio is huge: it must not reach any weight or metric.
MASK = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
LOG_RATIO = torch.tensor([[math.log(3.0), math.log(0.5)], [math.log(1.5), 50.0]])


def test_token_weights_are_truncated_at_the_upper_bound() -> None:
    weights, m = compute_rollout_correction_weights(LOG_RATIO, MASK, "token", "2.0")
    torch.testing.assert_close(weights, torch.tensor([[2.0, 0.5], [1.5, 0.0]]))
    assert m["rollout_is_mean"] == pytest.approx(4 / 3)
    assert m["rollout_is_max"] == pytest.approx(2.0)
    assert m["rollout_is_min"] == pytest.approx(0.5)
    assert m["rollout_is_ratio_fraction_high"] == pytest.approx(1 / 3)  # the raw 3 only
    assert m["rollout_is_ratio_fraction_low"] == pytest.approx(0.0)  # 0.5 is not below 1/2.0
    assert m["rollout_is_seq_mean"] == pytest.approx((1.25 + 1.5) / 2)
    assert m["rollout_is_seq_max_deviation"] == pytest.approx(0.5)
    assert m["rollout_is_seq_fraction_high"] == pytest.approx(0.0)  # raw means 1.75 and 1.5
    # ESS = 1 / mean((w / mean w)^2) = 1 / mean(1.5^2, 0.375^2, 1.125^2)
    assert m["rollout_is_eff_sample_size"] == pytest.approx(1 / ((2.25 + 0.140625 + 1.265625) / 3), rel=1e-5)
    assert not weights.requires_grad


def test_icepop_zeroes_weights_outside_its_bounds() -> None:
    weights, m = compute_rollout_correction_weights(LOG_RATIO, MASK, "token", "0.6_2.0")
    torch.testing.assert_close(weights, torch.tensor([[0.0, 0.0], [1.5, 0.0]]))
    assert m["rollout_is_oob_ratio"] == pytest.approx(2 / 3)
    assert m["rollout_is_ratio_fraction_low"] == pytest.approx(1 / 3)  # 0.5 < 0.6


def test_sequence_weights_are_the_product_and_batch_normalised_per_sequence() -> None:
    log_ratio = torch.tensor([[math.log(3.0), math.log(2.0)], [math.log(1.5), 50.0]])
    weights, m = compute_rollout_correction_weights(log_ratio, MASK, "sequence", "2.0", rollout_is_batch_normalize=True)
    # Products 6 (truncated to 2) and 1.5; normalised by the mean of the sequence weights, 1.75.
    torch.testing.assert_close(weights, torch.tensor([[2 / 1.75, 2 / 1.75], [1.5 / 1.75, 0.0]]))
    assert m["rollout_is_batch_norm_factor"] == pytest.approx(1.75)
    assert m["rollout_is_max"] == pytest.approx(6.0)  # the raw sequence ratio, from log space
    assert m["rollout_is_ratio_fraction_high"] == pytest.approx(0.5)


def test_token_k1_rejection_keeps_ratios_inside_the_bounds() -> None:
    mask, m = compute_rollout_rejection_mask(LOG_RATIO, MASK, "token_k1", "0.5_2.0")
    torch.testing.assert_close(mask, torch.tensor([[0.0, 1.0], [1.0, 0.0]]))
    assert m["rollout_rs_masked_fraction"] == pytest.approx(1 / 3)
    assert m["rollout_rs_seq_masked_fraction"] == pytest.approx(0.5)
    assert m["rollout_rs_token_k1_mean"] == pytest.approx(-(math.log(3) + math.log(0.5) + math.log(1.5)) / 3)


def test_sequence_rejection_drops_whole_sequences_and_criteria_combine() -> None:
    # k3 = e^r - 1 - r: sequence 1's mean (0.9014 + 0.1931) / 2 = 0.547 > 0.3; sequence 2's 0.0945.
    mask, m = compute_rollout_rejection_mask(LOG_RATIO, MASK, "seq_mean_k3", "0.3")
    torch.testing.assert_close(mask, torch.tensor([[0.0, 0.0], [1.0, 0.0]]))
    k3 = [3 - 1 - math.log(3), 0.5 - 1 - math.log(0.5)]
    assert m["rollout_rs_seq_mean_k3_max"] == pytest.approx(sum(k3) / 2, rel=1e-5)
    assert m["rollout_rs_seq_mean_k3_seq_masked_fraction"] == pytest.approx(0.5)
    # Both criteria must pass; a k1 option given one number takes 1/x as its lower bound.
    mask, m = compute_rollout_rejection_mask(LOG_RATIO, MASK, "token_k1,seq_mean_k3", "1.6,1.0")
    torch.testing.assert_close(mask, torch.tensor([[0.0, 0.0], [1.0, 0.0]]))
    assert m["rollout_rs_token_k1_masked_fraction"] == pytest.approx(2 / 3)  # 3 and 0.5 outside [1/1.6, 1.6]
    assert m["rollout_rs_seq_mean_k3_masked_fraction"] == pytest.approx(0.0)


def test_offpolicy_metrics() -> None:
    old = torch.tensor([[-1.0, -2.0], [-0.5, -9.0]])
    rollout = torch.tensor([[-1.5, -2.0], [-1.0, 0.0]])
    m = compute_offpolicy_metrics(old, rollout, MASK)
    assert m["kl"] == pytest.approx((-0.5 + 0.0 - 0.5) / 3)
    assert m["training_log_ppl"] == pytest.approx((1.5 + 0.5) / 2)
    assert m["rollout_log_ppl"] == pytest.approx((1.75 + 1.0) / 2)
    assert m["log_ppl_diff"] == pytest.approx((-0.25 + -0.5) / 2)
    assert m["chi2_token"] == pytest.approx((math.e + 1 + math.e) / 3 - 1, rel=1e-5)
    assert m["chi2_seq"] == pytest.approx((math.exp(1.0) + math.exp(1.0)) / 2 - 1, rel=1e-5)


def test_the_whole_correction_is_prefixed_and_rejection_needs_no_weights() -> None:
    old = torch.tensor([[0.0, 0.0], [0.0, 0.0]])
    rollout = -LOG_RATIO
    config = RolloutCorrectionConfig(rollout_rs="token_k1", rollout_rs_threshold="0.5_2.0")
    weights, mask, m = compute_rollout_correction_and_rejection_mask(old, rollout, MASK, config)
    assert weights is None
    torch.testing.assert_close(mask, torch.tensor([[0.0, 1.0], [1.0, 0.0]]))
    assert all(k.startswith("rollout_corr/") for k in m)
    assert "rollout_corr/rollout_rs_masked_fraction" in m and "rollout_corr/k3_kl" in m


def test_weights_scale_each_tokens_policy_loss() -> None:
    old = torch.zeros(2, 2)
    log_prob = torch.tensor([[0.1, 0.1], [0.1, 0.1]])
    advantages = torch.tensor([[1.0, 1.0], [1.0, 1.0]])
    weights = torch.tensor([[2.0, 0.5], [1.5, 0.0]])
    loss, *_ = compute_policy_loss(old, log_prob, advantages, MASK, 0.2, rollout_is_weights=weights)
    # ratio e^0.1 = 1.105 inside the clip: token losses -1.105 * w, token-mean over 3 tokens.
    assert loss.item() == pytest.approx(-math.exp(0.1) * (2.0 + 0.5 + 1.5) / 3, rel=1e-6)


def test_bypass_reinforce_weights_log_prob_and_ppo_clip_uses_the_engines_ratio() -> None:
    rollout = torch.zeros(2, 2)
    log_prob = LOG_RATIO.clone().requires_grad_(True)  # current vs engine: the ratios above
    advantages = torch.tensor([[1.0, 1.0], [-1.0, -1.0]])
    config = RolloutCorrectionConfig(rollout_is="token", bypass_mode=True, loss_type="reinforce")
    loss, _, _, _, m = bypass_policy_loss(
        config, rollout, log_prob, advantages, MASK, 0.2, None, None, 3.0, "token-mean"
    )
    expected = -(2.0 * math.log(3.0) + 0.5 * math.log(0.5) - 1.5 * math.log(1.5)) / 3
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    loss.backward()
    assert log_prob.grad is not None  # the weights are constants: d/dlogp = -A*w/3
    torch.testing.assert_close(log_prob.grad, torch.tensor([[-2.0, -0.5], [1.5, 0.0]]) / 3)
    assert m["rollout_corr/rollout_is_mean"] == pytest.approx(4 / 3)

    clip = RolloutCorrectionConfig(rollout_is="token", bypass_mode=True)
    loss, *_ = bypass_policy_loss(clip, rollout, LOG_RATIO, advantages, MASK, 0.2, None, None, 3.0, "token-mean")
    plain, *_ = compute_policy_loss(rollout, LOG_RATIO, advantages, MASK, 0.2)
    assert loss.item() == pytest.approx(plain.item())  # no weights on top of the clipped ratio


@pytest.mark.parametrize(
    ("fields", "names"),
    [
        ({"rollout_is_threshold": "abc"}, "rollout_is_threshold"),
        ({"rollout_is_threshold": "3_2"}, "rollout_is_threshold"),
        ({"rollout_rs": "token_k4", "rollout_rs_threshold": "2"}, "rollout_rs"),
        ({"rollout_rs": "seq_mean_k3"}, "rolloutRsThreshold"),
        ({"rollout_rs": "seq_mean_k3", "rollout_rs_threshold": "0.5_2"}, "seq_mean_k3"),
        ({"rollout_rs": "token_k1,seq_max_k2", "rollout_rs_threshold": "1,2,3"}, "rollout_rs_threshold"),
        ({"loss_type": "dpo"}, "loss_type"),
    ],
)
def test_bad_settings_are_refused_by_name(fields: dict[str, str], names: str) -> None:
    with pytest.raises(ValidationError, match=names):
        RolloutCorrectionConfig(**fields)  # type: ignore[arg-type]
