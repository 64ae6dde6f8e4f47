"""Partial rollouts (`async_training.partial_rollout`): a weight push interrupts the generation
in flight, its unfinished samples go on with the new weights, and every token records the weight
version that produced it.

The pure parts first: the samples' splice (rollout/partial.py), the push around a generation
(async_training/partial_rollout.py), the per-token versions through the batch into verl's
`training/off_policy/trajectory_*` metrics, and the one-step-off schedule pushing into a
generation in flight. Then the real CPU vLLM engine: a generation paused at a step boundary,
new weights loaded, resumed; its tokens before the pause are W0's greedy continuation, those
after it W1's continuation of the prompt and the tokens so far, each marked with its version,
and their log-probs are those of the weights that sampled them.

One vLLM engine for the module (see test_rollout.py on why engines stay open until the module
ends); every engine test puts W0 back and says which version it resumes with.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, cast

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
from tiny_model import build_tiny_model
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlkube_api.placement import Role
from rlkube_api.validation import parse_trainer_config
from rlkube_trainer import rollout as rollout_module
from rlkube_trainer.batch import build_batch
from rlkube_trainer.cluster.ray_group import concurrency_of
from rlkube_trainer.data.prompts import Prompt
from rlkube_trainer.loop.async_training.partial_rollout import (
    interruptible_rollout,
    push_into_generation,
    token_version_metrics,
)
from rlkube_trainer.loop.async_training.schedule import OneStepOff
from rlkube_trainer.loop.async_training.staleness import OffPolicyBuffer, Taken, span_of
from rlkube_trainer.model.fsdp import Rendezvous
from rlkube_trainer.rollout import (
    RolloutBatch,
    RolloutEngine,
    RolloutSample,
    SamplingConfig,
    build_rollout_engine,
    partial,
)
from rlkube_trainer.tiny import task as tiny_task
from rlkube_trainer.workers.rank import RankSpec

# --- the splice (rollout/partial.py) ----------------------------------------------------------------


def test_start_lays_out_n_samples_per_prompt_in_prompt_order() -> None:
    samples = partial.start(2, 3, logprobs=True)
    assert [(s.prompt_index, s.sample_index) for s in samples] == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    assert all(s.logprobs == [] and not s.finished for s in samples)
    assert all(s.logprobs is None for s in partial.start(1, 2, logprobs=False))


def test_an_interrupted_sample_resumes_from_its_tokens_and_keeps_each_tokens_version() -> None:
    prompt = [7, 8, 9]
    (sample,) = partial.start(1, 1, logprobs=True)
    partial.extend(sample, [1, 2, 3], [-0.1, -0.2, -0.3], version=4, finish_reason=None)
    partial.interrupted(sample, max_tokens=8)
    assert partial.unfinished([sample]) == [sample]  # budget left: it resumes
    assert partial.resume_prompt(prompt, sample) == [7, 8, 9, 1, 2, 3]
    assert partial.remaining_tokens(8, sample) == 5
    partial.extend(sample, [4, 5], [-0.4, -0.5], version=5, finish_reason=None)  # interrupted again
    partial.extend(sample, [6], [-0.6], version=6, finish_reason="stop")
    assert partial.unfinished([sample]) == []
    result = partial.to_sample(sample)
    assert result == RolloutSample(
        prompt_index=0,
        token_ids=[1, 2, 3, 4, 5, 6],
        logprobs=[-0.1, -0.2, -0.3, -0.4, -0.5, -0.6],
        finish_reason="stop",
        token_versions=[4, 4, 4, 5, 5, 6],
    )
    result.token_ids.append(99)  # a copy: the in-flight record is not shared
    assert sample.token_ids == [1, 2, 3, 4, 5, 6]


def test_an_interrupted_sample_with_no_budget_left_finishes_as_length() -> None:
    (sample,) = partial.start(1, 1, logprobs=False)
    partial.extend(sample, [1, 2, 3, 4], None, version=0, finish_reason=None)
    partial.interrupted(sample, max_tokens=4)
    assert sample.finish_reason == "length" and partial.unfinished([sample]) == []
    (stopped,) = partial.start(1, 1, logprobs=False)
    partial.extend(stopped, [1], None, version=0, finish_reason="stop")
    partial.interrupted(stopped, max_tokens=1)
    assert stopped.finish_reason == "stop"  # a finished sample keeps its reason


def test_a_sample_interrupted_before_its_first_token_resumes_from_the_prompt() -> None:
    (sample,) = partial.start(1, 1, logprobs=False)
    partial.interrupted(sample, max_tokens=4)
    assert not sample.finished and partial.resume_prompt([5, 6], sample) == [5, 6]
    partial.extend(sample, [1, 2], None, version=3, finish_reason="length")
    assert partial.to_sample(sample).token_versions == [3, 3]


def test_the_splice_refuses_what_would_misalign_tokens_log_probs_and_versions() -> None:
    (sample,) = partial.start(1, 1, logprobs=True)
    with pytest.raises(ValueError, match="2 tokens but 1 log-probs"):
        partial.extend(sample, [1, 2], [-0.1], version=0, finish_reason=None)
    with pytest.raises(ValueError, match="for every part of a sample or for none"):
        partial.extend(sample, [1], None, version=0, finish_reason=None)
    assert sample.token_ids == [] and sample.token_versions == []  # nothing half-appended
    with pytest.raises(ValueError, match="unfinished"):
        partial.to_sample(sample)
    partial.extend(sample, [1], [-0.1], version=0, finish_reason="stop")
    with pytest.raises(ValueError, match="already finished"):
        partial.extend(sample, [2], [-0.2], version=1, finish_reason=None)


# --- the push around a generation (async_training/partial_rollout.py) ------------------------------


class FakeRollout:
    def __init__(self) -> None:
        self.calls: list[tuple[str, int | None]] = []

    def pause_generation(self) -> None:
        self.calls.append(("pause", None))

    def resume_generation(self, weight_version: int) -> None:
        self.calls.append(("resume", weight_version))


def test_a_push_pauses_the_generation_loads_weights_and_resumes_it_with_the_new_version() -> None:
    rollout = FakeRollout()

    def sync() -> int:
        rollout.calls.append(("sync", None))
        return 1234

    assert push_into_generation(rollout, sync, held=2, pushed=3) == 1234
    assert rollout.calls == [("pause", None), ("sync", None), ("resume", 3)]


def test_a_failed_push_resumes_the_generation_with_the_weights_still_held() -> None:
    rollout = FakeRollout()

    def sync() -> int:
        raise RuntimeError("broadcast failed")

    with pytest.raises(RuntimeError, match="broadcast failed"):
        push_into_generation(rollout, sync, held=2, pushed=3)
    assert rollout.calls == [("pause", None), ("resume", 2)]  # never left paused


def tiny_config(tmp_path: Path, **async_training: Any) -> Any:
    raw = tiny_task.trainer_config(tmp_path, "grpo", 2)
    raw["trainer"]["v1"] = {"trainer_mode": "colocate_async"}
    raw["rollout"]["free_cache_engine"] = False
    raw["async_training"] = async_training
    return parse_trainer_config(raw)


def test_the_interruptible_rollout(tmp_path: Path) -> None:
    on, off = tiny_config(tmp_path, partial_rollout=True), tiny_config(tmp_path)
    assert interruptible_rollout(off, object()) is None
    rollout = FakeRollout()
    assert interruptible_rollout(on, rollout) is rollout
    with pytest.raises(TypeError, match="object cannot pause generation"):
        interruptible_rollout(on, object())


def test_the_config_reaches_the_vllm_engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}
    monkeypatch.setattr(rollout_module, "build_rollout_engine", lambda name, **kwargs: seen.update(kwargs))
    rollout_module.build_engine(tiny_config(tmp_path, partial_rollout=True), torch.device("cpu"))
    assert seen["partial_rollout"] is True
    rollout_module.build_engine(tiny_config(tmp_path), torch.device("cpu"))
    assert seen["partial_rollout"] is False


# --- per-token versions into the batch and verl's metrics -----------------------------------------


def prompt(index: int, ids: list[int]) -> Prompt:
    return Prompt(index, f"f#{index}", ids, "", "", "test", None, None)


def test_token_versions_go_into_the_batch_padded_with_minus_one() -> None:
    samples = [
        RolloutSample(0, [5, 6, 7], None, "length", token_versions=[3, 3, 4]),
        RolloutSample(0, [8], None, "stop", token_versions=[4]),
        RolloutSample(1, [], None, "stop", token_versions=[]),
        RolloutSample(1, [9, 9, 9], None, "length", token_versions=[2, 3, 4]),
    ]
    batch = build_batch([prompt(0, [1, 2]), prompt(1, [3])], RolloutBatch(samples, 2), pad_token_id=0)
    assert batch.token_versions is not None
    assert batch.token_versions.tolist() == [[3, 3, 4], [4, -1, -1], [-1, -1, -1], [2, 3, 4]]
    # verl's spans and staleness per trajectory, trained at version 5; the sample with no token
    # counts as generated with the version its generation began with (2).
    metrics = token_version_metrics(batch, current_version=5, begun=2)
    assert metrics["training/off_policy/trajectory_spans/max"] == 3.0  # versions 2..4
    assert metrics["training/off_policy/trajectory_spans/min"] == 1.0
    assert metrics["training/off_policy/trajectory_spans/mean"] == (2 + 1 + 1 + 3) / 4
    # staleness: current - newest version used; worst: current - oldest.
    assert metrics["training/off_policy/trajectory_staleness/max"] == 3.0
    assert metrics["training/off_policy/trajectory_staleness/mean"] == (1 + 1 + 3 + 1) / 4
    assert metrics["training/off_policy/trajectory_staleness_worst/max"] == 3.0
    assert metrics["training/off_policy/trajectory_staleness_worst/mean"] == (2 + 1 + 3 + 3) / 4


def test_versions_are_all_or_nothing_in_a_batch() -> None:
    samples = [RolloutSample(0, [5], None, "stop", token_versions=[1]), RolloutSample(0, [6], None, "stop")]
    batch = build_batch([prompt(0, [1])], RolloutBatch(samples, 2), pad_token_id=0)
    assert batch.token_versions is None
    with pytest.raises(ValueError, match="no token_versions"):
        token_version_metrics(batch, current_version=1, begun=0)


def test_whole_groups_of_one_version_give_the_same_metrics_as_the_buffer() -> None:
    """Without an interruption the per-token metrics agree with the buffer's per-group ones."""
    samples = [RolloutSample(0, [5, 6], None, "length", token_versions=[2, 2])] * 2
    batch = build_batch([prompt(0, [1])], RolloutBatch(samples, 2), pad_token_id=0)
    buffer: OffPolicyBuffer[None] = OffPolicyBuffer(None)
    buffer.begin(2)
    buffer.put([None], 2)
    taken = cast(Taken[None], buffer.take(1, 3))
    per_group = {k: v for k, v in taken.metrics(3).items() if "trajectory" in k}
    assert token_version_metrics(batch, current_version=3, begun=2) == per_group


