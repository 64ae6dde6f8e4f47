"""The built-in code-interpreter tool: model-written Python through `sandbox.run_python`."""

from __future__ import annotations

import asyncio
from typing import Any

from rlkube_api.config import SandboxConfig
from rlkube_trainer.rollout.agent.sandbox import SandboxLimits, SandboxResult, run_python
from rlkube_trainer.rollout.agent.schemas import (
    FunctionParametersSchema,
    FunctionPropertySchema,
    FunctionSchema,
    FunctionToolSchema,
    ToolResponse,
)
from rlkube_trainer.rollout.agent.tools import BaseTool, ToolResult

CODE_INTERPRETER_SCHEMA = FunctionToolSchema(
    function=FunctionSchema(
        name="code_interpreter",
        description="Run a Python program and return what it prints.",
        parameters=FunctionParametersSchema(
            properties={"code": FunctionPropertySchema(type="string", description="The Python source to run.")},
            required=["code"],
        ),
    )
)


def sandbox_overrides(sandbox: SandboxConfig) -> dict[str, Any]:
    """rollout.multi_turn.sandbox's limits that are set, under SandboxLimits' names (the keys a
    tool config's `config` uses too). Each field is read by name: the mapping is where the API's
    section meets the tool's limits."""
    given = {
        "cpu_seconds": sandbox.cpu_seconds,
        "wall_seconds": sandbox.wall_seconds,
        "memory_bytes": sandbox.memory_bytes,
        "max_processes": sandbox.max_processes,
        "max_output_bytes": sandbox.max_output_bytes,
        "max_file_bytes": sandbox.max_file_bytes,
    }
    return {key: value for key, value in given.items() if value is not None}


def render_result(result: SandboxResult) -> str:
    """The sandbox's outcome as the model reads it: output, or a clear error line."""
    if result.ok:
        return result.stdout if result.stdout else "(no output)"
    parts = [result.stdout] if result.stdout else []
    parts.append(f"Error: {result.error}")
    return "\n".join(parts)


class CodeInterpreterTool(BaseTool):
    """Usable from a tool config (`class_name: rlkube_trainer.tools.CodeInterpreterTool`): `config`
    keys named like `SandboxLimits` fields set the limits."""

    def __init__(
        self,
        config: dict[str, Any] | None = None,
        tool_schema: FunctionToolSchema | None = None,
        limits: SandboxLimits | None = None,
    ) -> None:
        config = config or {}
        super().__init__(config, tool_schema or CODE_INTERPRETER_SCHEMA)
        fields = set(SandboxLimits.__dataclass_fields__)
        unknown = set(config) - fields - {"type"}
        if unknown:
            raise ValueError(f"code_interpreter config: unknown keys {sorted(unknown)}; limits are {sorted(fields)}")
        self.limits = limits or SandboxLimits(**{k: v for k, v in config.items() if k in fields})

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any) -> ToolResult:
        code = parameters.get("code")
        if not isinstance(code, str):
            return ToolResponse(text="Error: the 'code' argument must be a string"), 0.0, {}
        result = await asyncio.to_thread(run_python, code, self.limits)
        return ToolResponse(text=render_result(result)), 0.0, {"ok": result.ok}
