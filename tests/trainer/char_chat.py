"""A character-level chat format and scripted model turns for multi-turn episodes without a
model: one token per character, so every span of a trajectory can be counted by hand."""

from __future__ import annotations

from typing import Any

from rlkube_trainer.rollout.agent.episode import Generate, Generation, Message


class CharChat:
    """One token per character: `role: content;` per message, so every span is countable."""

    def render(self, messages: list[Message]) -> str:
        return "".join(f"{m['role']}: {m['content']};" for m in messages)

    def initial(self, messages: list[Message], tools: list[dict[str, Any]]) -> list[int]:
        return [ord(c) for c in self.render(messages)]

    def decode(self, token_ids: list[int]) -> str:
        return "".join(chr(t) for t in token_ids)

    def continuation(self, before: list[Message], after: list[Message], tools: list[dict[str, Any]]) -> list[int]:
        return [ord(c) for c in self.render(after[len(before) :])]


def scripted(turns: list[str]) -> Generate:
    """The model's turns, in order, one per generate call."""
    queue = list(turns)

    async def generate(context: list[int], max_tokens: int) -> Generation:
        ids = [ord(c) for c in queue.pop(0)][:max_tokens]
        return Generation(ids, [-0.5] * len(ids))

    return generate
