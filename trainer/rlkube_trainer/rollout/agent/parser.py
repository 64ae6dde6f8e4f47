"""Tool-call parsers (verl 0.9.1's `rollout.multi_turn.format`), text in, calls out. Pure.

Only "hermes" exists so far: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, the
format of Qwen2.5/Qwen3 and Hermes chat templates.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable

from rlkube_trainer.rollout.agent.schemas import FunctionCall

_HERMES_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


def parse_hermes(text: str) -> tuple[str, list[FunctionCall], int]:
    """(content without the calls, well-formed calls, number of malformed calls).

    As verl does, a call whose body is not JSON with `name` and `arguments` is dropped (and here
    counted, so the rollout can report it as a tool-call error metric).
    """
    if "<tool_call>" not in text or "</tool_call>" not in text:
        return text, [], 0
    calls: list[FunctionCall] = []
    malformed = 0
    for body in _HERMES_CALL.findall(text):
        try:
            obj = json.loads(body)
            name, arguments = obj["name"], obj["arguments"]
            if not isinstance(name, str):
                raise TypeError("name is not a string")
        except (json.JSONDecodeError, KeyError, TypeError):
            malformed += 1
            continue
        calls.append(FunctionCall(name=name, arguments=json.dumps(arguments, ensure_ascii=False)))
    return _HERMES_CALL.sub("", text), calls, malformed


PARSERS: dict[str, Callable[[str], tuple[str, list[FunctionCall], int]]] = {"hermes": parse_hermes}


def get_parser(name: str) -> Callable[[str], tuple[str, list[FunctionCall], int]]:
    if name not in PARSERS:
        raise ValueError(f"rollout.multi_turn.format {name!r} is not supported; supported: {sorted(PARSERS)}")
    return PARSERS[name]
