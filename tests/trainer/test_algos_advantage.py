"""Hand-worked checks of verl 0.9.1's further advantage estimators (rlkube_trainer.algos.advantage_*).

Expected numbers are derived in the comments, or from a few lines of plain Python (statistics),
never by calling the estimator under test.
"""

from __future__ import annotations

import enum
import math
import statistics
from typing import Any

import pytest
import torch

from rlkube_trainer.algos import (
    AdvantageEstimator,
    compute_gdpo_outcome_advantage,
    compute_gpg_outcome_advantage,
    compute_grpo_outcome_advantage,
    compute_grpo_passk_outcome_advantage,
    compute_multi_turn_optimal_token_baseline_advantage,
    compute_opo_outcome_advantage,
    compute_optimal_token_baseline_advantage,
    compute_reinforce_plus_plus_baseline_outcome_advantage,
    compute_remax_outcome_advantage,
    compute_rloo_vectorized_outcome_advantage,
    get_adv_estimator_fn,
    register_adv_est,
)
from rlkube_trainer.algos import advantage as advantage_module

EPS = 1e-6


def t(x: Any) -> torch.Tensor:
    return x.to(torch.float64) if isinstance(x, torch.Tensor) else torch.tensor(x, dtype=torch.float64)


def close(actual: Any, expected: Any, atol: float = 1e-12) -> None:
    torch.testing.assert_close(actual, t(expected) if isinstance(actual, torch.Tensor) else expected, atol=atol, rtol=0)


def test_reinforce_plus_plus_baseline_subtracts_group_mean_then_whitens_tokens() -> None:
    # row 0 (group a): score 1, two tokens; row 1 (group a): score 3 on a token after a masked
    # tool span; row 2 (alone): score 2 keeps it (mean 0).
    rewards = t([[0.0, 1.0, 0.0], [0.0, 0.0, 3.0], [0.0, 0.0, 2.0]])
    mask = t([[1.0, 1.0, 0.0], [1.0, 0.0, 1.0], [1.0, 1.0, 1.0]])
    adv, ret = compute_reinforce_plus_plus_baseline_outcome_advantage(rewards, mask, ["a", "a", "b"])
    # group a mean 2: -1, +1; on the 7 response tokens: -1,-1, 1,1, 2,2,2
    tokens = [-1.0, -1.0, 1.0, 1.0, 2.0, 2.0, 2.0]
    mean, std = statistics.mean(tokens), math.sqrt(statistics.variance(tokens) + 1e-8)
    a, b, c = ((v - mean) / std for v in (-1.0, 1.0, 2.0))
    close(adv, [[a, a, 0.0], [b, 0.0, b], [c, c, c]])
    close(ret, adv)


