"""What a tool or interaction file imports: the stable path for user code of rollout.multi_turn.

The modules under `rlkube_trainer.rollout.agent` implement the loop and may be rearranged; these
names stay. A tool file needs nothing else from rlkube:

    from rlkube_trainer.tools import BaseTool, ToolResponse, ToolResult, function_tool

- `BaseTool` (for `tool_config_path`): subclass it and override
  `async create(instance_id=None, **kwargs) -> (instance_id, ToolResponse)`,
  `async execute(instance_id, parameters, **kwargs) -> ToolResult` and
  `async release(instance_id, **kwargs) -> None`; `calc_reward` exists for verl compatibility and
  the loop never calls it. The object is built when the run starts, as
  `cls(config=..., tool_schema=...)`, and shared by all episodes; every call of the model gets an instance of its own, created,
  executed and released (verl 0.9.1's lifetime). `create` finds the row's
  `extra_info.tools_kwargs[<tool name>]["create_kwargs"]` under `kwargs["create_kwargs"]`.
- `ToolResult` is `(ToolResponse, reward, metrics)`: the reward lands in the reward function's
  `extra_info.rollout_reward_scores.tool_rewards`; `metrics["end_episode"] = True` ends the episode.
- `function_tool` (for `function_tool_path`): a decorator for plain or async functions; the schema
  comes from the signature and the Google-style docstring. A function returns a str, a dict
  (sent as JSON), a `ToolResponse`, or a tuple (response, reward, metrics); it gets no
  tools_kwargs.
- The schema types (`FunctionToolSchema` and its parts) are a tool config's `tool_schema`, the
  OpenAI function-tool format (verl's `OpenAIFunctionToolSchema` and friends).
- `BaseInteraction` / `InteractionReply` (for `interaction_config_path`): a simulated user;
  `start_interaction` and `finalize_interaction` bracket one episode.
- `CodeInterpreterTool` and `HttpTool` are the built-in tools, for a tool config's `class_name`
  (`rlkube_trainer.tools.CodeInterpreterTool`).
"""

from __future__ import annotations

from rlkube_trainer.rollout.agent.code_interpreter import CodeInterpreterTool
from rlkube_trainer.rollout.agent.http_tool import HttpTool
from rlkube_trainer.rollout.agent.interaction import BaseInteraction, InteractionReply
from rlkube_trainer.rollout.agent.schemas import (
    FunctionParametersSchema,
    FunctionPropertySchema,
    FunctionSchema,
    FunctionToolSchema,
    ToolResponse,
)
from rlkube_trainer.rollout.agent.tools import BaseTool, ToolResult, function_tool

__all__ = [
    "BaseInteraction",
    "BaseTool",
    "CodeInterpreterTool",
    "FunctionParametersSchema",
    "FunctionPropertySchema",
    "FunctionSchema",
    "FunctionToolSchema",
    "HttpTool",
    "InteractionReply",
    "ToolResponse",
    "ToolResult",
    "function_tool",
]
