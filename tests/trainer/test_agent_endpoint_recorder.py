"""The recorder's chaining of an episode's calls, without an engine: a conversation that extends
the previous call's continues its tokens; one that rewrites an earlier turn breaks the chain."""

from __future__ import annotations

from typing import Any

from rlkube_trainer.rollout.endpoint.recorder import Call, EpisodeRecord, extends


class WordChat:
    """Each message one token per word; enough of a chat format to see what the recorder keeps."""

    def __init__(self) -> None:
        self.vocab: dict[str, int] = {}

    def _ids(self, messages: list[dict[str, Any]]) -> list[int]:
        words = [w for m in messages for w in (m["role"], *str(m.get("content") or "").split())]
        return [self.vocab.setdefault(w, len(self.vocab) + 100) for w in words]

    def initial(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[int]:
        return self._ids(messages)

    def decode(self, token_ids: list[int]) -> str:
        return ""

    def continuation(
        self, before: list[dict[str, Any]], after: list[dict[str, Any]], tools: list[dict[str, Any]]
    ) -> list[int]:
        return self._ids(after[len(before) :])


def test_calls_that_extend_the_conversation_chain_and_a_rewrite_breaks_it() -> None:
    chat, record = WordChat(), EpisodeRecord("e")
    user = [{"role": "user", "content": "key c"}]
    first = record.chat_prompt(user, [], chat)
    record.add(Call(first, [7, 8], [-0.5, -0.25]))  # the sampled tokens, which re-render differently
    echoed = {
        "role": "assistant",
        "content": "seven",
        "tool_calls": [{"id": "x", "function": {"name": "f", "arguments": '{"b": 1, "a": 2}'}}],
    }
    record.messages = [*user, {**echoed, "tool_calls": [{"function": {"name": "f", "arguments": '{"a": 2, "b": 1}'}}]}]
    second_messages = [*user, echoed, {"role": "tool", "content": "3"}]
    assert extends(record.messages, second_messages)  # ids and key order aside
    second = record.chat_prompt(second_messages, [], chat)
    tool_turn = chat._ids([{"role": "tool", "content": "3"}])
    assert second == [*first, 7, 8, *tool_turn]
    record.add(Call(second, [9], [-1.0]))
    assert record.trajectory is not None and record.broken is None
    assert record.trajectory.response_mask == [1, 1, 0, 0, 1]
    assert record.trajectory.response_logprobs == [-0.5, -0.25, 0.0, 0.0, -1.0]

    record.messages = [*second_messages, {"role": "assistant", "content": "nine"}]
    rewritten = [{"role": "user", "content": "key d"}, {"role": "user", "content": "again"}]
    assert not extends(record.messages, rewritten)
    third = record.chat_prompt(rewritten, [], chat)
    record.add(Call(third, [5], [-0.1]))
    assert record.broken == "call 3's prompt does not extend the earlier calls"
    assert len(record.calls) == 3 and record.trajectory.response_ids == [7, 8, *tool_turn, 9]
