"""Messages to tokens through a Hugging Face tokenizer's chat template.

Tool turns are rendered as the template renders them: the tokens appended after the model's
turn are the text the template adds for the new messages (and the next generation prompt), so
the trajectory matches what a fresh render of the conversation would feed the model.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from transformers import PreTrainedTokenizerBase

from rlkube_trainer.rollout.agent.episode import Message


class TemplateChatFormat:
    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("multi-turn rollouts need a tokenizer with a chat template")
        self.tokenizer = tokenizer

    def _render(self, messages: list[Message], tools: list[dict[str, Any]], generation_prompt: bool) -> str:
        schemas: list[dict[Any, Any] | Callable[..., Any]] = list(tools)
        text = self.tokenizer.apply_chat_template(
            messages, tools=schemas or None, add_generation_prompt=generation_prompt, tokenize=False
        )
        assert isinstance(text, str)
        return text

    def initial(self, messages: list[Message], tools: list[dict[str, Any]]) -> list[int]:
        return self._ids(self._render(messages, tools, generation_prompt=True))

    def decode(self, token_ids: list[int]) -> str:
        return str(self.tokenizer.decode(token_ids, skip_special_tokens=False))

    def continuation(self, before: list[Message], after: list[Message], tools: list[dict[str, Any]]) -> list[int]:
        prefix = self._render(before, tools, generation_prompt=False)
        full = self._render(after, tools, generation_prompt=True)
        if not full.startswith(prefix):
            # verl's tokenization sanity check: a template that rewrites earlier turns (some strip
            # reasoning from past assistant turns) cannot be extended token by token.
            raise ValueError("the chat template renders earlier turns differently once tool turns follow")
        return self._ids(full[len(prefix) :])

    def _ids(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