# --- the schedule pushes into a generation in flight ---------------------------------------------


class InterruptibleSides:
    """A generation of two "tokens": one with the weights held when it starts, one after the
    next push (or a short wait when none comes); it reports the version of each."""

    def __init__(self) -> None:
        self.engine_weights = 0
        self.actor = 0
        self.started = threading.Condition()
        self.generations = 0  # started, with their first token
        self.pushed = threading.Event()
        self.pushes: list[int] = []
        self.trained: list[tuple[int, list[int]]] = []  # (version trained at, the group's tokens)
        self.tags: list[int] = []

    def generate(self) -> list[list[int]]:
        tokens = [self.engine_weights]
        with self.started:
            self.generations += 1
            self.started.notify_all()
        self.pushed.wait(0.2)
        self.pushed.clear()
        tokens.append(self.engine_weights)
        return [tokens]

    def push(self) -> None:
        self.engine_weights = self.actor
        self.pushes.append(self.actor)
        self.pushed.set()

    def train(self, taken: Taken[list[int]], version: int) -> dict[str, float]:
        for group in taken.groups:
            self.trained.append((version, group.item))
            self.tags.append(group.version)
        with self.started:  # the next generation has its first token before the update ends
            assert self.started.wait_for(lambda: self.generations > len(self.trained), timeout=5)
        self.actor += 1
        return {}