def test_remax_subtracts_the_greedy_reward_from_the_reward_to_go() -> None:
    rewards = t([[1.0, 0.0, 2.0], [0.0, 4.0, 9.0]])  # the 9 sits on padding
    mask = t([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    adv, ret = compute_remax_outcome_advantage(rewards, t([1.5, 5.0]), mask)
    close(ret, [[3.0, 2.0, 2.0], [4.0, 4.0, 0.0]])
    close(adv, [[1.5, 0.5, 0.5], [-1.0, -1.0, 0.0]])


def test_opo_length_weighted_baseline() -> None:
    # group a: scores 1 (2 tokens) and 3 (3 tokens): baseline (2*1 + 3*3)/5 = 2.2; c alone keeps 2
    rewards = t([[0.0, 1.0, 0.0], [0.0, 0.0, 3.0], [0.0, 0.0, 2.0]])
    mask = t([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [1.0, 1.0, 1.0]])
    adv, ret = compute_opo_outcome_advantage(rewards, mask, ["a", "a", "c"])
    close(adv, [[-1.2, -1.2, 0.0], [0.8, 0.8, 0.8], [2.0, 2.0, 2.0]])
    close(ret, adv)


def test_grpo_passk_only_the_best_gets_the_margin() -> None:
    # group a: 1, 3, 2 -> the 3 gets (3 - 2) / (std 1 + eps); group b all equal -> zeros
    rewards = t([[1.0], [3.0], [2.0], [5.0], [5.0]])
    mask = torch.ones(5, 1, dtype=torch.float64)
    index = ["a", "a", "a", "b", "b"]
    adv, ret = compute_grpo_passk_outcome_advantage(rewards, mask, index)
    close(adv, [[0.0], [1 / (1 + EPS)], [0.0], [0.0], [0.0]])
    close(ret, adv)
    adv, _ = compute_grpo_passk_outcome_advantage(rewards, mask, index, norm_adv_by_std_in_grpo=False)
    close(adv, [[0.0], [1.0], [0.0], [0.0], [0.0]])
    with pytest.raises(ValueError, match="at least 2 samples"):
        compute_grpo_passk_outcome_advantage(rewards, mask, ["a", "a", "a", "b", "c"])


def test_gpg_scales_by_the_share_of_non_zero_scores() -> None:
    # scores 1,0,3 | 0,2: 3 of 5 non-zero -> alpha 5/3; means 4/3 and 1
    rewards = t([[1.0, 0.0], [0.0, 0.0], [0.0, 3.0], [0.0, 0.0], [2.0, 0.0]])
    mask = t([[1.0, 0.0], [1.0, 1.0], [1.0, 1.0], [1.0, 1.0], [1.0, 1.0]])
    adv, _ = compute_gpg_outcome_advantage(rewards, mask, ["a", "a", "a", "b", "b"])
    alpha = 5 / 3
    expected = [alpha * (1 - 4 / 3), alpha * (0 - 4 / 3), alpha * (3 - 4 / 3), alpha * (0 - 1), alpha * (2 - 1)]
    close(adv, [[expected[0], 0.0]] + [[e, e] for e in expected[1:]])
    adv, _ = compute_gpg_outcome_advantage(rewards, mask, ["a", "a", "a", "b", "b"], f_norm=2.0)
    close(adv[1, 0], alpha * (0 - 4 / 3) / 2)


def test_gdpo_normalises_each_component_in_its_group_then_whitens() -> None:
    components = [t([1.0, 0.0, 1.0, 0.0]), t([0.0, 0.0, 3.0, 1.0])]
    index = ["a", "a", "b", "b"]
    mask = t([[1.0, 1.0], [1.0, 1.0], [1.0, 1.0], [1.0, 0.0]])

    def grpo(values: list[float]) -> list[float]:
        out = []
        for i, v in enumerate(values):
            group = [w for w, g in zip(values, index, strict=True) if g == index[i]]
            out.append((v - statistics.mean(group)) / (statistics.stdev(group) + EPS))
        return out

    total = [1.0 * x + 2.0 * y for x, y in zip(grpo([1, 0, 1, 0]), grpo([0, 0, 3, 1]), strict=True)]
    tokens = [total[0], total[0], total[1], total[1], total[2], total[2], total[3]]
    mean, std = statistics.mean(tokens), math.sqrt(statistics.variance(tokens) + 1e-8)
    w = [(v - mean) / std for v in total]
    adv, ret = compute_gdpo_outcome_advantage(
        torch.zeros(4, 2, dtype=torch.float64), mask, index, reward_components=components, reward_weights=[1.0, 2.0]
    )
    close(adv, [[w[0], w[0]], [w[1], w[1]], [w[2], w[2]], [w[3], 0.0]])
    close(ret, adv)
    with pytest.raises(ValueError, match="2 reward components but 1 weights"):
        compute_gdpo_outcome_advantage(
            torch.zeros(4, 2, dtype=torch.float64), mask, index, reward_components=components, reward_weights=[1.0]
        )


def test_optimal_token_baseline_per_position_and_zero_tail() -> None:
    # row 0: pi 0.25, sum pi^2 0.5 -> w = 1 - 0.5 + 0.5 = 1, W = 1, 2; two tokens, reward 1 at the end
    # row 1: pi 0.5 -> w = 0.5, W = 0.5, 1, 1.5; three tokens, reward 3 at the end
    # G: row 0 [1, 1, -], row 1 [3, 3, 3]
    # B_0 = (1*1 + 3*0.5) / 1.5 = 5/3; B_1 = (1*2 + 3*1) / 3 = 5/3; B_2 = 3*1.5/1.5 = 3, but row 1
    # is the only sample that long, so its baseline there is 0 (zero tail).
    rewards = t([[0.0, 1.0, 0.0], [0.0, 0.0, 3.0]])
    mask = t([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    old_log_probs = torch.log(t([[0.25, 0.25, 0.25], [0.5, 0.5, 0.5]]))
    sum_pi_squared = torch.full((2, 3), 0.5, dtype=torch.float64)
    adv, ret = compute_optimal_token_baseline_advantage(rewards, mask, ["a", "a"], old_log_probs, sum_pi_squared)
    close(ret, [[1.0, 1.0, 0.0], [3.0, 3.0, 3.0]])
    close(adv, [[1 - 5 / 3, 1 - 5 / 3, 0.0], [3 - 5 / 3, 3 - 5 / 3, 3.0]], atol=1e-7)
    adv, _ = compute_optimal_token_baseline_advantage(
        rewards, mask, ["a", "a"], old_log_probs, sum_pi_squared, handle_zero_tail=False
    )
    close(adv[1, 2], 0.0, atol=1e-7)
    # a lone sample keeps its return
    adv, _ = compute_optimal_token_baseline_advantage(rewards, mask, ["a", "b"], old_log_probs, sum_pi_squared)
    close(adv, [[1.0, 1.0, 0.0], [3.0, 3.0, 3.0]])


def test_tir_optimal_token_baseline_counts_model_tokens_only() -> None:
    # row 0: model, tool, model (reward 1 at the end); row 1: two model tokens (reward 2), padding.
    # w = 1 - 2*0.5 + 0.5 = 0.5. Model tokens in order: row 0 W [0.5, 1], G [1, 1]; row 1 W [0.5, 1], G [2, 2]
    # B = (0.5*1 + 0.5*2)/1 = 1.5, (1*1 + 1*2)/2 = 1.5 -> row 0 -0.5 on its model tokens, row 1 +0.5
    rewards = t([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]])
    mask = t([[1.0, 0.0, 1.0], [1.0, 1.0, 0.0]])
    old_log_probs = torch.log(torch.full((2, 3), 0.5, dtype=torch.float64))
    sum_pi_squared = torch.full((2, 3), 0.5, dtype=torch.float64)
    adv, ret = compute_multi_turn_optimal_token_baseline_advantage(rewards, mask, [0, 0], old_log_probs, sum_pi_squared)
    close(adv, [[-0.5, 0.0, -0.5], [0.5, 0.5, 0.0]], atol=1e-7)
    close(ret, [[1.0, 1.0, 1.0], [2.0, 2.0, 0.0]])


def test_rloo_vectorized_gives_a_lone_sample_zero() -> None:
    # group a: 1, 3 -> leave-one-out: 1 - 3 = -2, 3 - 1 = 2; group b (alone): 0 (rloo would keep 5)
    rewards = t([[1.0, 0.0], [0.0, 3.0], [5.0, 0.0]])
    mask = t([[1.0, 1.0], [1.0, 1.0], [1.0, 0.0]])
    adv, ret = compute_rloo_vectorized_outcome_advantage(rewards, mask, ["a", "a", "b"])
    close(adv, [[-2.0, -2.0], [2.0, 2.0], [0.0, 0.0]])
    close(ret, adv)


def test_registry_takes_verls_enum_or_the_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(advantage_module, "ADV_ESTIMATOR_REGISTRY", dict(advantage_module.ADV_ESTIMATOR_REGISTRY))
    for member, fn in [
        (AdvantageEstimator.REINFORCE_PLUS_PLUS_BASELINE, compute_reinforce_plus_plus_baseline_outcome_advantage),
        (AdvantageEstimator.REMAX, compute_remax_outcome_advantage),
        (AdvantageEstimator.OPO, compute_opo_outcome_advantage),
        (AdvantageEstimator.GRPO_PASSK, compute_grpo_passk_outcome_advantage),
        (AdvantageEstimator.GPG, compute_gpg_outcome_advantage),
        (AdvantageEstimator.GDPO, compute_gdpo_outcome_advantage),
        (AdvantageEstimator.OPTIMAL_TOKEN_BASELINE, compute_optimal_token_baseline_advantage),
        (AdvantageEstimator.TIR_OPTIMAL_TOKEN_BASELINE, compute_multi_turn_optimal_token_baseline_advantage),
        (AdvantageEstimator.GRPO_VECTORIZED, compute_grpo_outcome_advantage),  # grpo is vectorized
        (AdvantageEstimator.RLOO_VECTORIZED, compute_rloo_vectorized_outcome_advantage),
    ]:
        assert get_adv_estimator_fn(member) is fn
        assert get_adv_estimator_fn(member.value) is fn

    # An enum of another module (as verl's own AdvantageEstimator, a str Enum) works alike.
    class TheirEstimator(str, enum.Enum):  # noqa: UP042 (verl's enum is a str Enum)
        MINE = "mine_enum"

    def mine(token_level_rewards: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return token_level_rewards, token_level_rewards

    register_adv_est(TheirEstimator.MINE)(mine)
    assert get_adv_estimator_fn("mine_enum") is mine
    assert get_adv_estimator_fn(TheirEstimator.MINE) is mine
