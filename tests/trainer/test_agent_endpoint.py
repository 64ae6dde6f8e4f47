"""The OpenAI-compatible endpoint against the real vLLM CPU engine, driven by harnesses that are
plain Python programs using the `openai` client: every call's tokens and log-probs are recorded
exactly as the engine produced them and chain into one masked trajectory per episode, and a
harness that crashes, hangs or never reports a reward loses only its own episode.
"""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from tiny_model import build_tiny_model, cpu_engine
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from rlkube_trainer.batch import build_batch
from rlkube_trainer.data.prompts import Prompt
from rlkube_trainer.rollout import RolloutBatch, RolloutEngine, SamplingConfig
from rlkube_trainer.rollout.endpoint.harness import Outcome, run_episodes
from rlkube_trainer.rollout.endpoint.samples import training_sample
from rlkube_trainer.rollout.endpoint.server import Endpoint

pytestmark = pytest.mark.trainer

TOKEN = "job-token"
MAX_TOKENS = 12
# The user's harness: two chat calls (the second continues the first's conversation), or two
# completion calls when asked, then the reward; `mode` makes it misbehave.
HARNESS = """
import json, os, sys, time, urllib.request
from openai import OpenAI

task = json.loads(os.environ["RLKUBE_EPISODE"])
mode = task["extra_info"]["mode"]
client = OpenAI()  # OPENAI_BASE_URL and OPENAI_API_KEY from the environment
messages = list(task["prompt"])
if mode == "completion":  # the same two calls through /v1/completions, the text continued
    prompt = "key c:"
    first = client.completions.create(model="policy", prompt=prompt, max_tokens=8).choices[0].text
    second = client.completions.create(model="policy", prompt=prompt + first + " and then?").choices[0].text
    seen = {"contents": [first, second]}
else:
    first = client.chat.completions.create(model="policy", messages=messages, max_tokens=8)
    if mode == "crash":
        raise RuntimeError("the harness fell over")
    if mode == "hang":
        time.sleep(600)
    messages += [first.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "and then?"}]
    second = client.chat.completions.create(model="policy", messages=messages)
    seen = {"contents": [first.choices[0].message.content, second.choices[0].message.content]}
with open(task["extra_info"]["out"], "w") as out:
    json.dump(seen, out)
if mode != "silent":
    request = urllib.request.Request(
        os.environ["RLKUBE_REWARD_URL"],
        data=json.dumps({"reward": 0.5}).encode(),
        headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "Content-Type": "application/json"},
    )
    urllib.request.urlopen(request).read()
"""


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("agent-endpoint")
    build_tiny_model(root / "model", vocab=512, seed=0)
    (root / "harness.py").write_text(HARNESS)
    return root


@pytest.fixture(scope="module")
def engine(workdir: Path) -> Iterator[RolloutEngine]:
    with cpu_engine(workdir / "model") as eng:
        yield eng


@pytest.fixture(scope="module")
def tokenizer(workdir: Path) -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(workdir / "model")


@pytest.fixture(scope="module")
def endpoint(engine: RolloutEngine, tokenizer: PreTrainedTokenizerBase) -> Iterator[tuple[Endpoint, str]]:
    served = Endpoint(engine, tokenizer, SamplingConfig(temperature=0.0, max_tokens=MAX_TOKENS), TOKEN)
    try:
        yield served, served.serve()
    finally:
        served.close()


def task(workdir: Path, mode: str) -> dict[str, object]:
    return {
        "prompt": [{"role": "user", "content": "key c"}],
        "extra_info": {"mode": mode, "out": str(workdir / f"seen-{mode}.json")},
    }


MODES = ["chat", "completion", "crash", "silent"]
# Generous, and costing nothing: these harnesses end on their own (the openai import alone took
# 7 s on a loaded 2-core machine).
TIMEOUT = 120
# The hanging harness's own batch: its deadline is all it holds the test for, started or not.
HANG_TIMEOUT = 3


@pytest.fixture(scope="module")
def outcomes(workdir: Path, endpoint: tuple[Endpoint, str]) -> dict[str, Outcome]:
    """One batch: a chat harness, a completion harness and two that misbehave, all at once;
    then one that hangs, alone, killed at its deadline."""
    served, url = endpoint
    command = [sys.executable, str(workdir / "harness.py")]
    ran = run_episodes(served, url, command, [task(workdir, m) for m in MODES], TIMEOUT, True)
    [hung] = run_episodes(served, url, command, [task(workdir, "hang")], HANG_TIMEOUT, True, prefix="hang")
    return {**dict(zip(MODES, ran, strict=True)), "hang": hung}