@pytest.mark.parametrize("strategy", ["drop", "wait"])
def test_the_schedule_pushes_into_the_generation_in_flight_and_bounds_its_oldest_token(strategy: str) -> None:
    sides = InterruptibleSides()
    buffer: OffPolicyBuffer[list[int]] = OffPolicyBuffer(2, strategy)  # type: ignore[arg-type]
    schedule = OneStepOff(buffer, 1, 1, sides.generate, sides.push, partial_rollout=True)
    rows = list(schedule.run(6, sides.train))
    assert len(rows) == 6 and len(sides.trained) == 6
    # Each group is tagged with the version it began with, its oldest token: the bound holds on it.
    assert sides.tags == [tokens[0] for _, tokens in sides.trained]
    assert all(span_of(tokens[0], version) <= 2 for version, tokens in sides.trained)
    # After the first, every generation was interrupted by the push that followed an update, and
    # went on with those weights: its second token is one version newer.
    assert [tokens for _, tokens in sides.trained[1:]] == [[v, v + 1] for v in range(5)]
    assert sides.pushes == [1, 2, 3, 4, 5]


def test_without_partial_rollouts_no_push_enters_a_generation() -> None:
    sides = InterruptibleSides()
    buffer: OffPolicyBuffer[list[int]] = OffPolicyBuffer(2, "drop")
    schedule = OneStepOff(buffer, 1, 1, sides.generate, sides.push)
    list(schedule.run(3, sides.train))
    assert all(tokens[0] == tokens[1] for _, tokens in sides.trained)


