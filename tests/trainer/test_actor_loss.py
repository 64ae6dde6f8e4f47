"""Where the actor's loss is assembled (`roles.actor.actor_loss`): policy loss − entropy
bonus + KL loss, checked on numbers worked by hand."""

from __future__ import annotations

import math

import pytest
import torch

from rlkube_api.config import ActorConfig
from rlkube_trainer.algos import get_policy_loss_fn
from rlkube_trainer.batch import TrainBatch
from rlkube_trainer.workers.actor import actor_loss


def micro_batch() -> TrainBatch:
    """Two responses of two tokens; the second response's last token is padding."""
    response_mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    batch = TrainBatch(
        input_ids=torch.zeros(2, 3, dtype=torch.long),
        attention_mask=torch.ones(2, 3, dtype=torch.long),
        responses=torch.zeros(2, 2, dtype=torch.long),
        response_mask=response_mask,
        group_index=torch.tensor([0, 0]),
        prompt_lengths=torch.tensor([1, 1]),
    )
    batch.old_log_probs = torch.tensor([[-1.0, -1.0], [-1.0, -1.0]])
    batch.advantages = torch.tensor([[1.0, 1.0], [-1.0, -1.0]])
    batch.ref_log_probs = torch.tensor([[-1.0, -1.0], [-1.0, -1.0]])
    return batch


# New log-probs: ratio e^0.1 (inside the clip) for the first response, e^-0.5 (clipped at 0.8) for
# the second, whose advantage is negative.
LOG_PROB = torch.tensor([[-0.9, -0.9], [-1.5, -1.5]])
ENTROPY = torch.tensor([[2.0, 4.0], [3.0, 100.0]])  # the padded position must not count


def hand_worked(entropy_coeff: float, kl_coef: float) -> float:
    r1, r2 = math.exp(0.1), math.exp(-0.5)
    # PPO clip, per token: -A * ratio vs -A * clip(ratio, 0.8, 1.2); the larger (pessimistic) one.
    token_1 = max(-1.0 * r1, -1.0 * min(max(r1, 0.8), 1.2))  # -e^0.1
    token_2 = max(1.0 * r2, 1.0 * min(max(r2, 0.8), 1.2))  # 0.8 (clipped)
    pg_loss = (2 * token_1 + token_2) / 3  # token-mean over the three response tokens
    entropy = (2.0 + 4.0 + 3.0) / 3
    # low_var_kl (k3) with ref - logp = d: e^d - d - 1 per token; d = -0.1 twice, +0.5 once.
    kl = (2 * (math.exp(-0.1) + 0.1 - 1) + (math.exp(0.5) - 0.5 - 1)) / 3
    return pg_loss - entropy_coeff * entropy + kl_coef * kl


@pytest.mark.parametrize(
    ("entropy_coeff", "use_kl_loss", "kl_coef"),
    [(0.0, False, 0.0), (0.01, False, 0.0), (0.0, True, 0.1), (0.01, True, 0.1)],
    ids=["policy", "policy-entropy", "policy+kl", "policy-entropy+kl"],
)
def test_the_loss_is_policy_minus_entropy_plus_kl(entropy_coeff: float, use_kl_loss: bool, kl_coef: float) -> None:
    config = ActorConfig(
        entropy_coeff=entropy_coeff, use_kl_loss=use_kl_loss, kl_loss_coef=kl_coef, kl_loss_type="low_var_kl"
    )
    entropy = ENTROPY if entropy_coeff else None
    loss, metrics = actor_loss(config, get_policy_loss_fn("vanilla"), micro_batch(), LOG_PROB, entropy)
    assert loss.item() == pytest.approx(hand_worked(entropy_coeff, kl_coef if use_kl_loss else 0.0), abs=1e-6)
    assert metrics["actor/pg_loss"] == pytest.approx(hand_worked(0.0, 0.0), abs=1e-6)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(1 / 3)  # one of three tokens clipped
    assert ("actor/entropy" in metrics) == bool(entropy_coeff)
    assert ("actor/kl_loss" in metrics) == use_kl_loss
    if use_kl_loss:
        assert metrics["actor/kl_coef"] == kl_coef


def test_the_loss_carries_gradients_to_the_log_probs() -> None:
    log_prob = LOG_PROB.clone().requires_grad_(True)
    loss, _ = actor_loss(ActorConfig(), get_policy_loss_fn("vanilla"), micro_batch(), log_prob, None)
    loss.backward()
    assert log_prob.grad is not None
    # Clipped and padded tokens get no gradient; the unclipped ones get -A * ratio / 3.
    expected = torch.tensor([[-math.exp(0.1) / 3, -math.exp(0.1) / 3], [0.0, 0.0]])
    assert torch.allclose(log_prob.grad, expected, atol=1e-6)


def test_each_loss_gets_its_own_settings_from_the_config() -> None:
    # dro: -(lp*A - beta/2 (lp - old)^2) per token, token-mean over the three response tokens;
    # the log ratios are 0.1, 0.1 (A = +1) and -0.5 (A = -1).
    config = ActorConfig(policy_loss="dro", dro_beta=0.4)
    loss, metrics = actor_loss(config, get_policy_loss_fn("dro"), micro_batch(), LOG_PROB, None)
    tokens = [-(-0.9 - 0.2 * 0.01), -(-0.9 - 0.2 * 0.01), -(1.5 - 0.2 * 0.25)]
    assert loss.item() == pytest.approx(sum(tokens) / 3, rel=1e-6)
    assert metrics["actor/pg_clipfrac"] == 0.0

    # sapo: the taus come from actor.tau_pos / tau_neg (a gate of slope 1 at ratio 1 either way)
    def gate(r: float, tau: float) -> float:
        return 1 / (1 + math.exp(-tau * (r - 1))) * 4 / tau

    config = ActorConfig(policy_loss="sapo", tau_pos=2.0, tau_neg=3.0)
    loss, _ = actor_loss(config, get_policy_loss_fn("sapo"), micro_batch(), LOG_PROB, None)
    row_1 = -gate(math.exp(0.1), 2.0)  # both tokens alike
    row_2 = gate(math.exp(-0.5), 3.0)  # one token
    assert loss.item() == pytest.approx((row_1 + row_2) / 2, rel=1e-6)  # always seq-mean-token-mean


def test_seq_mean_token_sum_norm_divides_by_the_configured_factor() -> None:
    # vanilla, per-token losses -e^0.1, -e^0.1 and 0.8: sequence sums -2e^0.1 and 0.8, mean over
    # the 2 sequences, divided by loss_scale_factor 10 (default: the response length 2)
    for factor, divisor in ((10, 10.0), (None, 2.0)):
        config = ActorConfig(loss_agg_mode="seq-mean-token-sum-norm", loss_scale_factor=factor)
        loss, _ = actor_loss(config, get_policy_loss_fn("vanilla"), micro_batch(), LOG_PROB, None)
        assert loss.item() == pytest.approx((-2 * math.exp(0.1) + 0.8) / 2 / divisor, rel=1e-6)