def test_harnesses_drive_two_calls_and_their_tokens_are_the_engines(
    workdir: Path, engine: RolloutEngine, tokenizer: PreTrainedTokenizerBase, outcomes: dict[str, Outcome]
) -> None:
    new_turns = {
        "chat": "<|im_start|>user\nand then?<|im_end|>\n<|im_start|>assistant\n",
        "completion": " and then?",
    }
    for mode in ("chat", "completion"):
        outcome = outcomes[mode]
        assert outcome.lost is None and outcome.record is not None, outcome.lost
        record = outcome.record
        assert record.reward == 0.5 and len(record.calls) == 2
        first, second = record.calls
        # The recorded tokens and log-probs are the engine's own for the recorded prompt (greedy);
        # the log-probs up to float32 rounding, which differs with the batch a call shared (seen:
        # 2e-6 between the harnesses' batch and this call alone).
        for call, budget in ((first, 8), (second, MAX_TOKENS)):
            [sample] = engine.generate([call.prompt_ids], SamplingConfig(temperature=0.0, max_tokens=budget)).samples
            assert call.completion_ids == sample.token_ids and len(call.completion_ids) == budget
            assert call.logprobs == pytest.approx(sample.logprobs, rel=0, abs=1e-5)
        # The harness got the engine's tokens as text ...
        seen = json.loads((workdir / f"seen-{mode}.json").read_text())
        assert seen["contents"] == [tokenizer.decode(c.completion_ids, skip_special_tokens=True) for c in record.calls]
        # ... and the second call's prompt is the first call's context token for token (no
        # re-tokenised text), then the new turn's tokens.
        new_ids = list(tokenizer(new_turns[mode], add_special_tokens=False)["input_ids"])
        assert second.prompt_ids == first.prompt_ids + first.completion_ids + new_ids


def test_misbehaving_harnesses_lose_only_their_episodes(outcomes: dict[str, Outcome]) -> None:
    lost = {m: o.lost for m, o in outcomes.items() if o.lost}
    assert set(lost) == {"crash", "hang", "silent"}, lost
    assert "exited with code 1: RuntimeError: the harness fell over" in str(lost["crash"])
    assert f"ran past {HANG_TIMEOUT} s" in str(lost["hang"]) and "reported no reward" in str(lost["silent"])


def test_the_calls_of_an_episode_chain_into_one_masked_trajectory(outcomes: dict[str, Outcome]) -> None:
    for mode in ("chat", "completion"):
        record = outcomes[mode].record
        assert record is not None and record.broken is None and record.trajectory is not None
        traj = record.trajectory
        # Both completions trained (mask 1, their log-probs), the turn between them masked.
        first, second = record.calls
        gap = len(second.prompt_ids) - len(first.prompt_ids) - len(first.completion_ids)
        assert traj.prompt_ids == first.prompt_ids
        assert traj.response_ids == second.prompt_ids[len(first.prompt_ids) :] + second.completion_ids
        assert traj.response_mask == [1] * len(first.completion_ids) + [0] * gap + [1] * len(second.completion_ids)
        assert traj.response_logprobs == first.logprobs + [0.0] * gap + second.logprobs


def test_calls_without_the_jobs_token_are_refused(endpoint: tuple[Endpoint, str]) -> None:
    served, url = endpoint
    served.open("e")
    for header in ({}, {"Authorization": "Bearer wrong"}):
        request = urllib.request.Request(
            f"{url}/episodes/e/v1/chat/completions",
            data=json.dumps({"messages": [{"role": "user", "content": "hi"}]}).encode(),
            headers=header,
        )
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request)
        assert refused.value.code == 401
    assert served.close_episode("e").calls == []


def test_finished_episodes_become_training_rows_trained_only_on_completions(
    outcomes: dict[str, Outcome], tokenizer: PreTrainedTokenizerBase
) -> None:
    records = [outcomes[m].record for m in ("chat", "completion")]
    assert all(r is not None for r in records)
    samples = [training_sample(i, r, 16, True) for i, r in enumerate(records) if r is not None]
    prompts = [Prompt(i, f"#{i}", [0], "", "", "harness", None, {}) for i in range(2)]
    batch = build_batch(prompts, RolloutBatch(samples, 1), int(tokenizer.pad_token_id))
    for row, record in enumerate(records):
        assert record is not None and record.trajectory is not None
        kept = record.trajectory.response_mask[:16]
        assert batch.response_mask[row, : len(kept)].tolist() == [float(m) for m in kept]
        assert batch.response_mask[row, len(kept) :].sum() == 0
        assert samples[row].finish_reason == ("length" if len(record.trajectory.response_ids) >= 16 else "stop")
        assert samples[row].reward_info is not None and samples[row].reward_info["harness_reward"] == 0.5