# --- the real CPU vLLM engine ----------------------------------------------------------------------

VLLM_KWARGS = {
    "dtype": "float32",
    "kv_cache_memory_bytes": 64 * 2**20,
    "max_model_len": 256,
    "enforce_eager": True,
    "seed": 0,
    "device": "cpu",
}
MESSAGES = ["hi", "What is 12 + 30?", "Write one line about the sea, please."]
MAX_TOKENS = 12
GREEDY = SamplingConfig(n=1, temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
PAUSE_AFTER_STEPS = 4


@pytest.fixture(scope="module")
def w0_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("w0"), vocab=512, seed=0)


def named_weights(path: Path) -> dict[str, torch.Tensor]:
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    return {name: param.detach().clone() for name, param in model.named_parameters()}


@pytest.fixture(scope="module")
def w1_path(w0_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """W0 plus a seeded random delta on every parameter."""
    model = AutoModelForCausalLM.from_pretrained(w0_path, dtype=torch.float32)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * 0.1)
    path = tmp_path_factory.mktemp("w1")
    model.save_pretrained(path)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(w0_path / name, path / name)
    return path


@pytest.fixture(scope="module")
def prompts(w0_path: Path) -> list[list[int]]:
    tokenizer = AutoTokenizer.from_pretrained(w0_path)
    result = []
    for text in MESSAGES:
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True, return_dict=False
        )
        result.append(cast(list[int], ids))
    return result


@pytest.fixture(scope="module")
def engine(w0_path: Path) -> Iterator[RolloutEngine]:
    with build_rollout_engine("vllm", model_path=w0_path, partial_rollout=True, **VLLM_KWARGS) as engine:
        yield engine


@pytest.fixture
def at_w0(engine: RolloutEngine, w0_path: Path) -> Iterator[RolloutEngine]:
    """The engine with W0, version 0, unpaused; W0 is loaded back afterwards."""
    engine.resume_generation(0)
    yield engine
    engine.update_weights(named_weights(w0_path).items())
    engine.resume_generation(0)


