"""One multi-turn tool-calling episode (verl 0.9.1's `ToolAgentLoop`), and many at once.

Generate, parse tool calls, run them (up to `max_parallel_calls` at once), append their results as
tool turns, and go on until the model answers without a call, a turn or length limit is hit, or a
tool ends the episode (its metrics carry `end_episode: True`). With an interaction, a model turn
without a call is answered by it instead (a user turn and a turn score) until it ends the episode,
as verl 0.5-0.8's `ToolAgentLoop` did. The response is every token after
the prompt; its mask is 1 only on tokens the model sampled, so tool turns get no loss, value or
advantage. Episodes are coroutines: one waiting on a slow tool lets the others generate.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from rlkube_api.config import MultiTurnConfig
from rlkube_trainer.rollout.agent.interaction import BaseInteraction
from rlkube_trainer.rollout.agent.parser import get_parser
from rlkube_trainer.rollout.agent.schemas import FunctionCall
from rlkube_trainer.rollout.agent.tools import Tool, call_tool, truncate

Message = dict[str, Any]


@dataclass(frozen=True)
class Generation:
    token_ids: list[int]
    logprobs: list[float]


# (context token ids, max new tokens) -> the model's continuation.
Generate = Callable[[list[int], int], Awaitable[Generation]]


class ChatFormat(Protocol):
    """Token rendering of messages; the chat template's job."""

    def initial(self, messages: list[Message], tools: list[dict[str, Any]]) -> list[int]: ...

    def decode(self, token_ids: list[int]) -> str: ...

    def continuation(self, before: list[Message], after: list[Message], tools: list[dict[str, Any]]) -> list[int]: ...


@dataclass
class Trajectory:
    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)
    # The sampler's log-prob on model tokens, 0.0 on tool tokens (masked out anyway).
    response_logprobs: list[float] = field(default_factory=list)
    messages: list[Message] = field(default_factory=list)
    assistant_turns: int = 0
    user_turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    malformed_calls: int = 0
    tool_rewards: list[float] = field(default_factory=list)
    tool_seconds: float = 0.0
    # The interaction's score of each of its turns (verl's turn_scores).
    turn_scores: list[float] = field(default_factory=list)

    @property
    def num_turns(self) -> int:
        # verl counts the prompt as a turn: user_turns + assistant_turns + 1.
        return self.user_turns + self.assistant_turns + 1

    def extend(self, ids: Sequence[int], model: bool, logprobs: Sequence[float] | None = None) -> None:
        self.response_ids.extend(ids)
        self.response_mask.extend([1 if model else 0] * len(ids))
        self.response_logprobs.extend(logprobs if logprobs is not None else [0.0] * len(ids))


def _assistant_message(content: str, calls: list[FunctionCall]) -> Message:
    msg: Message = {"role": "assistant", "content": content}
    if calls:
        msg["tool_calls"] = [
            {"type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in calls
        ]
    return msg


async def run_episode(
    messages: list[Message],
    generate: Generate,
    chat: ChatFormat,
    tools: dict[str, Tool],
    section: MultiTurnConfig,
    response_length: int,
    tools_kwargs: dict[str, Any] | None = None,
    interaction: BaseInteraction | None = None,
    interaction_kwargs: dict[str, Any] | None = None,
) -> Trajectory:
    if interaction is None:
        return await _run_episode(messages, generate, chat, tools, section, response_length, tools_kwargs, None, {})
    kwargs = interaction_kwargs or {}
    instance_id = await interaction.start_interaction(None, **kwargs)
    try:
        return await _run_episode(
            messages, generate, chat, tools, section, response_length, tools_kwargs, (interaction, instance_id), kwargs
        )
    finally:
        await interaction.finalize_interaction(instance_id)


async def _run_episode(
    messages: list[Message],
    generate: Generate,
    chat: ChatFormat,
    tools: dict[str, Tool],
    section: MultiTurnConfig,
    response_length: int,
    tools_kwargs: dict[str, Any] | None,
    interaction: tuple[BaseInteraction, str] | None,
    interaction_kwargs: dict[str, Any],
) -> Trajectory:
    parse = get_parser(section.format)
    schemas = [t.tool_schema.model_dump(exclude_none=True) for t in tools.values()]
    history = list(messages)
    traj = Trajectory(prompt_ids=chat.initial(history, schemas))
    while True:
        budget = response_length - len(traj.response_ids)
        gen = await generate(traj.prompt_ids + traj.response_ids, budget)
        traj.extend(gen.token_ids[:budget], model=True, logprobs=gen.logprobs[:budget])
        traj.assistant_turns += 1
        if len(traj.response_ids) >= response_length:
            break
        if section.max_assistant_turns and traj.assistant_turns >= section.max_assistant_turns:
            break
        if section.max_user_turns and traj.user_turns >= section.max_user_turns:
            break
        content, calls, malformed = parse(chat.decode(gen.token_ids))
        traj.malformed_calls += malformed
        calls = calls[: section.max_parallel_calls]
        history.append(_assistant_message(content, calls))
        if not calls:
            if interaction is None:
                break
            before = list(history)
            agent, instance_id = interaction
            end, reply, score, _ = await agent.generate_response(instance_id, history, **interaction_kwargs)
            traj.user_turns += 1
            if score is not None:
                traj.turn_scores.append(float(score))
            history.append({"role": "user", "content": reply})
            delta = chat.continuation(before, history, schemas)
            if len(traj.response_ids) + len(delta) >= response_length:
                break
            # As verl: the reply is appended (out of the mask) even when it ends the episode.
            traj.extend(delta, model=False)
            if end:
                break
            continue
        started = time.monotonic()
        results = await asyncio.gather(*(call_tool(c, tools, tools_kwargs or {}) for c in calls))
        traj.tool_seconds += time.monotonic() - started
        traj.tool_calls += len(calls)
        before = list(history)
        end = False
        for (response, reward, metrics), ok in results:
            traj.tool_errors += 0 if ok else 1
            traj.tool_rewards.append(reward)
            end = end or bool(metrics.get("end_episode"))
            text = truncate(response.text or "", section.max_tool_response_length, section.tool_response_truncate_side)
            history.append({"role": "tool", "content": text})
        if end:
            break
        delta = chat.continuation(before, history, schemas)
        # As verl: a tool turn that would overflow the budget ends the episode unappended.
        if len(traj.response_ids) + len(delta) >= response_length:
            break
        traj.extend(delta, model=False)
        traj.user_turns += 1
    traj.messages = history
    return traj


async def run_episodes(
    prompts: Sequence[list[Message]],
    generate: Generate,
    chat: ChatFormat,
    tools: dict[str, Tool],
    section: MultiTurnConfig,
    response_length: int,
    tools_kwargs: Sequence[dict[str, Any] | None] | None = None,
    interactions: Sequence[tuple[BaseInteraction, dict[str, Any]] | None] | None = None,
) -> list[Trajectory]:
    """All episodes concurrently, in prompt order; `interactions` gives each episode its
    interaction and interaction_kwargs, or None."""
    kwargs = tools_kwargs or [None] * len(prompts)
    users = interactions or [None] * len(prompts)
    return list(
        await asyncio.gather(
            *(
                run_episode(p, generate, chat, tools, section, response_length, k, *(u or (None, None)))
                for p, k, u in zip(prompts, kwargs, users, strict=True)
            )
        )
    )
