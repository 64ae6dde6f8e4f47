"""The public tool API (`rlkube_trainer.tools`) and a tool's lifetime over an episode.

A user's tool file imports only `rlkube_trainer.tools`, is loaded from a tool config as a job
would load it, and plays an episode of several calls: the object is built once, and every call
is an instance of its own (create, execute, release), as verl 0.9.1's ToolAgentLoop does.
"""

from __future__ import annotations

import ast
import asyncio
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from char_chat import CharChat, scripted

import rlkube_trainer.tools as public
from rlkube_api.config import MultiTurnConfig
from rlkube_trainer.rollout.agent import code_interpreter, http_tool, interaction, schemas, tools
from rlkube_trainer.rollout.agent.config import load_tools
from rlkube_trainer.rollout.agent.episode import Trajectory, run_episode

pytestmark = pytest.mark.trainer

REPO = Path(__file__).resolve().parents[2]

USER_TOOLS = '''
"""A user's tools: a stateful ledger and a plain function, from the public path alone."""

from typing import Any

from rlkube_trainer.tools import (
    BaseTool,
    FunctionParametersSchema,
    FunctionPropertySchema,
    FunctionSchema,
    FunctionToolSchema,
    ToolResponse,
    ToolResult,
    function_tool,
)

EVENTS: list[tuple[str, str]] = []
BUILT: list[dict[str, Any]] = []

SCHEMA = FunctionToolSchema(
    function=FunctionSchema(
        name="ledger",
        description="Add to the ledger.",
        parameters=FunctionParametersSchema(
            properties={"by": FunctionPropertySchema(type="integer", description="The amount.")},
            required=["by"],
        ),
    )
)


class Ledger(BaseTool):
    def __init__(self, config: dict[str, Any], tool_schema: FunctionToolSchema | None = None) -> None:
        super().__init__(config, tool_schema or SCHEMA)
        BUILT.append(config)
        self.balance: dict[str, int] = {}

    async def create(self, instance_id: str | None = None, **kwargs: Any) -> tuple[str, ToolResponse]:
        instance_id, response = await super().create(instance_id, **kwargs)
        self.balance[instance_id] = int(kwargs["create_kwargs"].get("start", 0))
        EVENTS.append(("create", instance_id))
        return instance_id, response

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any) -> ToolResult:
        EVENTS.append(("execute", instance_id))
        if parameters["by"] < 0:
            raise ValueError("no debts")
        self.balance[instance_id] += parameters["by"]
        return ToolResponse(text=str(self.balance[instance_id])), 0.5, {}

    async def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
        EVENTS.append(("calc_reward", instance_id))
        return 0.0

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        EVENTS.append(("release", instance_id))
        del self.balance[instance_id]


@function_tool
def shout(text: str) -> str:
    """Upper-case a text.

    Args:
        text: The text.
    """
    return text.upper()
'''

TOOL_CONFIG = """
tools:
  - class_name: user_tools.Ledger
    config: {type: native, currency: EUR}
    tool_schema:
      type: function
      function:
        name: ledger
        description: Add to the ledger.
        parameters: {type: object, properties: {by: {type: integer}}, required: [by]}
"""


def call(name: str, arguments: str) -> str:
    return f'<tool_call>{{"name": "{name}", "arguments": {arguments}}}</tool_call>'


def rlkube_imports(source: str) -> set[str]:
    """The rlkube modules a Python source imports (from-imports and plain imports)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return {name for name in names if name.split(".")[0].startswith("rlkube")}


@pytest.fixture
def user_tools(tmp_path: Path) -> Iterator[Path]:
    """A tool config and the user's module beside it, as multiTurn.configMap mounts them."""
    (tmp_path / "user_tools.py").write_text(USER_TOOLS)
    (tmp_path / "tools.yaml").write_text(TOOL_CONFIG)
    yield tmp_path
    sys.modules.pop("user_tools", None)
    if str(tmp_path.resolve()) in sys.path:
        sys.path.remove(str(tmp_path.resolve()))


def test_a_user_tool_needs_only_the_public_path() -> None:
    assert rlkube_imports(USER_TOOLS) == {"rlkube_trainer.tools"}