class HoldAtStep:
    """Wraps the vLLM engine's `step`: after `steps` steps the generating thread waits at that
    step boundary until a pause is asked for, so the pause lands there and nowhere else."""

    def __init__(self, engine: RolloutEngine, steps: int, monkeypatch: pytest.MonkeyPatch) -> None:
        self.engine = engine
        llm_engine = engine._llm.llm_engine  # type: ignore[attr-defined]
        self.inner = llm_engine.step
        self.steps = steps
        self.count = 0
        self.reached = threading.Event()
        monkeypatch.setattr(llm_engine, "step", self)

    def __call__(self) -> Any:
        out = self.inner()
        self.count += 1
        if self.count == self.steps:
            self.reached.set()
            deadline = time.monotonic() + 30
            while not self.engine._resumable.pause_requested and time.monotonic() < deadline:  # type: ignore[attr-defined]
                time.sleep(0.001)
            time.sleep(0.05)  # the step ends a little after the pause is asked for: the pause waits
        return out


def generate_across_an_update(
    engine: RolloutEngine,
    prompts: list[list[int]],
    sampling: SamplingConfig,
    new_weights: dict[str, torch.Tensor],
    monkeypatch: pytest.MonkeyPatch,
) -> RolloutBatch:
    """Generate on a thread; pause it after PAUSE_AFTER_STEPS steps, load `new_weights` as
    version 1, resume, and return what it generated."""
    hold = HoldAtStep(engine, PAUSE_AFTER_STEPS, monkeypatch)
    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(engine.generate, prompts, sampling)
        assert hold.reached.wait(120), "the generation never reached the step to pause at"
        engine.pause_generation()
        # Returned once the engine is idle: the step in flight ended, its unfinished requests were
        # aborted (their tokens kept), and the generation waits for resume_generation.
        assert not engine._llm.llm_engine.has_unfinished_requests()  # type: ignore[attr-defined]
        assert not future.done()
        engine.update_weights(new_weights.items())
        engine.resume_generation(1)
        return future.result(timeout=120)


def split_at_update(sample: RolloutSample) -> int:
    """How many of the sample's tokens came before the update: versions must read 0...0 1...1."""
    assert sample.token_versions is not None and len(sample.token_versions) == len(sample.token_ids)
    before = sample.token_versions.count(0)
    assert sample.token_versions == [0] * before + [1] * (len(sample.token_ids) - before)
    return before


@pytest.mark.trainer
def test_an_uninterrupted_generation_marks_every_token_with_the_version_held(
    at_w0: RolloutEngine, prompts: list[list[int]]
) -> None:
    at_w0.resume_generation(7)  # no pause first: resume only names the version now held
    batch = at_w0.generate(prompts, SamplingConfig(n=2, temperature=1.0, max_tokens=MAX_TOKENS, seed=3))
    assert [s.prompt_index for s in batch] == [0, 0, 1, 1, 2, 2]
    for sample in batch:
        assert sample.token_versions == [7] * len(sample.token_ids)
        assert sample.logprobs is not None and len(sample.logprobs) == len(sample.token_ids)
        assert 1 <= len(sample.token_ids) <= MAX_TOKENS


@pytest.mark.trainer
def test_greedy_tokens_before_the_update_are_w0s_and_after_it_w1s(
    at_w0: RolloutEngine, prompts: list[list[int]], w1_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = at_w0
    w0_greedy = [s.token_ids for s in engine.generate(prompts, GREEDY)]
    batch = generate_across_an_update(engine, prompts, GREEDY, named_weights(w1_path), monkeypatch)
    assert len(batch) == len(prompts)
    w0_went_on = False
    for sample, w0_tokens in zip(batch, w0_greedy, strict=True):
        assert len(sample.token_ids) == MAX_TOKENS and sample.finish_reason == "length"  # it finished
        before = split_at_update(sample)
        assert 1 <= before < MAX_TOKENS  # interrupted mid-sample
        assert sample.token_ids[:before] == w0_tokens[:before]
        # The rest is W1's greedy continuation of the prompt and the tokens so far.
        resumed = prompts[sample.prompt_index] + sample.token_ids[:before]
        rest = SamplingConfig(n=1, temperature=0.0, max_tokens=MAX_TOKENS - before, ignore_eos=True)
        (w1_tokens,) = engine.generate([resumed], rest)
        assert sample.token_ids[before:] == w1_tokens.token_ids
        w0_went_on |= sample.token_ids[before:] != w0_tokens[before:]
    assert w0_went_on  # W1 really took over: some sample leaves W0's path


def hf_token_logprobs(path: Path, prompt_ids: list[int], tokens: list[int]) -> list[float]:
    model: Any = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    with torch.no_grad():
        logits = model(torch.tensor([prompt_ids + tokens])).logits[0, len(prompt_ids) - 1 : -1]
    return torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(tokens)[:, None])[:, 0].tolist()


