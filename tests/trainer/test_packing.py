"""Sequence packing and micro-batches by token count give the numbers of padded, fixed
micro-batches: log-probs, entropies, values, losses and gradients, with uneven prompt and
response lengths and any amount of padding on either side."""

from __future__ import annotations

import copy
import json
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from packing_probe import PROMPT, RESPONSE, SKEWED, make_batch
from tiny_model import build_tiny_model, save_reward_model
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from rlkube_api.config import RewardConfig
from rlkube_api.validation import parse_trainer_config
from rlkube_trainer.algos import LOSS_AGG_MODES, agg_loss
from rlkube_trainer.batch import TrainBatch
from rlkube_trainer.loop.driver import run_in_process
from rlkube_trainer.model import packing, token_scores
from rlkube_trainer.model.loading import load_causal_lm
from rlkube_trainer.model.packing import BLOCK, LossScale, document_block_mask, document_mask, pack, token_bins
from rlkube_trainer.model.token_scores import response_log_probs
from rlkube_trainer.model.value_head import CriticModel, response_values
from rlkube_trainer.reward.scoring import ModelRewardScorer, RewardInput, build_reward_scorer
from rlkube_trainer.tiny.task import init, trainer_config
from rlkube_trainer.workers.actor import Actor
from rlkube_trainer.workers.builders import build_actor, build_critic, build_reference
from rlkube_trainer.workers.critic import Critic
from rlkube_trainer.workers.training import MicroBatching

TOL = {"atol": 2e-5, "rtol": 2e-5}
PROBE = Path(__file__).with_name("packing_probe.py")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Qwen2 with grouped-query attention (2 query heads over 1 key/value head).
    return build_tiny_model(tmp_path_factory.mktemp("packing") / "model", vocab=300)


def real(values: torch.Tensor, batch: TrainBatch) -> torch.Tensor:
    """The entries at real response tokens, in order: the same whatever the padding."""
    return values[batch.response_mask.bool()]


# --------------------------------------------------------------------------- the document mask


def sequence_ids(lengths: list[int]) -> torch.Tensor:
    ids = torch.cat([torch.full((n,), i) for i, n in enumerate(lengths)])
    total = -(-len(ids) // BLOCK) * BLOCK
    return torch.cat([ids, torch.full((total - len(ids),), len(lengths))])


def test_the_block_mask_is_flex_attentions_own_document_mask() -> None:
    # Sequences within one block, across several, ending on a block boundary, of one token.
    sequence = sequence_ids([300, 50, 128, 1, 400, 77, 200])
    tokens = len(sequence)

    def document(b: Any, h: Any, q: Any, kv: Any) -> Any:
        return (sequence[q] == sequence[kv]) & (kv <= q)

    expected = create_block_mask(document, 1, None, tokens, tokens, device="cpu")
    ours = document_block_mask(sequence)
    for name in ("kv_num_blocks", "full_kv_num_blocks", "q_num_blocks", "full_q_num_blocks"):
        assert torch.equal(getattr(ours, name), getattr(expected, name)), name
    # And attention under it is attention under the dense mask (FlexAttention's forward runs on CPU).
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, heads, tokens, 16, generator=g) for heads in (4, 2, 2))
    dense = document_mask(sequence)
    assert isinstance(dense, torch.Tensor) and dense.shape == (1, 1, tokens, tokens)
    torch.testing.assert_close(
        flex_attention(q, k, v, block_mask=ours, enable_gqa=True),
        torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=dense, enable_gqa=True),
    )


def test_pack_lays_real_tokens_end_to_end() -> None:
    batch = make_batch([(2, 1), (1, 2)])
    packed = pack(batch.input_ids, batch.attention_mask, batch.response_length)
    ids = batch.input_ids
    assert packed.input_ids.shape == (1, BLOCK)
    assert packed.input_ids[0, :6].tolist() == [*ids[0, 4:7].tolist(), *ids[1, 5:8].tolist()]
    assert packed.position_ids[0, :6].tolist() == [0, 1, 2, 0, 1, 2]
    # Each response token is scored at the position before it: row 0's at 1, row 1's at 3 and 4.
    assert packed.score_index.tolist() == [1, 3, 4]
    assert packed.targets.tolist() == [ids[0, 6].item(), ids[1, 6].item(), ids[1, 7].item()]