def test_the_public_names_are_the_implementations_own() -> None:
    """One definition each: the public module re-exports, it defines nothing of its own."""
    implementation = {
        "BaseTool": tools.BaseTool,
        "ToolResult": tools.ToolResult,
        "function_tool": tools.function_tool,
        "ToolResponse": schemas.ToolResponse,
        "FunctionToolSchema": schemas.FunctionToolSchema,
        "FunctionSchema": schemas.FunctionSchema,
        "FunctionParametersSchema": schemas.FunctionParametersSchema,
        "FunctionPropertySchema": schemas.FunctionPropertySchema,
        "BaseInteraction": interaction.BaseInteraction,
        "InteractionReply": interaction.InteractionReply,
        "CodeInterpreterTool": code_interpreter.CodeInterpreterTool,
        "HttpTool": http_tool.HttpTool,
    }
    assert sorted(public.__all__) == sorted(implementation)
    for name, value in implementation.items():
        assert getattr(public, name) is value, name


def test_the_examples_import_only_the_public_path() -> None:
    files = sorted((REPO / "examples").rglob("*.py"))
    assert files, "the examples define tools in Python files"
    for file in files:
        assert rlkube_imports(file.read_text()) <= {"rlkube_trainer.tools"}, file
    for config in (REPO / "examples").rglob("*.yaml"):
        text = config.read_text()
        assert "rlkube_trainer.rollout" not in text, f"{config}: name built-in tools by rlkube_trainer.tools"


def test_a_tool_instance_lasts_one_call_and_the_object_one_run(user_tools: Path) -> None:
    section = MultiTurnConfig(enable=True, tool_config_path=str(user_tools / "tools.yaml"), max_parallel_calls=2)
    loaded = load_tools(section)
    module = sys.modules["user_tools"]
    ledger = loaded["ledger"]
    assert module.BUILT == [{"type": "native", "currency": "EUR"}]  # built once, with its config
    turns = [
        call("ledger", '{"by": 2}') + call("ledger", '{"by": 3}'),  # two calls at once
        call("ledger", '{"by": -1}'),  # the tool raises: the instance is still released
        call("ledger", '{"by": 4}'),
        "done",
    ]
    tools_kwargs = {"ledger": {"create_kwargs": {"start": 10}}}
    traj: Trajectory = asyncio.run(
        run_episode(
            [{"role": "user", "content": "q"}], scripted(turns), CharChat(), loaded, section, 2000, tools_kwargs
        )
    )
    assert (traj.tool_calls, traj.tool_errors, traj.assistant_turns) == (4, 1, 4)
    # Each call started from the row's create_kwargs: no state carried from one call to the next.
    tool_turns = [m["content"] for m in traj.messages if m["role"] == "tool"]
    assert tool_turns == ["12", "13", "Error executing tool 'ledger': no debts", "14"]
    assert traj.tool_rewards == [0.5, 0.5, 0.0, 0.5]

    events: list[tuple[str, str]] = module.EVENTS
    created = [iid for kind, iid in events if kind == "create"]
    released = [iid for kind, iid in events if kind == "release"]
    assert len(created) == 4 and len(set(created)) == 4, "one instance per call"
    assert sorted(released) == sorted(created), "every instance is released"
    for iid in created:
        assert [kind for kind, i in events if i == iid] == ["create", "execute", "release"]
    assert not any(kind == "calc_reward" for kind, _ in events), "the loop never calls calc_reward"
    assert module.BUILT == [{"type": "native", "currency": "EUR"}], "the episode built no tool object"
    assert isinstance(ledger, module.Ledger) and ledger.balance == {}


def test_a_function_tool_from_the_public_path_runs_in_an_episode(user_tools: Path) -> None:
    section = MultiTurnConfig(enable=True, function_tool_path=str(user_tools / "user_tools.py"))
    loaded = load_tools(section)
    turns = [call("shout", '{"text": "hi"}'), "done"]
    traj = asyncio.run(
        run_episode([{"role": "user", "content": "q"}], scripted(turns), CharChat(), loaded, section, 500)
    )
    assert [m["content"] for m in traj.messages if m["role"] == "tool"] == ["HI"]
    assert traj.tool_calls == 1 and traj.tool_errors == 0