@pytest.mark.trainer
def test_sampled_log_probs_are_those_of_the_weights_that_sampled_each_token(
    at_w0: RolloutEngine, prompts: list[list[int]], w0_path: Path, w1_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sampling = SamplingConfig(n=2, temperature=1.0, max_tokens=MAX_TOKENS, seed=5, ignore_eos=True)
    batch = generate_across_an_update(at_w0, prompts, sampling, named_weights(w1_path), monkeypatch)
    assert [s.prompt_index for s in batch] == [0, 0, 1, 1, 2, 2]
    for sample in batch:
        before = split_at_update(sample)
        assert 1 <= before < MAX_TOKENS and len(sample.token_ids) == MAX_TOKENS
        assert sample.logprobs is not None
        prompt_ids = prompts[sample.prompt_index]
        expected = hf_token_logprobs(w0_path, prompt_ids, sample.token_ids)[:before]
        expected += hf_token_logprobs(w1_path, prompt_ids, sample.token_ids)[before:]
        for got, want in zip(sample.logprobs, expected, strict=True):
            assert abs(got - want) <= 2e-3, (sample.logprobs, expected)


@pytest.mark.trainer
def test_a_generation_asked_for_while_paused_waits_for_the_resume(
    at_w0: RolloutEngine, prompts: list[list[int]]
) -> None:
    at_w0.pause_generation()  # idle: returns at once
    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(at_w0.generate, prompts[:1], GREEDY)
        time.sleep(0.5)
        assert not future.done()
        at_w0.resume_generation(3)
        (sample,) = future.result(timeout=120)
    assert sample.token_versions == [3] * MAX_TOKENS


@pytest.mark.trainer
def test_engines_without_partial_rollouts_refuse_to_pause(w0_path: Path) -> None:
    with (
        build_rollout_engine("hf", model_path=w0_path) as hf,
        pytest.raises(NotImplementedError, match=r"async_training\.partial_rollout"),
    ):
        hf.pause_generation()


# --- the rank's threads through Ray (ray_group.py) -------------------------------------------------


def _spec(hosts: set[Role], tp: int = 1) -> RankSpec:
    return RankSpec(Role.ACTOR, 0, Rendezvous("127.0.0.1", 0, 1, 0), frozenset(hosts), 1, tensor_parallel_size=tp)


def test_generation_leaves_the_default_thread_only_where_it_can_be_paused() -> None:
    """A Ray actor runs one call at a time: a rank hosting a one-process engine generates on a
    thread of its own and takes pause/resume on another; a tensor-parallel engine's generation
    keeps the default thread, in order with the rank's collectives (the API refuses partial
    rollouts there); a rank without an engine has nothing to leave."""
    separate = concurrency_of([_spec({Role.ROLLOUT})])
    assert separate["generate"] != separate["pause_generation"] == separate["resume_generation"]
    assert "update_actor" not in separate and "receive_weights" not in separate
    assert concurrency_of([_spec({Role.ACTOR, Role.ROLLOUT})]) == separate  # colocated, tensor parallel 1
    assert concurrency_of([_spec({Role.ACTOR, Role.ROLLOUT}, tp=2)]) == {}
    assert concurrency_of([_spec({Role.ACTOR})]) == {}