# --------------------------------------------------------------------------- forward and backward


def packed_copy(model: torch.nn.Module) -> torch.nn.Module:
    twin = copy.deepcopy(model)
    packing.enable_packed_attention(twin)
    return twin


def grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def assert_same_grads(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys() and a
    for name, got in a.items():
        # fp32 sums in another order: absolute tolerance relative to the gradient's own scale.
        atol = 1e-5 * max(1.0, float(b[name].abs().max()))
        torch.testing.assert_close(got, b[name], atol=atol, rtol=1e-4, msg=f"gradient of {name} differs")


@pytest.mark.parametrize("head", ["chunked", "logits"], ids=["chunked-head", "plain-logits"])
@pytest.mark.parametrize(("pad_left", "pad_right"), [(0, 0), (3, 0), (0, 4), (2, 3)])
def test_log_probs_entropy_and_gradients_match_the_padded_batch(
    model_dir: Path, monkeypatch: pytest.MonkeyPatch, head: str, pad_left: int, pad_right: int
) -> None:
    if head == "logits":  # models whose LM head cannot return scores: logits, then the same math
        monkeypatch.setattr(token_scores, "_plain_head", lambda model: None)
    padded_model = load_causal_lm(str(model_dir))
    packed_model = packed_copy(padded_model)
    reference = make_batch()  # the padded path, minimal padding
    batch = make_batch(pad_left=pad_left, pad_right=pad_right)
    lp, ent = response_log_probs(padded_model, reference.input_ids, reference.attention_mask, RESPONSE, 0.7, True)
    plp, pent = response_log_probs(
        packed_model, batch.input_ids, batch.attention_mask, batch.response_length, 0.7, True, packed=True
    )
    assert ent is not None and pent is not None
    torch.testing.assert_close(real(plp, batch), real(lp, reference), **TOL)
    torch.testing.assert_close(real(pent, batch), real(ent, reference), **TOL)
    assert plp[~batch.response_mask.bool()].abs().sum() == 0
    (real(lp, reference).sum() + real(ent, reference).sum()).backward()
    (real(plp, batch).sum() + real(pent, batch).sum()).backward()
    assert_same_grads(grads(packed_model), grads(padded_model))


def test_values_and_their_gradients_match_the_padded_batch(model_dir: Path) -> None:
    critic = CriticModel.from_pretrained(str(model_dir))
    torch.nn.init.normal_(critic.value_head.weight, std=0.5)  # zeros would hide the backbone's gradient
    packed_critic = packed_copy(critic)
    batch = make_batch(pad_left=2, pad_right=1)
    values = response_values(critic, batch.input_ids, batch.attention_mask, batch.response_length)
    packed_values = response_values(
        packed_critic, batch.input_ids, batch.attention_mask, batch.response_length, packed=True
    )
    torch.testing.assert_close(real(packed_values, batch), real(values, batch), **TOL)
    real(values, batch).pow(2).sum().backward()
    real(packed_values, batch).pow(2).sum().backward()
    assert_same_grads(grads(packed_critic), grads(critic))


def test_the_block_mask_path_runs_the_model_as_the_dense_one(model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What GPUs run (a BlockMask through FlexAttention), forward only here: FlexAttention has no
    backward on CPU, and its compiled kernels are GPU code."""
    model = packed_copy(load_causal_lm(str(model_dir)))
    batch = make_batch()
    with torch.no_grad():
        dense, _ = response_log_probs(model, batch.input_ids, batch.attention_mask, RESPONSE, packed=True)
        monkeypatch.setattr(packing, "document_mask", document_block_mask)
        monkeypatch.setattr(packing, "_flex", lambda: flex_attention)
        blocks, _ = response_log_probs(model, batch.input_ids, batch.attention_mask, RESPONSE, packed=True)
    torch.testing.assert_close(blocks, dense, **TOL)


# --------------------------------------------------------------------------- micro-batches by tokens


def test_token_bins_fit_the_budget_and_cover_every_sample() -> None:
    lengths = [9, 3, 7, 1, 5, 5, 2, 8]
    bins = token_bins(lengths, 10, "actor.ppo_max_token_len_per_gpu")
    assert sorted(i for b in bins for i in b) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in b) <= 10 for b in bins)
    assert len(bins) == 4  # 40 tokens: first fit, longest first, fills every bin here
    with pytest.raises(ValueError, match=r"actor.ppo_max_token_len_per_gpu \(8\) is smaller than a sequence of 9"):
        token_bins(lengths, 8, "actor.ppo_max_token_len_per_gpu")


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_loss_scale_weights_sum_a_mini_batch_back_together(mode: str) -> None:
    batch = make_batch()
    batch.response_mask[1] = 0  # a sequence without response tokens counts in no mean
    losses = torch.randn(batch.response_mask.shape)
    scale = LossScale.of(batch.response_mask)
    whole = agg_loss(losses, batch.response_mask, mode)
    for groups in ([[0, 1, 2], [3, 4, 5, 6]], [[6], [0, 2], [1, 3, 4, 5]]):
        parts = [
            agg_loss(losses[g], batch.response_mask[g], mode) * scale.weight(mode, batch.response_mask[g])
            for g in groups
        ]
        torch.testing.assert_close(sum(parts), whole)


def raw_config(model_dir: Path, tmp_path: Path, estimator: str = "grpo", **sections: dict[str, Any]) -> Any:
    raw = trainer_config(tmp_path, adv_estimator=estimator)
    raw["model"]["path"] = str(model_dir)
    raw["data"].update(max_prompt_length=PROMPT, max_response_length=RESPONSE)
    for section, values in sections.items():
        raw.setdefault(section, {}).update(values)
    return raw


def role_config(model_dir: Path, tmp_path: Path, estimator: str = "grpo", **sections: dict[str, Any]) -> Any:
    return parse_trainer_config(raw_config(model_dir, tmp_path, estimator, **sections))


def captured_gradients(trainable: Actor | Critic, batch: TrainBatch) -> dict[str, torch.Tensor]:
    """The accumulated gradient of the first (and only) mini-batch, before the optimizer steps."""
    captured: dict[str, torch.Tensor] = {}

    def capture() -> float:
        captured.update(grads(trainable.model))
        trainable.optimizer.zero_grad(set_to_none=True)
        return 0.0

    trainable._optimizer_step = capture  # type: ignore[method-assign]
    trainable.samples_per_mini_batch = len(batch)
    trainable.update(batch)
    return captured


# Fixed micro-batches of 2 samples, padded; token budgets of 11 (one long sequence, or a few
# short ones) and 16, packed and padded; micro-batches of 4 and 3 samples, packed.
VARIANTS: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    ("fixed-2-padded", {"ppo_micro_batch_size_per_gpu": 2}, {}),
    ("tokens-11-packed", {"use_dynamic_bsz": True, "ppo_max_token_len_per_gpu": 11}, {"use_remove_padding": True}),
    ("tokens-16-padded", {"use_dynamic_bsz": True, "ppo_max_token_len_per_gpu": 16}, {}),
    ("fixed-4-packed", {"ppo_micro_batch_size_per_gpu": 4}, {"use_remove_padding": True}),
]


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_actor_gradients_are_the_whole_mini_batchs_however_it_is_cut(
    model_dir: Path, tmp_path: Path, mode: str
) -> None:
    batch = make_batch(pad_left=1, pad_right=2)
    common = {"loss_agg_mode": mode, "entropy_coeff": 0.01, "use_kl_loss": True, "kl_loss_coef": 0.1}
    whole = build_actor(
        role_config(model_dir, tmp_path, actor={**common, "ppo_micro_batch_size_per_gpu": 64}), torch.device("cpu"), 1
    )
    expected = captured_gradients(whole, batch)
    for name, actor_fields, model_fields in VARIANTS:
        config = role_config(model_dir, tmp_path, actor={**common, **actor_fields}, model=model_fields)
        actor = build_actor(config, torch.device("cpu"), 1)
        if actor_fields.get("use_dynamic_bsz"):
            assert len(actor.micro_batching.groups(batch)) > 1, name
        assert_same_grads(captured_gradients(actor, batch), expected)


@pytest.mark.parametrize("policy_loss", ["sapo", "geo_mean"])
def test_a_loss_with_its_own_aggregation_weighs_it(model_dir: Path, tmp_path: Path, policy_loss: str) -> None:
    batch = make_batch()
    common = {"policy_loss": policy_loss, "loss_agg_mode": "token-mean", "use_kl_loss": True, "kl_loss_coef": 0.5}
    whole = build_actor(
        role_config(model_dir, tmp_path, actor={**common, "ppo_micro_batch_size_per_gpu": 64}), torch.device("cpu"), 1
    )
    config = role_config(
        model_dir, tmp_path, actor={**common, "use_dynamic_bsz": True, "ppo_max_token_len_per_gpu": 11}
    )
    assert_same_grads(
        captured_gradients(build_actor(config, torch.device("cpu"), 1), batch), captured_gradients(whole, batch)
    )


def test_critic_gradients_and_values_are_the_padded_fixed_ones(model_dir: Path, tmp_path: Path) -> None:
    batch = make_batch(pad_right=2)

    def critic(**fields: Any) -> Critic:
        config = role_config(model_dir, tmp_path, "gae", critic=fields)
        made = build_critic(config, torch.device("cpu"), 1)
        torch.nn.init.normal_(made.model.value_head.weight, generator=torch.Generator().manual_seed(1))
        return made

    whole = critic(ppo_micro_batch_size_per_gpu=64, loss_agg_mode="token-mean")
    dynamic = critic(
        use_dynamic_bsz=True,
        ppo_max_token_len_per_gpu=11,
        forward_max_token_len_per_gpu=16,
        use_remove_padding=True,
        loss_agg_mode="token-mean",
    )
    torch.testing.assert_close(dynamic.compute_values(batch), whole.compute_values(batch), **TOL)
    assert_same_grads(captured_gradients(dynamic, batch), captured_gradients(whole, batch))


def test_log_prob_passes_keep_the_batch_order(model_dir: Path, tmp_path: Path) -> None:
    batch = make_batch(pad_left=2)
    fixed = role_config(model_dir, tmp_path, actor={"ppo_micro_batch_size_per_gpu": 2}, ref={})
    dynamic = role_config(
        model_dir,
        tmp_path,
        model={"use_remove_padding": True},
        actor={"use_dynamic_bsz": True, "log_prob_max_token_len_per_gpu": 12},
        ref={"log_prob_max_token_len_per_gpu": 20},
    )
    cpu = torch.device("cpu")
    packed_actor, packed_ref = build_actor(dynamic, cpu, 1), build_reference(dynamic, cpu)
    assert packed_actor.log_prob_batching.token_budget == 12 and packed_ref.batching.token_budget == 20
    expected = build_actor(fixed, cpu, 1).compute_log_prob(batch)
    mask = batch.response_mask.bool()
    torch.testing.assert_close(packed_actor.compute_log_prob(batch)[mask], expected[mask], **TOL)
    torch.testing.assert_close(
        packed_ref.compute_ref_log_prob(batch)[mask],
        build_reference(fixed, cpu).compute_ref_log_prob(batch)[mask],
        **TOL,
    )


def test_micro_batching_maps_in_order() -> None:
    batch = make_batch()
    lengths = batch.attention_mask.sum(-1)
    batching = MicroBatching(2, token_budget=12, budget_field="x")
    out = batching.map(batch, lambda micro: micro.attention_mask.sum(-1))
    assert torch.equal(out, lengths)
    assert len(batching.groups(batch)) > 2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.trainer
def test_ranks_with_uneven_tokens_get_the_whole_mini_batchs_gradient(model_dir: Path, tmp_path: Path) -> None:
    """Two FSDP2 ranks over gloo, packed, by token budget: one rank's long sequences need four
    micro-batches, the other's short ones two, so the second splits to four (else FSDP's
    collectives would wait forever); token-mean over tokens of both ranks."""
    common = {"loss_agg_mode": "token-mean", "entropy_coeff": 0.01, "use_kl_loss": True, "kl_loss_coef": 0.1}
    raw = raw_config(
        model_dir,
        tmp_path,
        model={"use_remove_padding": True},
        actor={
            **common,
            "strategy": "fsdp2",
            "fsdp_config": {"mixed_precision": {"param_dtype": "fp32"}},
            "use_dynamic_bsz": True,
            "ppo_max_token_len_per_gpu": 11,
        },
    )
    raw["roles"]["actor"]["replicas"] = 2
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(raw))
    result = subprocess.run(
        [sys.executable, str(PROBE), "2", str(free_port()), str(config), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    counts = [json.loads((tmp_path / f"rank_{r}.json").read_text())["micro_batches"] for r in range(2)]
    assert counts == [4, 4]
    whole = build_actor(
        role_config(model_dir, tmp_path, actor={**common, "ppo_micro_batch_size_per_gpu": 64}), torch.device("cpu"), 1
    )
    assert_same_grads(torch.load(tmp_path / "grads.pt"), captured_gradients(whole, make_batch(SKEWED)))


def test_reward_model_scores_are_the_padded_ones(tmp_path: Path) -> None:
    path = save_reward_model(tmp_path / "rm")
    prompt = [{"role": "user", "content": "what is two plus two"}]
    responses = ["four", "five", "a long answer indeed, with many more words than the others", "4", "four"]
    rows = [RewardInput("chat", response, None, None, prompt) for response in responses]
    padded = ModelRewardScorer(path, batch_size=3).score(rows).scores
    config = RewardConfig(
        model={
            "path": str(path),
            "use_remove_padding": True,
            "use_dynamic_bsz": True,
            "forward_max_token_len_per_gpu": 120,
        }
    )
    scorer = build_reward_scorer(config)
    assert isinstance(scorer, ModelRewardScorer) and scorer.token_budget == 120 and scorer.head is not None
    assert scorer.score(rows).scores == pytest.approx(padded, abs=1e-5)
    with pytest.raises(ValueError, match=r"reward.model.forward_max_token_len_per_gpu \(20\) is smaller than"):
        ModelRewardScorer(path, packed=True, token_budget=20).score(rows)


@pytest.mark.trainer
def test_a_ppo_step_packed_by_token_budget_is_the_padded_one(tmp_path: Path) -> None:
    """Through the loop (HF rollout, critic, reference): every role packed and cut by tokens
    gives the step of padded fixed micro-batches; the gradient norms are the mini-batches'."""

    def step(workdir: Path, packed: bool) -> dict[str, float]:
        raw: dict[str, Any] = yaml.safe_load(init(workdir, "gae", steps=1).read_text())
        raw["rollout"]["name"] = "hf"
        raw["data"]["train_batch_size"] = 8
        raw["actor"].update(ppo_mini_batch_size=8, ppo_micro_batch_size_per_gpu=8, use_kl_loss=True)
        raw["critic"]["ppo_micro_batch_size_per_gpu"] = 8
        raw["roles"]["reference"] = {"colocate_with": "actor"}
        raw["trainer"]["test_freq"] = -1
        if packed:
            raw["model"]["use_remove_padding"] = True
            budget = raw["data"]["max_prompt_length"] + raw["data"]["max_response_length"] + 4
            raw["actor"].update(use_dynamic_bsz=True, ppo_max_token_len_per_gpu=budget)
            raw["critic"].update(use_dynamic_bsz=True, ppo_max_token_len_per_gpu=budget)
        return run_in_process(parse_trainer_config(raw), progress=False).history[-1]

    padded, packed = step(tmp_path / "padded", False), step(tmp_path / "packed", True)
    for key in ("actor/grad_norm", "critic/grad_norm", "critic/advantages/mean", "critic/values/mean", "actor/kl_loss"):
        assert packed[key] == pytest.approx(padded[key], rel=1e-4, abs=1e-6), key
