"""rollout.multi_turn's sampling: each prompt's samples are whole tool-calling episodes.

It takes the place of one engine call in the step (PPOTrainer.generate): every prompt is played
`n` times (`run_episodes`, concurrently, the engine requests batched by `BatchingGenerator`), and
each episode comes back as one `RolloutSample` whose response is the whole trajectory after the
prompt, tool and interaction turns included, with a mask that is 1 only on the model's own tokens.
The reward function then reads the decoded trajectory, as verl's reward managers read an agent
loop's response, and finds the episode's turn count and its interaction's and tools' rewards in
extra_info (verl's `num_turns` and `rollout_reward_scores`).
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

from transformers import PreTrainedTokenizerBase

from rlkube_api.config import MultiTurnConfig, TrainerConfig
from rlkube_trainer.data.prompts import Prompt, RawPrompt
from rlkube_trainer.rollout.agent.chat_format import TemplateChatFormat
from rlkube_trainer.rollout.agent.config import load_interaction_config, load_tools
from rlkube_trainer.rollout.agent.engine_adapter import BatchingGenerator, Engine
from rlkube_trainer.rollout.agent.episode import Message, Trajectory, run_episodes
from rlkube_trainer.rollout.agent.interaction import BaseInteraction, pick_interaction
from rlkube_trainer.rollout.base import RolloutBatch, RolloutSample, SamplingConfig


def messages_of(raw_prompt: RawPrompt) -> list[Message]:
    """A row's prompt as chat messages (a plain string is one user turn)."""
    if isinstance(raw_prompt, str):
        return [{"role": "user", "content": raw_prompt}]
    return [dict(m) for m in raw_prompt]


def tools_kwargs_of(prompt: Prompt) -> dict[str, Any]:
    """verl's extra_info.tools_kwargs: per-row arguments of each tool's create/execute."""
    extra = prompt.extra_info if isinstance(prompt.extra_info, dict) else {}
    kwargs = extra.get("tools_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise ValueError(f"{prompt.uid}: extra_info.tools_kwargs must be a mapping of tool name to arguments")
    return kwargs


def interaction_of(
    prompt: Prompt, interactions: dict[str, BaseInteraction]
) -> tuple[BaseInteraction, dict[str, Any]] | None:
    """verl's extra_info.interaction_kwargs: which interaction plays the user (`name`) and the
    arguments of its calls (the answer it checks, ...). None when no interaction is configured."""
    if not interactions:
        return None
    extra = prompt.extra_info if isinstance(prompt.extra_info, dict) else {}
    kwargs = extra.get("interaction_kwargs")
    if kwargs is None:
        kwargs = {}
    if not isinstance(kwargs, dict):
        raise ValueError(f"{prompt.uid}: extra_info.interaction_kwargs must be a mapping")
    return pick_interaction(interactions, kwargs, prompt.uid), kwargs


def episode_numbers(traj: Trajectory, interaction: bool = False) -> dict[str, float]:
    """One episode's numbers under the metric names they are reported with: verl's num_turns,
    tool_call_counts and agent_loop/tool_calls (seconds in tools); errors and malformed calls
    are rlkube's own (verl drops malformed calls silently)."""
    numbers = {
        "num_turns": float(traj.num_turns),
        "tool_call_counts": float(traj.tool_calls),
        "tool_call_errors": float(traj.tool_errors),
        "malformed_tool_calls": float(traj.malformed_calls),
        "agent_loop/tool_calls": traj.tool_seconds,
    }
    if interaction:  # the sum of the interaction's turn scores, only when there is one
        numbers["interaction_turn_scores"] = sum(traj.turn_scores)
    return numbers


def to_sample(
    prompt_index: int, traj: Trajectory, response_length: int, with_logprobs: bool, interaction: bool = False
) -> RolloutSample:
    return RolloutSample(
        prompt_index=prompt_index,
        token_ids=traj.response_ids,
        logprobs=traj.response_logprobs if with_logprobs else None,
        finish_reason="length" if len(traj.response_ids) >= response_length else "stop",
        prompt_token_ids=traj.prompt_ids,
        response_mask=traj.response_mask,
        episode=episode_numbers(traj, interaction),
        reward_info={
            "num_turns": traj.num_turns,
            "rollout_reward_scores": {"turn_scores": list(traj.turn_scores), "tool_rewards": list(traj.tool_rewards)},
        },
    )


class EpisodeSampler:
    """The tools, interactions and chat format of a run, loaded once; `generate` per step. The
    episodes' limits are read from `section` itself, the API's validated rollout.multi_turn."""

    def __init__(
        self,
        engine: Engine,
        tokenizer: PreTrainedTokenizerBase,
        section: MultiTurnConfig,
        response_length: int,
        max_prompt_length: int | None = None,
    ) -> None:
        self.engine = engine
        self.section = section
        self.response_length = response_length
        self.max_prompt_length = max_prompt_length
        self.tools = load_tools(section)
        self.interactions = load_interaction_config(section)
        self.chat = TemplateChatFormat(tokenizer)

    def generate(self, prompts: list[Prompt], sampling: SamplingConfig) -> RolloutBatch:
        """`sampling.n` episodes per prompt, grouped in prompt order as an engine's samples are."""
        self.check_prompt_lengths(prompts)
        order = [i for i in range(len(prompts)) for _ in range(sampling.n)]
        # One continuation per request: the n samples of a prompt are n episodes, each its own
        # request in the engine's batch (and so its own seed).
        generate = BatchingGenerator(self.engine, replace(sampling, n=1))
        trajs = asyncio.run(
            run_episodes(
                [messages_of(prompts[i].raw_prompt) for i in order],
                generate,
                self.chat,
                self.tools,
                self.section,
                self.response_length,
                [tools_kwargs_of(prompts[i]) for i in order],
                [interaction_of(prompts[i], self.interactions) for i in order],
            )
        )
        samples = [
            to_sample(i, t, self.response_length, sampling.logprobs, bool(self.interactions))
            for i, t in zip(order, trajs, strict=True)
        ]
        return RolloutBatch(samples, sampling.n)

    def check_prompt_lengths(self, prompts: list[Prompt]) -> None:
        """A chat template that renders the tools' schemas into the prompt makes it longer than the
        dataset's check saw; the engine's context (max_prompt_length + max_response_length) would
        then overflow mid-episode, so it is refused here, by name, before any generation."""
        if self.max_prompt_length is None:
            return
        schemas = [t.tool_schema.model_dump(exclude_none=True) for t in self.tools.values()]
        for prompt in prompts:
            length = len(self.chat.initial(messages_of(prompt.raw_prompt), schemas))
            if length > self.max_prompt_length:
                raise ValueError(
                    f"{prompt.uid}: the prompt with the tools' schemas rendered by the chat template is "
                    f"{length} tokens, more than data.max_prompt_length={self.max_prompt_length}; raise it"
                )


def episode_sampler(engine: Engine, tokenizer: PreTrainedTokenizerBase, config: TrainerConfig) -> EpisodeSampler | None:
    """The run's episode sampler, or None when rollout.multi_turn is off (one response per sample)."""
    section, data = config.rollout.multi_turn, config.data
    if not section.enable:
        return None
    return EpisodeSampler(engine, tokenizer, section, data.max_response_length, data.max_prompt_length)
