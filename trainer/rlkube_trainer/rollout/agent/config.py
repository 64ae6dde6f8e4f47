"""The tools and interactions that verl 0.9.1's `rollout.multi_turn` section names.

The section arrives validated by the API (`MultiTurnConfig`: its keys, bounds and allowed values);
what is refused here is what only the trainer can tell: a file that does not load, a class of
the wrong kind, a `configMap` outside an RLJob's pods, a `sandbox` with no code interpreter.
`interaction_config_path` is verl 0.5-0.8's (0.9.1 dropped it; rlkube keeps its file format, see
interaction.py); `sandbox` is rlkube's: the code interpreter's limits, defaults under each tool
config's own keys.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from rlkube_api.config import MultiTurnConfig
from rlkube_trainer.rollout.agent.code_interpreter import CodeInterpreterTool, sandbox_overrides
from rlkube_trainer.rollout.agent.interaction import BaseInteraction, load_interactions
from rlkube_trainer.rollout.agent.modules import import_class
from rlkube_trainer.rollout.agent.schemas import FunctionToolSchema
from rlkube_trainer.rollout.agent.tools import BaseTool, Tool, load_function_tools


def _refuse_config_map(section: MultiTurnConfig) -> None:
    # The API allows configMap (an RLJob's spec); the operator turns it into file paths inside the
    # pods, so a trainer that still sees it was started outside one and its paths name no files.
    if section.config_map is not None:
        raise ValueError(
            "rollout.multi_turn.config_map is resolved to file paths by the operator inside RLJob pods; "
            "outside one, set tool_config_path / function_tool_path / interaction_config_path to files"
        )


def load_tool_config(path: str | Path, sandbox: dict[str, Any] | None = None) -> list[BaseTool]:
    """verl's tool config YAML: `tools: [{class_name, config: {type: native, ...}, tool_schema}]`.
    `sandbox` (limits by SandboxLimits field) is the code interpreters' defaults under their own keys."""
    where = f"rollout.multi_turn.tool_config_path {path}"
    file = Path(path)
    try:
        doc = yaml.safe_load(file.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"{where}: cannot be read: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("tools"), list):
        raise ValueError(f"{where}: expected a top-level 'tools' list")
    tools: list[BaseTool] = []
    for entry in doc["tools"]:
        config = dict(entry.get("config") or {})
        if config.get("type", "native") != "native":
            raise ValueError(f"{where}: tool type {config['type']!r} is not supported (native only)")
        cls = import_class(str(entry["class_name"]), file.parent, BaseTool, where)
        schema = entry.get("tool_schema")
        if schema is None:
            raise ValueError(f"{where}: {entry['class_name']} needs a tool_schema")
        if sandbox and issubclass(cls, CodeInterpreterTool):
            config = {**sandbox, **config}
        tools.append(cls(config=config, tool_schema=FunctionToolSchema.model_validate(schema)))
    return tools


def load_tools(section: MultiTurnConfig) -> dict[str, Tool]:
    """All tools of the section by name; a name defined twice is refused."""
    _refuse_config_map(section)
    loaded: list[Tool] = []
    sandbox = sandbox_overrides(section.sandbox) if section.sandbox is not None else {}
    if section.tool_config_path:
        loaded += load_tool_config(section.tool_config_path, sandbox)
    if section.sandbox is not None and not any(isinstance(t, CodeInterpreterTool) for t in loaded):
        raise ValueError(
            "rollout.multi_turn.sandbox is set, but no tool of tool_config_path is a code interpreter "
            "(class_name: rlkube_trainer.tools.CodeInterpreterTool)"
        )
    if section.function_tool_path:
        loaded += load_function_tools(section.function_tool_path)
    tools: dict[str, Tool] = {}
    for tool in loaded:
        if tool.name in tools:
            raise ValueError(f"rollout.multi_turn: tool {tool.name!r} is defined twice")
        tools[tool.name] = tool
    return tools


def load_interaction_config(section: MultiTurnConfig) -> dict[str, BaseInteraction]:
    """The section's interactions by name (none without interaction_config_path)."""
    _refuse_config_map(section)
    path = section.interaction_config_path
    return load_interactions(path) if path else {}
