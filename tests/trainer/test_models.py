"""Log-probs, entropy and values over response tokens only, the same under left
and right padding."""

from __future__ import annotations

from pathlib import Path

import torch

from rlkube_trainer.models import CriticModel, load_causal_lm, response_log_probs, token_log_probs
from rlkube_trainer.tiny_task import build_model


def test_log_probs_do_not_depend_on_the_padding_side(tmp_path: Path) -> None:
    path = build_model(tmp_path / "m")
    model = load_causal_lm(str(path))
    prompt, response, pad = [5, 9, 3, 13], [7, 1], 0
    # Left padding: [pad pad | prompt | response]; right padding: [prompt | response | pad pad].
    left = torch.tensor([[pad, pad, *prompt, *response]])
    right = torch.tensor([[*prompt, *response, pad, pad]])
    left_mask = (torch.arange(8) >= 2).long().unsqueeze(0)
    right_mask = (torch.arange(8) < 6).long().unsqueeze(0)
    with torch.no_grad():
        lp_left, ent_left = response_log_probs(model, left, left_mask, response_length=2, with_entropy=True)
        lp_right, ent_right = token_log_probs(model, right, right_mask, with_entropy=True)
    # Column t scores token t+1: the response tokens sit at 4 and 5 in the right-padded row.
    torch.testing.assert_close(lp_left[0], lp_right[0, 3:5], atol=1e-5, rtol=1e-5)
    assert ent_left is not None and ent_right is not None
    torch.testing.assert_close(ent_left[0], ent_right[0, 3:5], atol=1e-5, rtol=1e-5)
    # And they are the model's own next-token log-probs of the unpadded sequence.
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([[*prompt, *response]])).logits
    expected = torch.log_softmax(logits[0, 3:5].float(), -1)[torch.arange(2), torch.tensor(response)]
    torch.testing.assert_close(lp_left[0], expected, atol=1e-5, rtol=1e-5)


def test_temperature_scales_the_logits(tmp_path: Path) -> None:
    model = load_causal_lm(str(build_model(tmp_path / "m")))
    ids = torch.tensor([[5, 9, 3, 13, 7]])
    mask = torch.ones_like(ids)
    with torch.no_grad():
        cold, _ = token_log_probs(model, ids, mask, temperature=0.5)
        logits = model(input_ids=ids).logits[0, :-1].float() / 0.5
    torch.testing.assert_close(cold[0], torch.log_softmax(logits, -1)[torch.arange(4), ids[0, 1:]])


def test_critic_starts_at_zero_and_has_one_value_per_position(tmp_path: Path) -> None:
    critic = CriticModel.from_pretrained(str(build_model(tmp_path / "m")))
    ids = torch.tensor([[5, 9, 3, 13, 7, 1]])
    mask = torch.ones_like(ids)
    values = critic(ids, mask, torch.arange(6).unsqueeze(0))
    assert values.shape == (1, 6)
    assert torch.all(values == 0)
