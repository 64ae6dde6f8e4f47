"""Tool-calling data shapes with verl 0.9.1's names (`verl/tools/schemas.py`, `tool_parser.py`).

Schemas follow the OpenAI function-tool format, which chat templates render into the prompt.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


class FunctionPropertySchema(BaseModel):
    type: str | list[str]
    description: str | None = None
    enum: list[Any] | None = None


class FunctionParametersSchema(BaseModel):
    type: str = "object"
    properties: dict[str, FunctionPropertySchema] = Field(default_factory=dict)
    required: list[str] = Field(default_factory=list)


class FunctionSchema(BaseModel):
    name: str
    description: str
    parameters: FunctionParametersSchema = Field(default_factory=FunctionParametersSchema)
    strict: bool = False


class FunctionToolSchema(BaseModel):
    """verl's `OpenAIFunctionToolSchema`."""

    type: str = "function"
    function: FunctionSchema

    @property
    def name(self) -> str:
        return self.function.name


class FunctionCall(BaseModel):
    """One tool call as the model wrote it; `arguments` is a JSON string, unvalidated."""

    name: str
    arguments: str
    tool_call_id: str | None = None


class ToolResponse(BaseModel):
    """What a tool returns to the model (text only: rlkube trains text models)."""

    text: str | None = None
