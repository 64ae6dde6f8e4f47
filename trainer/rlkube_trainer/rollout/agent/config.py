"""verl 0.9.1's `rollout.multi_turn` section to the loop's settings, tools and interactions.

Each key is used or refused by name. `interaction_config_path` is verl 0.5-0.8's (0.9.1 dropped
it; rlkube keeps its file format, see interaction.py); `sandbox` is rlkube's: the code
interpreter's limits, defaults under each tool config's own keys.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from rlkube_api.config import SandboxConfig
from rlkube_trainer.rollout.agent.code_interpreter import CodeInterpreterTool, sandbox_overrides
from rlkube_trainer.rollout.agent.episode import MultiTurnSettings
from rlkube_trainer.rollout.agent.interaction import BaseInteraction, load_interactions
from rlkube_trainer.rollout.agent.modules import import_class
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
_LOADED_KEYS = ("enable", "tool_config_path", "function_tool_path", "interaction_config_path", "sandbox")
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
        elif key == "config_map":
            if value:
                raise ValueError(
                    f"{where} is resolved to file paths by the operator inside RLJob pods; "
                    "outside one, set tool_config_path / function_tool_path / interaction_config_path to files"
                )
        elif key not in _SETTINGS_KEYS and key not in _LOADED_KEYS:
            raise ValueError(f"{where} is not a verl 0.9.1 multi_turn key")
    return MultiTurnSettings(response_length=response_length, **{k: section[k] for k in _SETTINGS_KEYS if k in section})


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


def load_tools(section: dict[str, Any]) -> dict[str, Tool]:
    """All tools of the section by name; a name defined twice is refused."""
    loaded: list[Tool] = []
    raw_sandbox = section.get("sandbox")
    sandbox = sandbox_overrides(SandboxConfig.model_validate(raw_sandbox)) if raw_sandbox is not None else {}
    if section.get("tool_config_path"):
        loaded += load_tool_config(section["tool_config_path"], sandbox)
    if raw_sandbox is not None and not any(isinstance(t, CodeInterpreterTool) for t in loaded):
        raise ValueError(
            "rollout.multi_turn.sandbox is set, but no tool of tool_config_path is a code interpreter "
            "(class_name: rlkube_trainer.rollout.agent.code_interpreter.CodeInterpreterTool)"
        )
    if section.get("function_tool_path"):
        loaded += load_function_tools(section["function_tool_path"])
    tools: dict[str, Tool] = {}
    for tool in loaded:
        if tool.name in tools:
            raise ValueError(f"rollout.multi_turn: tool {tool.name!r} is defined twice")
        tools[tool.name] = tool
    return tools


def load_interaction_config(section: dict[str, Any]) -> dict[str, BaseInteraction]:
    """The section's interactions by name (none without interaction_config_path)."""
    path = section.get("interaction_config_path")
    return load_interactions(path) if path else {}
