"""Tools the model can call: verl 0.9.1's two contracts and their loaders. Users import these
names from `rlkube_trainer.tools`, the public path; this module is the implementation.

- Stateless functions (`function_tool_path`): a file whose functions carry `@function_tool`; the
  OpenAI schema is inferred from the signature and Google-style docstring (transformers'
  `get_json_schema`, as verl does).
- Classes (`tool_config_path`): `BaseTool` subclasses. One object per tool serves every episode;
  each call of the model is its own instance: create, execute, release (`call_tool`), as verl
  0.9.1's ToolAgentLoop does. `execute` may return a per-call reward; `calc_reward` is part of the
  class for verl compatibility and is never called by the loop (verl 0.9.1 never calls it either).
"""

from __future__ import annotations

import asyncio
import importlib.util
import inspect
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from uuid import uuid4

from transformers.utils.chat_template_utils import get_json_schema

from rlkube_trainer.rollout.agent.schemas import FunctionCall, FunctionToolSchema, ToolResponse

TruncateSide = Literal["left", "right", "middle"]
ToolResult = tuple[ToolResponse, float, dict[str, Any]]


class BaseTool:
    """verl's `BaseTool`. The object is built once from the tool config and shared by every episode
    (concurrently); state lives per `instance_id`, and an instance lasts one call (see `call_tool`)."""

    def __init__(self, config: dict[str, Any], tool_schema: FunctionToolSchema) -> None:
        self.config = config
        self.tool_schema = tool_schema
        self.name = tool_schema.function.name

    async def create(self, instance_id: str | None = None, **kwargs: Any) -> tuple[str, ToolResponse]:
        return instance_id or uuid4().hex, ToolResponse()

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any) -> ToolResult:
        return ToolResponse(text="Updated the tool state."), 0.0, {}

    async def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
        return 0.0

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        return None


@dataclass(frozen=True)
class FunctionTool:
    name: str
    fn: Callable[..., Any]
    tool_schema: FunctionToolSchema

    async def call(self, parameters: dict[str, Any]) -> Any:
        if inspect.iscoroutinefunction(self.fn):
            return await self.fn(**parameters)
        # A thread, so a slow synchronous tool holds only its own trajectory.
        return await asyncio.to_thread(self.fn, **parameters)


Tool = BaseTool | FunctionTool

# Marks functions for `load_function_tools`; set by `function_tool`.
_MARK = "__rlkube_function_tool__"


def schema_from_function(fn: Callable[..., Any], name: str | None = None) -> FunctionToolSchema:
    """The OpenAI tool schema of `fn` (type hints + Google docstring with an `Args:` block)."""
    sig = inspect.signature(fn)
    variadic = [p for p, v in sig.parameters.items() if v.kind in (v.VAR_POSITIONAL, v.VAR_KEYWORD)]
    if variadic:
        raise ValueError(f"function tool {fn.__qualname__}: variadic parameters {variadic} have no JSON schema")
    raw = get_json_schema(fn)
    raw["function"]["name"] = name or fn.__name__
    return FunctionToolSchema.model_validate(raw)


def function_tool(fn: Callable[..., Any] | None = None, *, name: str | None = None) -> Any:
    """Decorator marking `fn` as a tool (bare or with `name=`); the schema is checked now."""

    def mark(f: Callable[..., Any]) -> Callable[..., Any]:
        setattr(f, _MARK, FunctionTool(name or f.__name__, f, schema_from_function(f, name)))
        return f

    return mark(fn) if fn is not None else mark


def load_function_tools(path: str | Path) -> list[FunctionTool]:
    """Execute the file at `path` and return its `@function_tool` functions, in name order."""
    p = Path(path).resolve()
    if not p.is_file():
        raise FileNotFoundError(f"rollout.multi_turn.function_tool_path does not exist: {path}")
    spec = importlib.util.spec_from_file_location("_rlkube_function_tools_" + p.stem, p)
    if spec is None or spec.loader is None:
        raise ImportError(f"rollout.multi_turn.function_tool_path cannot be imported: {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    tools = [getattr(v, _MARK) for v in vars(module).values() if callable(v) and hasattr(v, _MARK)]
    if not tools:
        raise ValueError(f"rollout.multi_turn.function_tool_path {path} defines no @function_tool function")
    return sorted(tools, key=lambda t: t.name)


def normalize_return(ret: Any) -> ToolResult:
    """A function tool's return as (response, reward, metrics), with verl's accepted shapes."""
    if isinstance(ret, tuple):
        if not 1 <= len(ret) <= 3:
            raise TypeError(f"a function tool returned a tuple of length {len(ret)}; use 1, 2 or 3")
        reward = 0.0 if len(ret) < 2 or ret[1] is None else float(ret[1])
        metrics = {} if len(ret) < 3 or ret[2] is None else dict(ret[2])
        return _as_response(ret[0]), reward, metrics
    return _as_response(ret), 0.0, {}


def _as_response(value: Any) -> ToolResponse:
    if isinstance(value, ToolResponse):
        return value
    if isinstance(value, dict):
        return ToolResponse(text=json.dumps(value, ensure_ascii=False))
    return ToolResponse(text=value if isinstance(value, str) else str(value))


def truncate(text: str, max_length: int, side: TruncateSide) -> str:
    """verl's tool-response truncation (characters, with its markers)."""
    if len(text) <= max_length:
        return text
    if side == "left":
        return "(truncated)..." + text[-max_length:]
    if side == "right":
        return text[:max_length] + "...(truncated)"
    half = max_length // 2
    return text[:half] + "...(truncated)..." + text[-half:]


async def call_tool(
    call: FunctionCall, tools: dict[str, Tool], tools_kwargs: dict[str, Any]
) -> tuple[ToolResult, bool]:
    """Run one call; every fault becomes a tool message to the model. Returns (result, ok).

    A class tool gets an instance of its own for this call alone: create (with the row's
    `tools_kwargs[name]["create_kwargs"]` as the keyword `create_kwargs`), execute, and release
    once create has returned, even when execute raised. That is verl 0.9.1's ToolAgentLoop, so a
    verl tool behaves the same here; a function tool has no instance and ignores tools_kwargs."""
    tool = tools.get(call.name)
    if tool is None:
        return (ToolResponse(text=f"Unknown function '{call.name}'. Available tools: {sorted(tools)}"), 0.0, {}), False
    try:
        args = json.loads(call.arguments)
        if not isinstance(args, dict):
            raise TypeError("arguments must be a JSON object")
    except (json.JSONDecodeError, TypeError) as e:
        return (ToolResponse(text=f"Invalid JSON in arguments for '{call.name}': {e}"), 0.0, {}), False
    instance_id: str | None = None
    try:
        if isinstance(tool, FunctionTool):
            return normalize_return(await tool.call(args)), True
        create_kwargs = tools_kwargs.get(call.name, {}).get("create_kwargs", {})
        instance_id, _ = await tool.create(create_kwargs=create_kwargs)
        return await tool.execute(instance_id, args), True
    except Exception as e:  # a tool's own bug is the model's observation, as in verl
        return (ToolResponse(text=f"Error executing tool '{call.name}': {e}"), 0.0, {}), False
    finally:
        if instance_id is not None and isinstance(tool, BaseTool):
            await tool.release(instance_id)
