"""verl 0.9.1's `rollout.multi_turn` section to the loop's settings and tools (pure loading).

Each key is used or refused by name. verl 0.9.1's `MultiTurnConfig` has no
`interaction_config_path` (and no `verl/interactions/`); it is refused here until rlkube has
interactions of its own.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import yaml

from rlkube_trainer.rollout.agent.episode import MultiTurnSettings
from rlkube_trainer.rollout.agent.schemas import FunctionToolSchema
from rlkube_trainer.rollout.agent.tools import BaseTool, Tool, load_function_tools

_SETTINGS_KEYS = (
    "max_assistant_turns",
    "max_user_turns",
    "max_parallel_calls",
    "max_tool_response_length",
    "tool_response_truncate_side",
    "format",
)
_LOADED_KEYS = ("enable", "tool_config_path", "function_tool_path")
# Keys whose only accepted value is verl's default, because rlkube behaves that way.
_DEFAULT_ONLY: dict[str, Any] = {
    "use_inference_chat_template": False,  # past turns are never re-rendered
    "tokenization_sanity_check_mode": "strict",  # TemplateChatFormat refuses a rewriting template
    "num_repeat_rollouts": None,
}


def settings_from_multi_turn(section: dict[str, Any], response_length: int) -> MultiTurnSettings:
    for key, value in section.items():
        where = f"rollout.multi_turn.{key}"
        if key in _DEFAULT_ONLY:
            if value != _DEFAULT_ONLY[key]:
                raise ValueError(f"{where}={value!r} is not supported (only {_DEFAULT_ONLY[key]!r})")
        elif key == "interaction_config_path":
            if value:
                raise ValueError(f"{where} is not supported: interactions are not implemented")
        elif key not in _SETTINGS_KEYS and key not in _LOADED_KEYS:
            raise ValueError(f"{where} is not a verl 0.9.1 multi_turn key")
    return MultiTurnSettings(response_length=response_length, **{k: section[k] for k in _SETTINGS_KEYS if k in section})


def _import_class(class_name: str) -> type[BaseTool]:
    module_name, _, attr = class_name.rpartition(".")
    if not module_name:
        raise ValueError(f"tool_config_path: class_name {class_name!r} must be module.Class")
    cls = getattr(importlib.import_module(module_name), attr)
    if not (isinstance(cls, type) and issubclass(cls, BaseTool)):
        raise TypeError(f"tool_config_path: {class_name} is not a BaseTool subclass")
    return cls


def load_tool_config(path: str | Path) -> list[BaseTool]:
    """verl's tool config YAML: `tools: [{class_name, config: {type: native, ...}, tool_schema}]`."""
    doc = yaml.safe_load(Path(path).read_text())
    if not isinstance(doc, dict) or not isinstance(doc.get("tools"), list):
        raise ValueError(f"rollout.multi_turn.tool_config_path {path}: expected a top-level 'tools' list")
    tools: list[BaseTool] = []
    for entry in doc["tools"]:
        config = dict(entry.get("config") or {})
        if config.get("type", "native") != "native":
            raise ValueError(f"tool_config_path {path}: tool type {config['type']!r} is not supported (native only)")
        cls = _import_class(str(entry["class_name"]))
        schema = entry.get("tool_schema")
        if schema is None:
            raise ValueError(f"tool_config_path {path}: {entry['class_name']} needs a tool_schema")
        tools.append(cls(config=config, tool_schema=FunctionToolSchema.model_validate(schema)))
    return tools


def load_tools(section: dict[str, Any]) -> dict[str, Tool]:
    """All tools of the section by name; a name defined twice is refused."""
    loaded: list[Tool] = []
    if section.get("tool_config_path"):
        loaded += load_tool_config(section["tool_config_path"])
    if section.get("function_tool_path"):
        loaded += load_function_tools(section["function_tool_path"])
    tools: dict[str, Tool] = {}
    for tool in loaded:
        if tool.name in tools:
            raise ValueError(f"rollout.multi_turn: tool {tool.name!r} is defined twice")
        tools[tool.name] = tool
    return tools
