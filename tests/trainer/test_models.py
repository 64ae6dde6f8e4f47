"""Log-probs, entropy and values over response tokens only, the same under left
and right padding."""

from __future__ import annotations

import copy
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import Qwen2Config, Qwen2ForCausalLM

from rlkube_trainer.model import loading, token_scores
from rlkube_trainer.model.loading import load_causal_lm
from rlkube_trainer.model.packing import enable_packed_attention
from rlkube_trainer.model.token_scores import (
    position_ids_from_mask,
    response_log_probs,
    response_scores,
    sum_pi_squared_from_logits,
    token_log_probs,
)
from rlkube_trainer.model.value_head import CriticModel
from rlkube_trainer.tiny.task import build_model


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


# ---------------------------------------------------------------- response-only LM head

# Three rows laid out as the trainer lays them out: prompt left-padded to 5, response
# right-padded to 4 (0 = padding).
PROMPT_LENGTHS, RESPONSE_LENGTHS = (5, 3, 1), (4, 2, 3)
PROMPT_WIDTH, RESPONSE_WIDTH = 5, 4


def padded_batch(vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    rows, masks = [], []
    for prompt, response in zip(PROMPT_LENGTHS, RESPONSE_LENGTHS, strict=True):
        real = torch.randint(3, vocab, (prompt + response,), generator=generator).tolist()
        left, right = PROMPT_WIDTH - prompt, RESPONSE_WIDTH - response
        rows.append([0] * left + real + [0] * right)
        masks.append([0] * left + [1] * (prompt + response) + [0] * right)
    return torch.tensor(rows), torch.tensor(masks)


def full_logits_reference(
    model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The straightforward way, in float64: the LM head on every position, log_softmax over the
    vocabulary, the response columns taken afterwards; entropy as -sum(p log p)."""
    logits = model(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids_from_mask(attention_mask)
    ).logits
    logits = logits[:, -RESPONSE_WIDTH - 1 : -1].double() / temperature
    log_softmax = torch.log_softmax(logits, dim=-1)
    targets = input_ids[:, -RESPONSE_WIDTH:]
    log_probs = log_softmax.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    entropy = -(log_softmax.exp() * log_softmax).sum(-1)
    return log_probs, entropy


def random_qwen2() -> nn.Module:
    """Untied LM head, unlike the tiny task's Llama: both layouts of the head are covered."""
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        tie_word_embeddings=False,
    )
    return Qwen2ForCausalLM(config)  # type: ignore[no-untyped-call]


class WithoutLogitsToKeep(nn.Module):
    """A causal LM whose forward does not take logits_to_keep (some remote-code models)."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor) -> Any:
        return self.inner(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids)


def make_model(kind: str, tmp_path: Path) -> tuple[nn.Module, int]:
    if kind == "llama-tied":
        return load_causal_lm(str(build_model(tmp_path / "m"))), 14
    if kind == "qwen2-untied":
        return random_qwen2(), 512
    return WithoutLogitsToKeep(random_qwen2()), 512


@pytest.mark.parametrize("kind", ["llama-tied", "qwen2-untied", "without-logits-to-keep"])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("with_entropy", [False, True])
def test_response_log_probs_match_the_full_logits_reference(
    tmp_path: Path, kind: str, temperature: float, with_entropy: bool
) -> None:
    model, vocab = make_model(kind, tmp_path)
    model.eval()
    input_ids, attention_mask = padded_batch(vocab)
    with torch.no_grad():
        log_probs, entropy = response_log_probs(
            model, input_ids, attention_mask, RESPONSE_WIDTH, temperature, with_entropy
        )
        want_log_probs, want_entropy = full_logits_reference(model, input_ids, attention_mask, temperature)
    assert log_probs.dtype == torch.float32 and log_probs.shape == (3, RESPONSE_WIDTH)
    torch.testing.assert_close(log_probs.double(), want_log_probs, atol=1e-5, rtol=1e-5)
    if with_entropy:
        assert entropy is not None and entropy.dtype == torch.float32
        torch.testing.assert_close(entropy.double(), want_entropy, atol=1e-5, rtol=1e-5)
    else:
        assert entropy is None


def test_response_log_probs_gradients_match_the_full_logits_reference() -> None:
    model = random_qwen2()
    input_ids, attention_mask = padded_batch(512)
    response_mask = attention_mask[:, -RESPONSE_WIDTH:].double()

    def gradients(loss: torch.Tensor) -> list[torch.Tensor]:
        model.zero_grad(set_to_none=True)
        loss.backward()
        return [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in model.parameters()]

    log_probs, entropy = response_log_probs(model, input_ids, attention_mask, RESPONSE_WIDTH, 0.7, True)
    assert entropy is not None
    got = gradients(((log_probs.double() - 0.01 * entropy.double()) * response_mask).sum())
    want_log_probs, want_entropy = full_logits_reference(model, input_ids, attention_mask, 0.7)
    want = gradients(((want_log_probs - 0.01 * want_entropy) * response_mask).sum())
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-4)


def test_the_lm_head_runs_on_the_response_positions_only() -> None:
    model = random_qwen2()
    input_ids, attention_mask = padded_batch(512)
    rows_seen: list[int] = []
    head = model.get_output_embeddings()
    assert isinstance(head, nn.Module)
    head.register_forward_hook(lambda _module, _args, output: rows_seen.append(output.shape[1]))
    with torch.no_grad():
        response_log_probs(model, input_ids, attention_mask, RESPONSE_WIDTH)
    # The response positions plus the last one (it predicts past the sequence; dropped).
    assert rows_seen == [RESPONSE_WIDTH + 1]


@pytest.fixture
def two_token_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks of two positions' logits: the batches below span several chunks."""
    monkeypatch.setattr(token_scores, "LOGITS_CHUNK_ELEMENTS", 2 * 512)


@pytest.mark.usefixtures("two_token_chunks")
def test_chunked_scores_and_their_gradients_match_the_full_logits_reference() -> None:
    model = random_qwen2()
    input_ids, attention_mask = padded_batch(512)
    response_mask = attention_mask[:, -RESPONSE_WIDTH:].double()
    model.zero_grad(set_to_none=True)
    log_probs, entropy = response_log_probs(model, input_ids, attention_mask, RESPONSE_WIDTH, 0.7, True)
    assert entropy is not None
    ((log_probs.double() - 0.01 * entropy.double()) * response_mask).sum().backward()
    got = [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    want_log_probs, want_entropy = full_logits_reference(model, input_ids, attention_mask, 0.7)
    torch.testing.assert_close(log_probs.double(), want_log_probs, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(entropy.double(), want_entropy, atol=1e-5, rtol=1e-5)
    ((want_log_probs - 0.01 * want_entropy) * response_mask).sum().backward()
    want = [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in model.parameters()]
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-4)


class LargestLogits(TorchDispatchMode):
    """Records the largest float32 tensor over the vocabulary ([..., vocab]) any operation makes
    (views, such as the LM head weight's transpose, are no new memory)."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.vocab = vocab
        self.largest = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if func.is_view:
            return out
        for tensor in out if isinstance(out, tuple | list) else (out,):
            if (
                isinstance(tensor, torch.Tensor)
                and tensor.dtype == torch.float32
                and tensor.shape[-1:] == (self.vocab,)
            ):
                self.largest = max(self.largest, tensor.numel())
        return out


@pytest.mark.usefixtures("two_token_chunks")
def test_no_batch_by_response_by_vocab_logits_are_made() -> None:
    """Forward and backward of the response log-probs and entropy: no fp32 tensor as large as the
    logits of the response positions ([batch, response, vocab]) ever exists, only chunks."""
    model = random_qwen2()
    input_ids, attention_mask = padded_batch(512)
    batch = input_ids.shape[0]
    with LargestLogits(512) as seen:
        log_probs, entropy = response_log_probs(model, input_ids, attention_mask, RESPONSE_WIDTH, 1.0, True)
        assert entropy is not None
        (log_probs.sum() + entropy.sum()).backward()
    assert seen.largest < batch * RESPONSE_WIDTH * 512
    assert seen.largest == 2 * 512  # one chunk of two positions


# ---------------------------------------------------------------- sum of pi^2 (optimal token baseline)


def test_sum_pi_squared_from_known_logits() -> None:
    # pi = (1/4, 1/4, 1/2): 1/16 + 1/16 + 1/4 = 3/8; uniform over 3: 1/3; two equal huge logits
    # beside a tiny one: 1/2, with no overflow.
    logits = torch.tensor(
        [[2.0, 2.0, 2.0 + torch.log(torch.tensor(2.0)).item()], [0.0, 0.0, 0.0], [1e4, 1e4, -1e4]],
        dtype=torch.float64,
    )
    torch.testing.assert_close(sum_pi_squared_from_logits(logits), torch.tensor([3 / 8, 1 / 3, 1 / 2]).double())


class FixedLogits(nn.Module):
    """A causal LM whose logits are given: [batch, seq, vocab] whatever the input."""

    def __init__(self, logits: torch.Tensor) -> None:
        super().__init__()
        self.fixed = logits

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor) -> Any:
        return SimpleNamespace(logits=self.fixed)


def test_response_sum_pi_squared_by_hand_at_the_masked_tokens() -> None:
    # One prompt token, two response positions; row 1's second response token is padding.
    # Logits at temperature 2 (doubled here): pi = (1/4, 1/4, 1/2) gives 3/8, uniform 1/3,
    # (1/2, 1/2, ~0) gives 1/2.
    half = torch.log(torch.tensor([1.0, 1.0, 2.0]))
    logits = 2 * torch.stack(
        [
            torch.stack([half, torch.zeros(3), torch.zeros(3)]),
            torch.stack([torch.tensor([0.0, 0.0, -30.0]), half, torch.zeros(3)]),
        ]
    )
    input_ids = torch.tensor([[1, 2, 0], [1, 0, 0]])
    attention_mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    scores = response_scores(FixedLogits(logits), input_ids, attention_mask, 2, 2.0, with_sum_pi_squared=True)
    assert scores.sum_pi_squared is not None
    mask = attention_mask[:, -2:].bool()
    torch.testing.assert_close(scores.sum_pi_squared[mask], torch.tensor([3 / 8, 1 / 3, 1 / 2]))
    # The log-probs of the sampled tokens (2, then 0; 0 for row 1) from the same pass.
    torch.testing.assert_close(scores.log_probs[mask], torch.tensor([1 / 2, 1 / 3, 1 / 2]).log(), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("kind", ["llama-tied", "qwen2-untied", "without-logits-to-keep"])
@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
@pytest.mark.usefixtures("two_token_chunks")
def test_response_sum_pi_squared_is_the_tempered_distributions(tmp_path: Path, kind: str, packed: bool) -> None:
    """At every response token (the mask's), sum(pi^2) of softmax(logits / temperature) computed
    the straightforward way; the log-probs come from the same pass unchanged."""
    reference, vocab = make_model(kind, tmp_path)
    reference.eval()
    model = reference
    if packed:
        model = copy.deepcopy(reference)
        enable_packed_attention(model)
    input_ids, attention_mask = padded_batch(vocab)
    mask = attention_mask[:, -RESPONSE_WIDTH:].bool()
    with torch.no_grad():
        scores = response_scores(
            model, input_ids, attention_mask, RESPONSE_WIDTH, 0.7, packed=packed, with_sum_pi_squared=True
        )
        logits = reference(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids_from_mask(attention_mask)
        ).logits
        want_log_probs, _ = full_logits_reference(reference, input_ids, attention_mask, 0.7)
    probs = torch.softmax(logits[:, -RESPONSE_WIDTH - 1 : -1].double() / 0.7, dim=-1)
    want = (probs**2).sum(-1)
    assert scores.sum_pi_squared is not None and scores.entropy is None
    torch.testing.assert_close(scores.sum_pi_squared.double()[mask], want[mask], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(scores.log_probs.double()[mask], want_log_probs[mask], atol=1e-5, rtol=1e-5)
    # sum(pi^2) is at least the sampled token's pi^2, and at most 1.
    assert torch.all(scores.sum_pi_squared[mask] >= scores.log_probs[mask].exp() ** 2 - 1e-6)
    assert torch.all(scores.sum_pi_squared[mask] <= 1 + 1e-6)
    with torch.no_grad():
        without = response_scores(model, input_ids, attention_mask, RESPONSE_WIDTH, 0.7, packed=packed)
    assert without.sum_pi_squared is None


# --- actor.recompute_logits -------------------------------------------------------------------

# The GPU benchmark shape (bench/gpu/grpo_bench.py): micro-batch 16 × (512 response + 1) scored positions, Qwen2.5's vocabulary.
BENCH_TOKENS, BENCH_VOCAB = 16 * 513, 151_936


def test_kept_logits_are_fp32_logits_and_probabilities_with_the_entropy() -> None:
    assert (
        token_scores.kept_logits_bytes(BENCH_TOKENS, BENCH_VOCAB, with_entropy=False) == BENCH_TOKENS * BENCH_VOCAB * 4
    )
    assert (
        token_scores.kept_logits_bytes(BENCH_TOKENS, BENCH_VOCAB, with_entropy=True) == BENCH_TOKENS * BENCH_VOCAB * 8
    )


def test_auto_keeps_the_logits_exactly_when_they_fit_the_budget() -> None:
    kept = token_scores.kept_logits_bytes(BENCH_TOKENS, BENCH_VOCAB, with_entropy=False)  # 4.6 GiB
    h100 = token_scores.LogitsRecompute("auto", 80 * 10**9 // token_scores.LOGITS_BUDGET_SHARE)
    assert not h100.recomputes(BENCH_TOKENS, BENCH_VOCAB, with_entropy=False)
    # With the entropy in the loss the probabilities are kept too: 9.3 GiB, still under 10 GB; a
    # 24 GB card's budget (3 GB) keeps neither.
    assert not h100.recomputes(BENCH_TOKENS, BENCH_VOCAB, with_entropy=True)
    small = token_scores.LogitsRecompute("auto", 24 * 10**9 // token_scores.LOGITS_BUDGET_SHARE)
    assert small.recomputes(BENCH_TOKENS, BENCH_VOCAB, with_entropy=False)
    assert not token_scores.LogitsRecompute("auto", kept).recomputes(BENCH_TOKENS, BENCH_VOCAB, False)
    assert token_scores.LogitsRecompute("auto", kept - 1).recomputes(BENCH_TOKENS, BENCH_VOCAB, False)
    # always and never do not look at the size.
    assert token_scores.LogitsRecompute("always", 2**62).recomputes(1, 1, False)
    assert not token_scores.LogitsRecompute("never", 0).recomputes(BENCH_TOKENS, BENCH_VOCAB, True)


def test_the_logits_budget_on_cpu_is_the_stated_constant() -> None:
    assert token_scores.logits_budget_bytes(torch.device("cpu")) == token_scores.CPU_LOGITS_BUDGET_BYTES


@pytest.mark.usefixtures("two_token_chunks")
@pytest.mark.parametrize(
    ("recompute", "head_runs_per_chunk"),
    [
        (token_scores.LogitsRecompute("always"), 2),
        (token_scores.LogitsRecompute("never"), 1),
        (token_scores.LogitsRecompute("auto", token_scores.CPU_LOGITS_BUDGET_BYTES), 1),  # a few KiB of logits fit
        (token_scores.LogitsRecompute("auto", 0), 2),
    ],
    ids=["always", "never", "auto-fits", "auto-over-budget"],
)
def test_kept_logits_run_the_head_once_and_give_the_recomputed_gradients(
    monkeypatch: pytest.MonkeyPatch, recompute: token_scores.LogitsRecompute, head_runs_per_chunk: int
) -> None:
    """The LM head's chunk (its matmul and the scores) runs in the forward and, recomputed, again
    in the backward; kept, only in the forward. The loss and every gradient are the same."""
    model = random_qwen2()
    input_ids, attention_mask = padded_batch(512)
    response_mask = attention_mask[:, -RESPONSE_WIDTH:].double()
    runs = 0
    chunk_scores = token_scores._chunk_scores

    def counted(*args: Any) -> torch.Tensor:
        nonlocal runs
        runs += 1
        return chunk_scores(*args)

    def loss_and_gradients(recompute: token_scores.LogitsRecompute) -> tuple[torch.Tensor, list[torch.Tensor]]:
        model.zero_grad(set_to_none=True)
        scores = response_scores(
            model, input_ids, attention_mask, RESPONSE_WIDTH, 0.7, with_entropy=True, recompute=recompute
        )
        assert scores.entropy is not None
        loss = ((scores.log_probs.double() - 0.01 * scores.entropy.double()) * response_mask).sum()
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]

    want_loss, want = loss_and_gradients(token_scores.LogitsRecompute("always"))
    monkeypatch.setattr(token_scores, "_chunk_scores", counted)
    loss, got = loss_and_gradients(recompute)
    chunks = -(-input_ids.shape[0] * (RESPONSE_WIDTH + 1) // 2)  # two positions per chunk
    assert runs == head_runs_per_chunk * chunks
    torch.testing.assert_close(loss, want_loss, atol=0, rtol=1e-12)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, atol=1e-7, rtol=1e-6)


# --- the roles read the settings ----------------------------------------------------------------


def role_config(tmp_path: Path, actor: dict[str, Any], critic: dict[str, Any] | None = None) -> Any:
    from rlkube_api.validation import parse_trainer_config  # noqa: PLC0415
    from rlkube_trainer.tiny.task import trainer_config  # noqa: PLC0415

    if not (tmp_path / "model").exists():
        build_model(tmp_path / "model", layers=1)
    raw = trainer_config(tmp_path)
    raw["data"]["train_batch_size"] = 2  # prompts: fsdp_probe's batch of 16 samples is one mini-batch
    raw["actor"].update(ppo_mini_batch_size=2, ppo_micro_batch_size_per_gpu=4, **actor)
    raw["critic"] = {"ppo_micro_batch_size_per_gpu": 4, **(critic or {})}
    return parse_trainer_config(raw)


def test_actor_recompute_logits_never_runs_the_head_once_per_micro_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """actor.recomputeLogits from the config: 4 micro-batches of one chunk each; the update is
    the same either way."""
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    from fsdp_probe import global_batch  # noqa: PLC0415

    from rlkube_trainer.workers.builders import build_actor  # noqa: PLC0415

    chunk_scores = token_scores._chunk_scores
    results = {}
    for mode in ("always", "never"):
        runs = 0

        def counted(*args: Any) -> torch.Tensor:
            nonlocal runs
            runs += 1
            return chunk_scores(*args)

        actor = build_actor(role_config(tmp_path, {"recompute_logits": mode}), torch.device("cpu"), total_steps=10)
        batch = global_batch(int(actor.model.config.vocab_size))  # type: ignore[union-attr]
        batch.old_log_probs = actor.compute_log_prob(batch)
        monkeypatch.setattr(token_scores, "_chunk_scores", counted)
        metrics = actor.update(batch)
        monkeypatch.setattr(token_scores, "_chunk_scores", chunk_scores)
        results[mode] = (runs, metrics, {name: t.clone() for name, t in actor.named_weights()})
    micro_batches = len(batch) // 4
    assert results["always"][0] == 2 * micro_batches
    assert results["never"][0] == micro_batches
    assert results["never"][1] == pytest.approx(results["always"][1], rel=1e-6, abs=1e-7)
    for name, tensor in results["always"][2].items():
        torch.testing.assert_close(results["never"][2][name], tensor, atol=1e-7, rtol=1e-6)


def test_compiled_reference_and_critic_score_as_eager_ones(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """ref.compileDecoderLayers unset follows actor.compileDecoderLayers; critic's is its own.
    aot_eager: dynamo's graphs without inductor's C++ build (a minute per graph on CI's CPU)."""
    import functools  # noqa: PLC0415

    from torch._dynamo.utils import counters  # noqa: PLC0415

    from rlkube_trainer.workers.builders import build_critic, build_reference  # noqa: PLC0415

    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    from fsdp_probe import global_batch  # noqa: PLC0415

    eager_config = role_config(tmp_path, {})
    eager_ref, eager_critic = (
        build_reference(eager_config, torch.device("cpu")),
        build_critic(eager_config, torch.device("cpu"), 10),
    )
    batch = global_batch(int(eager_ref.model.config.vocab_size))  # type: ignore[union-attr]
    want_log_probs, want_values = eager_ref.compute_ref_log_prob(batch), eager_critic.compute_values(batch)

    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="aot_eager"))
    counters.clear()
    config = role_config(tmp_path, {"compile_decoder_layers": True}, {"compile_decoder_layers": True})
    ref, critic = build_reference(config, torch.device("cpu")), build_critic(config, torch.device("cpu"), 10)
    for model in (ref.model, critic.model):
        layers = loading.decoder_layers(model)
        assert layers and all(hasattr(layer.forward, "_torchdynamo_orig_callable") for layer in layers)
    assert not any(
        hasattr(layer.forward, "_torchdynamo_orig_callable") for layer in loading.decoder_layers(eager_ref.model)
    )
    torch.testing.assert_close(ref.compute_ref_log_prob(batch), want_log_probs, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(critic.compute_values(batch), want_values, atol=1e-6, rtol=1e-5)
    assert counters["stats"]["unique_graphs"] > 0
