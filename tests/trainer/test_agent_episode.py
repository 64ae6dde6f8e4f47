"""The multi-turn episode: trajectory and mask, what the mask does to advantages and gradients,
concurrency under a slow tool, and an episode against the real vLLM CPU engine.

One vLLM engine for the module (the last test); the rest use the tiny model's real tokenizer and
chat template with scripted model turns, so the trajectory is known exactly.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from tiny_model import build_tiny_model, cpu_engine
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

from rlkube_api.config import MultiTurnConfig
from rlkube_trainer.algos import (
    compute_gae_advantage_return,
    compute_policy_loss,
    compute_reinforce_plus_plus_outcome_advantage,
)
from rlkube_trainer.batch import build_batch, token_level_scores
from rlkube_trainer.data.prompts import Prompt
from rlkube_trainer.rollout import RolloutBatch, RolloutEngine, SamplingConfig
from rlkube_trainer.rollout.agent.chat_format import TemplateChatFormat
from rlkube_trainer.rollout.agent.engine_adapter import BatchingGenerator
from rlkube_trainer.rollout.agent.episode import Generation, Trajectory, run_episode
from rlkube_trainer.rollout.agent.sampler import to_sample
from rlkube_trainer.rollout.agent.tools import FunctionTool, Tool, function_tool

pytestmark = pytest.mark.trainer

CALL = '<tool_call>{"name": "lookup", "arguments": {"key": "moon"}}</tool_call><|im_end|>'
ANSWER = "It is 42.<|im_end|>"
TABLE = {"moon": "42"}


@function_tool
def lookup(key: str) -> str:
    """Look a key up in the table.

    Args:
        key: The key.
    """
    return TABLE.get(key, "not found")


def tools() -> dict[str, Tool]:
    tool: FunctionTool = lookup.__rlkube_function_tool__  # type: ignore[attr-defined]
    return {"lookup": tool}


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("agent"), vocab=512, seed=0)


@pytest.fixture(scope="module")
def tokenizer(model_path: Path) -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(model_path)


def scripted(tokenizer: PreTrainedTokenizerBase, turns: list[str], delay: float = 0.0):  # type: ignore[no-untyped-def]
    """A Generate that plays `turns` in order for one episode."""
    queue = list(turns)

    async def generate(context: list[int], max_tokens: int) -> Generation:
        await asyncio.sleep(delay)
        ids = list(tokenizer(queue.pop(0), add_special_tokens=False)["input_ids"])[:max_tokens]
        return Generation(ids, [-0.5] * len(ids))

    return generate


def episode(tokenizer: PreTrainedTokenizerBase, response_length: int, **limits: int) -> Trajectory:
    """The moon lookup episode under rollout.multi_turn limits `limits` (MultiTurnConfig's fields)."""
    return asyncio.run(
        run_episode(
            [{"role": "user", "content": "What is the moon's number?"}],
            scripted(tokenizer, [CALL, ANSWER]),
            TemplateChatFormat(tokenizer),
            tools(),
            MultiTurnConfig.model_validate(limits),
            response_length,
        )
    )


def test_trajectory_masks_exactly_the_tool_turn(tokenizer: PreTrainedTokenizerBase) -> None:
    traj = episode(tokenizer, 200)
    ids = lambda s: list(tokenizer(s, add_special_tokens=False)["input_ids"])  # noqa: E731
    tool_turn = ids("<|im_start|>tool\n42<|im_end|>\n<|im_start|>assistant\n")
    assert traj.response_ids == ids(CALL) + tool_turn + ids(ANSWER)
    assert traj.response_mask == [1] * len(ids(CALL)) + [0] * len(tool_turn) + [1] * len(ids(ANSWER))
    assert traj.response_logprobs == [-0.5] * len(ids(CALL)) + [0.0] * len(tool_turn) + [-0.5] * len(ids(ANSWER))
    assert traj.prompt_ids == ids("<|im_start|>user\nWhat is the moon's number?<|im_end|>\n<|im_start|>assistant\n")
    assert (traj.assistant_turns, traj.user_turns, traj.num_turns, traj.tool_calls, traj.tool_errors) == (2, 1, 4, 1, 0)
    assert traj.messages[-1] == {"role": "assistant", "content": "It is 42.<|im_end|>"}


def test_turn_and_length_limits_end_the_episode(tokenizer: PreTrainedTokenizerBase) -> None:
    one_turn = episode(tokenizer, 200, max_assistant_turns=1)
    assert one_turn.assistant_turns == 1 and one_turn.tool_calls == 0 and set(one_turn.response_mask) == {1}
    n_call = len(tokenizer(CALL, add_special_tokens=False)["input_ids"])
    # Room for the call but not the tool turn: verl ends the episode without appending it.
    short = episode(tokenizer, n_call + 5)
    assert len(short.response_ids) == n_call and short.tool_calls == 1 and short.user_turns == 0
    truncated = episode(tokenizer, 10)
    assert len(truncated.response_ids) == 10 and truncated.assistant_turns == 1


def test_masked_tool_span_gets_no_gradient_advantage_or_value_influence(
    tokenizer: PreTrainedTokenizerBase, model_path: Path
) -> None:
    traj = episode(tokenizer, 200)
    mask = torch.tensor([traj.response_mask], dtype=torch.float32)
    n_resp, n_prompt = mask.shape[1], len(traj.prompt_ids)
    reward = torch.zeros_like(mask)
    reward[0, -1] = 1.0

    # REINFORCE++ (verl 0.9.1): the final reward reaches the first turn across the tool span,
    # which holds return 0; the first turn's last token gets gamma ** (tokens of the 2nd turn).
    _, ret = compute_reinforce_plus_plus_outcome_advantage(reward, mask, gamma=0.9)
    first_end = traj.response_mask.index(0) - 1
    n_answer = n_resp - traj.response_mask[first_end + 1 :].index(1) - first_end - 1
    assert torch.all(ret[0][mask[0] == 0] == 0)
    assert ret[0, first_end].item() == pytest.approx(0.9**n_answer, rel=1e-5)

    # GAE: values on the tool span change nothing on the model's tokens.
    values = torch.randn(1, n_resp, generator=torch.Generator().manual_seed(0))
    other = values.clone()
    other[mask == 0] += 100.0
    adv_a, _ = compute_gae_advantage_return(reward, values, mask, gamma=1.0, lam=0.95)
    adv_b, _ = compute_gae_advantage_return(reward, other, mask, gamma=1.0, lam=0.95)
    assert torch.allclose(adv_a[mask == 1], adv_b[mask == 1], atol=1e-5)

    # The policy loss through the real tiny model: zero gradient on the logits at tool tokens.
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    ids = torch.tensor([traj.prompt_ids + traj.response_ids])
    logits = model(ids).logits[:, n_prompt - 1 : -1]
    logits.retain_grad()
    log_prob = torch.log_softmax(logits, -1).gather(-1, ids[:, n_prompt:, None])[..., 0]
    old = log_prob.detach()  # on-policy: ratio 1, nothing clipped, so every model token has a gradient
    loss, *_ = compute_policy_loss(old, log_prob, adv_a, mask, cliprange=0.2)
    loss.backward()
    assert logits.grad is not None
    per_token = logits.grad.abs().sum(-1)[0]
    assert torch.all(per_token[mask[0] == 0] == 0)
    assert torch.all(per_token[mask[0] == 1] > 0)


def test_a_slow_tool_does_not_serialise_the_episodes(tokenizer: PreTrainedTokenizerBase) -> None:
    delay, n = 0.5, 8

    def slow(key: str) -> str:
        """Slow lookup.

        Args:
            key: The key.
        """
        time.sleep(delay)
        return TABLE[key]

    slow_tools: dict[str, Tool] = {"lookup": function_tool(name="lookup")(slow).__rlkube_function_tool__}
    chat = TemplateChatFormat(tokenizer)
    section = MultiTurnConfig()

    async def main() -> list[Trajectory]:
        return await asyncio.gather(
            *(
                run_episode(
                    [{"role": "user", "content": f"q{i}"}],
                    scripted(tokenizer, [CALL, ANSWER], 0.01),
                    chat,
                    slow_tools,
                    section,
                    200,
                )
                for i in range(n)
            )
        )

    started = time.monotonic()
    trajs = asyncio.run(main())
    wall = time.monotonic() - started
    assert all(t.tool_calls == 1 and t.tool_errors == 0 for t in trajs)
    # Serialised, the tools alone would take n * delay = 4 s.
    assert wall / (n * delay) < 0.4, f"{n} episodes with a {delay}s tool took {wall:.2f}s"


@pytest.fixture(scope="module")
def engine(model_path: Path) -> Iterator[RolloutEngine]:
    with cpu_engine(model_path, max_model_len=512) as eng:
        yield eng


def test_episodes_against_the_vllm_engine(engine: RolloutEngine, tokenizer: PreTrainedTokenizerBase) -> None:
    """The first turn is a scripted tool call (a random model never writes one); the engine then
    continues after the tool turn, batched across episodes, with its own log-probs."""
    # With log-probs, as a run that needs them asks (the sampling decides; none unless asked).
    sampler = BatchingGenerator(engine, SamplingConfig(temperature=0.0, max_tokens=1, logprobs=True))
    call_ids = list(tokenizer(CALL, add_special_tokens=False)["input_ids"])
    # The tools run in worker threads and finish in any order: the second turns are held
    # until all four are asked for, so that they are waiting together when the engine is.
    episodes, asked, all_asked = 4, [0], asyncio.Event()

    def first_turn_scripted():  # type: ignore[no-untyped-def]
        turns = [0]

        async def generate(context: list[int], max_tokens: int) -> Generation:
            turns[0] += 1
            if turns[0] == 1:
                return Generation(call_ids, [0.0] * len(call_ids))
            asked[0] += 1
            if asked[0] == episodes:
                all_asked.set()
            await all_asked.wait()
            return await sampler(context, min(max_tokens, 12))

        return generate

    section = MultiTurnConfig(max_assistant_turns=2)
    chat = TemplateChatFormat(tokenizer)

    async def main() -> list[Trajectory]:
        return await asyncio.gather(
            *(
                run_episode([{"role": "user", "content": c * 8}], first_turn_scripted(), chat, tools(), section, 120)
                for c in "abcd"
            )
        )

    trajs = asyncio.run(main())
    assert sampler.batches == [4], "the four second turns should reach the engine as one batch"
    for traj in trajs:
        assert traj.assistant_turns == 2 and traj.tool_calls == 1
        second = [i for i, m in enumerate(traj.response_mask) if m][len(call_ids) :]
        assert len(second) == 12 and second[-1] == len(traj.response_ids) - 1
        # Greedy: the engine's continuation is what the tiny HF model would pick after the tool turn.
        sampled = [traj.response_logprobs[i] for i in second]
        assert all(lp <= 0.0 for lp in sampled) and any(lp < 0.0 for lp in sampled)
        tool_text = tokenizer.decode([t for t, m in zip(traj.response_ids, traj.response_mask, strict=True) if not m])
        assert tool_text == "<|im_start|>tool\n42<|im_end|>\n<|im_start|>assistant\n"


def test_agent_batch_attends_everything_but_trains_only_model_tokens(tokenizer: PreTrainedTokenizerBase) -> None:
    full = episode(tokenizer, 200)
    one = episode(tokenizer, 200, max_assistant_turns=1)
    # The step's batch: each episode becomes a RolloutSample (sampler.to_sample) with its own
    # rendered prompt and mask, padded into a TrainBatch by build_batch.
    rollout = RolloutBatch([to_sample(0, full, 200, True), to_sample(0, one, 200, True)], n=2)
    prompt = Prompt(0, "q0", [0], "q", [{"role": "user", "content": "q"}], "t", None, None)
    batch = build_batch([prompt], rollout, pad_token_id=int(tokenizer.pad_token_id))
    assert batch.group_index.tolist() == [0, 0]
    assert batch.prompt_lengths.tolist() == [len(full.prompt_ids)] * 2  # the episode's prompt, not the row's
    assert batch.rollout_log_probs is not None
    assert batch.rollout_log_probs[0, : len(full.response_ids)].tolist() == full.response_logprobs
    n_prompt = batch.input_ids.shape[1] - batch.response_length
    assert batch.response_mask[0].tolist() == [float(m) for m in full.response_mask]
    assert batch.attention_mask[0, n_prompt:].tolist() == [1] * len(full.response_ids)  # tool turn attended
    assert batch.response_mask[1].tolist() == [1.0] * len(one.response_ids) + [0.0] * (
        len(full.response_ids) - len(one.response_ids)
    )
    # The outcome score lands on the last model token, not inside the response.
    scores = token_level_scores([1.0, 2.0], batch.response_mask)
    assert scores[0, len(full.response_ids) - 1] == 1.0 and scores[0].sum() == 1.0
    assert scores[1, len(one.response_ids) - 1] == 2.0


def test_parallel_call_cap_truncation_and_a_tool_ending_the_episode(tokenizer: PreTrainedTokenizerBase) -> None:
    def finish(answer: str) -> tuple[str, float, dict[str, bool]]:
        """Submit the answer.

        Args:
            answer: The answer.
        """
        return "x" * 50, 1.0, {"end_episode": answer == "42"}

    both = tools() | {"finish": function_tool(finish).__rlkube_function_tool__}
    two = CALL.replace("<|im_end|>", "") + '<tool_call>{"name": "finish", "arguments": {"answer": "7"}}</tool_call>'
    chat = TemplateChatFormat(tokenizer)
    user = [{"role": "user", "content": "q"}]

    def run(turns: list[str], section: MultiTurnConfig) -> Trajectory:
        return asyncio.run(run_episode(user, scripted(tokenizer, turns), chat, both, section, 300))

    capped = run([two, ANSWER], MultiTurnConfig(max_parallel_calls=1))
    assert capped.tool_calls == 1 and capped.tool_rewards == [0.0]
    parallel = run(
        [two, ANSWER],
        MultiTurnConfig(max_parallel_calls=2, max_tool_response_length=8, tool_response_truncate_side="right"),
    )
    assert parallel.tool_calls == 2 and parallel.tool_rewards == [0.0, 1.0]
    assert parallel.messages[-2]["content"] == "xxxxxxxx...(truncated)"
    ending = '<tool_call>{"name": "finish", "arguments": {"answer": "42"}}</tool_call>'
    ended = run([ending, ANSWER], MultiTurnConfig())
    assert ended.assistant_turns == 1 and ended.tool_rewards == [1.0] and set(ended.response_mask) == {1}
