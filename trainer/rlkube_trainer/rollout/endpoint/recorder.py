"""Per episode, every call's exact tokens, in order, and the episode they add up to. Pure.

A harness sends whole conversations; re-tokenising the text of a turn the model sampled would
train on tokens the model never produced. So each call's prompt is built from the episode's
context as sampled (the earlier calls' prompts and completions, token for token) plus the
template's rendering of what the harness appended since (`prompt_ids` below), and the calls chain
into one `Trajectory` as a multi-turn episode's turns do: each completion is trained on (mask 1,
its log-probs), what came between is masked. A call whose conversation does not extend the
previous one (the harness rewrote or dropped earlier turns) breaks the chain; the episode is
then lost, by name, rather than trained on a context the model never saw.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from rlkube_trainer.rollout.agent.episode import ChatFormat, Message, Trajectory


@dataclass(frozen=True)
class Call:
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]


def _turn(message: Message) -> tuple[str, str, str]:
    """What of a message the chat template renders: role, content and the calls' names and
    arguments (a client echoes an assistant turn back with fields of its own: ids, refusal...)."""
    calls = [
        (c.get("function", {}).get("name"), _arguments(c.get("function", {}).get("arguments")))
        for c in message.get("tool_calls") or []
    ]
    return str(message.get("role")), str(message.get("content") or ""), json.dumps(calls)


def _arguments(text: Any) -> str:
    """A call's arguments, key order aside (a client may re-serialise the JSON we returned)."""
    try:
        return json.dumps(json.loads(text), sort_keys=True)
    except (TypeError, ValueError):
        return str(text)


def extends(before: list[Message], after: list[Message]) -> bool:
    return len(after) > len(before) and all(_turn(a) == _turn(b) for a, b in zip(before, after, strict=False))


@dataclass
class EpisodeRecord:
    episode_id: str
    calls: list[Call] = field(default_factory=list)
    trajectory: Trajectory | None = None
    # The conversation as the episode holds it (chat calls: the messages and the assistant turn
    # returned; completion calls: the prompt text and the completion text), for the next call.
    messages: list[Message] = field(default_factory=list)
    text: str = ""
    reward: float | None = None
    broken: str | None = None

    @property
    def context(self) -> list[int]:
        traj = self.trajectory
        return [] if traj is None else traj.prompt_ids + traj.response_ids

    def chat_prompt(self, messages: list[Message], tools: list[dict[str, Any]], chat: ChatFormat) -> list[int]:
        """The call's prompt: the episode's context plus the template's rendering of the new turns
        when `messages` extends the conversation so far, else the conversation rendered afresh."""
        if self.trajectory is not None and extends(self.messages, messages):
            return self.context + chat.continuation(self.messages, messages, tools)
        return chat.initial(messages, tools)

    def completion_prompt(self, prompt: str, tokenize: Any) -> list[int]:
        """As `chat_prompt`, for a plain text prompt: the context plus the new text's tokens."""
        if self.trajectory is not None and prompt.startswith(self.text) and self.text:
            return self.context + list(tokenize(prompt[len(self.text) :]))
        return list(tokenize(prompt))

    def add(self, call: Call) -> None:
        """Record a call; chain it onto the episode's trajectory."""
        self.calls.append(call)
        if self.trajectory is None:
            self.trajectory = Trajectory(prompt_ids=list(call.prompt_ids))
        else:
            context = self.context
            if call.prompt_ids[: len(context)] != context:
                self.broken = self.broken or f"call {len(self.calls)}'s prompt does not extend the earlier calls"
                return
            self.trajectory.extend(call.prompt_ids[len(context) :], model=False)
            self.trajectory.user_turns += 1
        self.trajectory.extend(call.completion_ids, model=True, logprobs=call.logprobs)
        self.trajectory.assistant_turns += 1
