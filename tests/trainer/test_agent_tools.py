"""Tool-call parsing, tool schemas and the tool contracts of the multi-turn rollout (pure, fast)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from rlkube_api.config import MultiTurnConfig, SandboxConfig
from rlkube_trainer.rollout.agent.code_interpreter import CodeInterpreterTool
from rlkube_trainer.rollout.agent.config import load_interaction_config, load_tools
from rlkube_trainer.rollout.agent.parser import get_parser, parse_hermes
from rlkube_trainer.rollout.agent.sandbox import SandboxLimits
from rlkube_trainer.rollout.agent.schemas import FunctionCall, FunctionSchema, FunctionToolSchema, ToolResponse
from rlkube_trainer.rollout.agent.tools import (
    BaseTool,
    FunctionTool,
    Tool,
    ToolResult,
    call_tool,
    load_function_tools,
    normalize_return,
    schema_from_function,
    truncate,
)

pytestmark = pytest.mark.trainer


def test_hermes_parses_calls_and_strips_them_from_content() -> None:
    text = (
        'Let me look.<tool_call>{"name": "lookup", "arguments": {"key": "a"}}</tool_call>'
        '<tool_call>\n{"name": "add", "arguments": {"x": 1, "y": 2}}\n</tool_call>done'
    )
    content, calls, malformed = parse_hermes(text)
    assert content == "Let me look.done"
    assert [c.name for c in calls] == ["lookup", "add"]
    assert json.loads(calls[1].arguments) == {"x": 1, "y": 2}
    assert malformed == 0


def test_hermes_counts_malformed_calls_and_ignores_plain_text() -> None:
    text = '<tool_call>{"name": "x"}</tool_call><tool_call>not json</tool_call><tool_call>{"name": "ok", "arguments": {}}</tool_call>'
    _, calls, malformed = parse_hermes(text)
    assert [c.name for c in calls] == ["ok"] and malformed == 2
    assert parse_hermes("no calls <tool_call> here") == ("no calls <tool_call> here", [], 0)


def test_unknown_format_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"rollout\.multi_turn\.format 'gpt-oss'"):
        get_parser("gpt-oss")


def lookup(key: str, limit: int = 3) -> str:
    """Look a key up in the table.

    Args:
        key: The key to look up.
        limit: How many entries at most.
    """
    return f"{key}:{limit}"


def test_schema_is_inferred_from_signature_and_docstring() -> None:
    schema = schema_from_function(lookup)
    assert schema.type == "function" and schema.function.name == "lookup"
    assert schema.function.description == "Look a key up in the table."
    props = schema.function.parameters.properties
    assert props["key"].type == "string" and props["key"].description == "The key to look up."
    assert props["limit"].type == "integer"
    assert schema.function.parameters.required == ["key"]


def test_variadic_function_is_refused() -> None:
    def bad(*args: int) -> int:
        """Bad.

        Args:
            args: numbers.
        """
        return 0

    with pytest.raises(ValueError, match="variadic"):
        schema_from_function(bad)


def test_function_tool_path_loads_decorated_functions(tmp_path: Path) -> None:
    path = tmp_path / "tools.py"
    path.write_text(
        "from rlkube_trainer.tools import function_tool\n\n"
        "@function_tool\n"
        "def double(x: int) -> int:\n"
        '    """Double a number.\n\n    Args:\n        x: The number.\n    """\n'
        "    return 2 * x\n\n"
        "@function_tool(name='shout')\n"
        "def loud(text: str) -> str:\n"
        '    """Upper-case text.\n\n    Args:\n        text: The text.\n    """\n'
        "    return text.upper()\n\n"
        "def helper() -> None:\n    pass\n"
    )
    tools = load_function_tools(path)
    assert [t.name for t in tools] == ["double", "shout"]
    result, ok = asyncio.run(call_tool(FunctionCall(name="shout", arguments='{"text": "hi"}'), {"shout": tools[1]}, {}))
    assert ok and result[0].text == "HI"
    (tmp_path / "empty.py").write_text("x = 1\n")
    with pytest.raises(ValueError, match=r"function_tool_path .* defines no @function_tool"):
        load_function_tools(tmp_path / "empty.py")
    with pytest.raises(FileNotFoundError, match="function_tool_path"):
        load_function_tools(tmp_path / "missing.py")


def test_normalize_return_takes_verls_shapes() -> None:
    assert normalize_return("x") == (ToolResponse(text="x"), 0.0, {})
    assert normalize_return({"a": 1}) == (ToolResponse(text='{"a": 1}'), 0.0, {})
    assert normalize_return(("y", 0.5)) == (ToolResponse(text="y"), 0.5, {})
    assert normalize_return(("y", None, {"m": 1})) == (ToolResponse(text="y"), 0.0, {"m": 1})
    assert normalize_return(7) == (ToolResponse(text="7"), 0.0, {})
    with pytest.raises(TypeError):
        normalize_return(())


def test_truncate_sides() -> None:
    text = "abcdefghij"
    assert truncate(text, 20, "middle") == text
    assert truncate(text, 4, "left") == "(truncated)...ghij"
    assert truncate(text, 4, "right") == "abcd...(truncated)"
    assert truncate(text, 4, "middle") == "ab...(truncated)...ij"


class Counter(BaseTool):
    """A stateful tool: state per instance (one instance per call), with a per-call reward."""

    def __init__(self) -> None:
        super().__init__({}, FunctionToolSchema(function=FunctionSchema(name="counter", description="Count.")))
        self.state: dict[str, int] = {}
        self.released: list[str] = []

    async def create(self, instance_id: str | None = None, **kwargs: Any) -> tuple[str, ToolResponse]:
        iid = f"i{len(self.state)}"
        self.state[iid] = int(kwargs["create_kwargs"].get("start", 0))
        return iid, ToolResponse()

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any) -> ToolResult:
        self.state[instance_id] += int(parameters["by"])
        if self.state[instance_id] < 0:
            raise RuntimeError("negative")
        return ToolResponse(text=str(self.state[instance_id])), 0.25, {}

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        self.released.append(instance_id)


def test_stateful_tool_lifecycle_reward_and_errors() -> None:
    counter = Counter()
    tools: dict[str, Tool] = {"counter": counter}
    kwargs = {"counter": {"create_kwargs": {"start": 10}}}
    (response, reward, _), ok = asyncio.run(
        call_tool(FunctionCall(name="counter", arguments='{"by": 5}'), tools, kwargs)
    )
    assert ok and response.text == "15" and reward == 0.25 and counter.released == ["i0"]
    # A tool's exception, bad JSON and an unknown name each reach the model as a tool message.
    (response, _, _), ok = asyncio.run(call_tool(FunctionCall(name="counter", arguments='{"by": -99}'), tools, kwargs))
    assert not ok and response.text == "Error executing tool 'counter': negative" and counter.released == ["i0", "i1"]
    (response, _, _), ok = asyncio.run(call_tool(FunctionCall(name="counter", arguments="{oops"), tools, kwargs))
    assert not ok and (response.text or "").startswith("Invalid JSON in arguments for 'counter'")
    (response, _, _), ok = asyncio.run(call_tool(FunctionCall(name="nope", arguments="{}"), tools, kwargs))
    assert not ok and response.text == "Unknown function 'nope'. Available tools: ['counter']"


def test_code_interpreter_returns_output_and_clear_errors() -> None:
    tool = CodeInterpreterTool(limits=SandboxLimits(cpu_seconds=2, wall_seconds=3.0))
    tools: dict[str, Tool] = {"code_interpreter": tool}

    def run(code: str) -> str:
        (response, _, _), _ = asyncio.run(
            call_tool(FunctionCall(name="code_interpreter", arguments=json.dumps({"code": code})), tools, {})
        )
        return response.text or ""

    assert run("print(6 * 7)") == "42\n"
    assert run("raise ValueError('bad input')") == "Error: ValueError: bad input"
    assert run("while True: pass").startswith("Error: ")  # CPU rlimit or wall-clock kill, named
    assert isinstance(tool, BaseTool) and not isinstance(tool, FunctionTool)


def test_the_api_refuses_the_multi_turn_input_the_loop_cannot_run() -> None:
    """The loop reads the API's validated section as it is: keys verl has and rlkube does not run,
    unknown keys and out-of-range limits are refused by MultiTurnConfig, naming the field."""
    for keys, field in (
        ({"use_inference_chat_template": True}, "use_inference_chat_template"),
        ({"num_repeat_rollouts": 2}, "num_repeat_rollouts"),
        ({"tokenization_sanity_check_mode": "disable"}, "tokenization_sanity_check_mode"),
        ({"bogus": 1}, "bogus"),
        ({"tool_response_truncate_side": "top"}, "tool_response_truncate_side"),
        ({"format": "gpt-oss"}, "format"),
        ({"max_parallel_calls": 0}, "max_parallel_calls"),
        ({"max_tool_response_length": 0}, "max_tool_response_length"),
    ):
        with pytest.raises(ValidationError, match=rf"(?m)^{field}$"):
            MultiTurnConfig.model_validate(keys)


def test_a_config_map_outside_an_rljob_is_refused_by_the_trainer() -> None:
    # Valid for the API (an RLJob's spec); only the trainer knows the operator did not resolve it.
    section = MultiTurnConfig(enable=True, config_map={"name": "tools"}, tool_config_path="tools.yaml")
    with pytest.raises(ValueError, match=r"rollout\.multi_turn\.config_map is resolved to file paths by the operator"):
        load_tools(section)
    with pytest.raises(ValueError, match=r"rollout\.multi_turn\.config_map is resolved"):
        load_interaction_config(section)


def test_the_sandbox_section_names_only_sandbox_limits() -> None:
    """Each of the API's sandbox fields is a limit of the sandbox, under the same name."""
    assert set(SandboxConfig.model_fields) <= set(SandboxLimits.__dataclass_fields__)


def test_tool_config_path_builds_stateful_tools(tmp_path: Path) -> None:
    path = tmp_path / "tools.yaml"
    path.write_text(
        "tools:\n"
        "  - class_name: rlkube_trainer.tools.CodeInterpreterTool\n"
        "    config: {type: native, cpu_seconds: 1, wall_seconds: 2.0}\n"
        "    tool_schema:\n"
        "      type: function\n"
        "      function:\n"
        "        name: python\n"
        "        description: Run Python.\n"
        "        parameters: {type: object, properties: {code: {type: string}}, required: [code]}\n"
    )
    section = MultiTurnConfig(enable=True, tool_config_path=str(path))
    tools = load_tools(section)
    tool = tools["python"]
    assert isinstance(tool, CodeInterpreterTool) and tool.limits.cpu_seconds == 1 and tool.limits.wall_seconds == 2.0
    path.write_text(path.read_text().replace("cpu_seconds: 1", "cpu_second: 1"))
    with pytest.raises(ValueError, match="unknown keys \\['cpu_second'\\]"):
        load_tools(section)
