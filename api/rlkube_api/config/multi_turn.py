"""rollout.multiTurn: episodes with tool calls and interactions, their files and the code
interpreter's sandbox."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from rlkube_api.base import ApiModel, CelRule
from rlkube_api.config.common import FilePath
from rlkube_api.kube_syntax import LONG_NAME


class SandboxConfig(ApiModel):
    """Limits of the built-in code interpreter's sandbox (one process per call, no network, only its
    scratch directory). Unset fields keep the sandbox's defaults; a tool config's own `config` keys
    of the same names (cpu_seconds, ...) override them for that tool."""

    cpu_seconds: int | None = Field(
        None, ge=1, le=3600, description="CPU time of one run, in seconds (RLIMIT_CPU; default 5)."
    )
    wall_seconds: float | None = Field(
        None, gt=0, le=3600, description="Timeout of one run, in seconds: the process group is killed (default 10)."
    )
    memory_bytes: int | None = Field(
        None,
        ge=16 * 1024 * 1024,
        le=64 * 1024**3,
        description="Address space of one run, in bytes (RLIMIT_AS; default 512 MiB).",
    )
    max_processes: int | None = Field(
        None, ge=1, le=4096, description="Processes and threads one run may have (RLIMIT_NPROC; default 32)."
    )
    max_output_bytes: int | None = Field(
        None, ge=1, le=64 * 1024 * 1024, description="Bytes of stdout (and of stderr) kept (default 16 KiB)."
    )
    max_file_bytes: int | None = Field(
        None,
        ge=0,
        le=64 * 1024**3,
        description="Largest file one run may write in its scratch directory, in bytes (RLIMIT_FSIZE; default 16 MiB).",
    )


class AgentFilesConfigMap(ApiModel):
    """A ConfigMap in the job's namespace whose keys the operator mounts as files in one folder."""

    name: Annotated[str, LONG_NAME] = Field(min_length=1, max_length=253, description="ConfigMap name.")


# The paths that may name a key of multiTurn.configMap instead of a file in the image.
_AGENT_FILE_FIELDS = ("toolConfigPath", "functionToolPath", "interactionConfigPath")


def _key_rule(field: str) -> CelRule:
    return CelRule(
        f"!has(self.configMap) || !has(self.{field}) || "
        f"(self.{field}.matches('^[-._a-zA-Z0-9]+$') && self.{field} != '.' && !self.{field}.startsWith('..'))",
        f"with multiTurn.configMap, {field} is a key of that ConfigMap (a file name such as tools.py), not a path",
        f".{field}",
    )


class MultiTurnConfig(ApiModel):
    """Multi-turn rollout with tool calls (verl 0.9.1's rollout.multi_turn): the model's tool calls
    are parsed from its output, run, and their results appended as tool turns until it answers
    without a call or a limit is hit; an interaction (a user-simulating environment) may answer
    each turn the model ends without a call. Only the model's own tokens are trained."""

    cel_rules = (
        CelRule(
            "!self.enable || has(self.toolConfigPath) || has(self.functionToolPath) || has(self.interactionConfigPath)",
            "multiTurn.enable needs tools or an interaction: set toolConfigPath, functionToolPath or "
            "interactionConfigPath",
            ".enable",
        ),
        CelRule(
            "self.enable || !(has(self.toolConfigPath) || has(self.functionToolPath) || "
            "has(self.interactionConfigPath) || has(self.configMap) || has(self.sandbox))",
            "toolConfigPath, functionToolPath, interactionConfigPath, configMap and sandbox are only read when "
            "multiTurn.enable is true",
            ".enable",
        ),
        *(_key_rule(f) for f in _AGENT_FILE_FIELDS),
    )

    enable: bool = Field(False, description="Run multi-turn episodes with tool calls instead of one response.")
    max_assistant_turns: int | None = Field(
        None, ge=1, le=1024, description="Most model turns per episode (unlimited when unset)."
    )
    max_user_turns: int | None = Field(
        None,
        ge=1,
        le=1024,
        description="Most tool and interaction (user-side) turns per episode (unlimited when unset).",
    )
    max_parallel_calls: int = Field(
        1, ge=1, le=1024, description="Most tool calls of one model turn that run (at once); the rest are dropped."
    )
    max_tool_response_length: int = Field(
        256, ge=1, description="Characters of a tool's response kept in the conversation (truncated beyond)."
    )
    tool_response_truncate_side: Literal["left", "right", "middle"] = Field(
        "middle", description="Which part of a long tool response is cut: left, right or middle."
    )
    format: Literal["hermes"] = Field(
        "hermes", description="Tool-call syntax the model writes: hermes (<tool_call>{json}</tool_call>)."
    )
    tool_config_path: FilePath | None = Field(
        None,
        description="verl's tool config YAML (tools: class_name, config, tool_schema): a file in the image, or "
        "with configMap a key of it. A class_name's module may be a .py file beside it.",
    )
    function_tool_path: FilePath | None = Field(
        None,
        description="Python file whose @function_tool functions are tools (schema from their signatures): a "
        "file in the image, or with configMap a key of it.",
    )
    tokenization_sanity_check_mode: Literal["strict"] = Field(
        "strict",
        description="strict: a chat template that renders earlier turns differently once tool turns follow "
        "ends the run with an error (rlkube extends the tokens turn by turn, never re-renders).",
    )
    interaction_config_path: FilePath | None = Field(
        None,
        description="Interaction config YAML (interaction: name, class_name, config), as verl 0.5-0.8's: "
        "user-simulating environments that answer each model turn without a tool call, end the episode "
        "and give turn rewards; a row picks one by extra_info.interaction_kwargs.name. A file in the image, "
        "or with configMap a key of it.",
    )
    config_map: AgentFilesConfigMap | None = Field(
        None,
        description="In an RLJob: a ConfigMap holding the tool and interaction files, mounted into every pod; "
        "toolConfigPath, functionToolPath and interactionConfigPath then name its keys.",
    )
    sandbox: SandboxConfig | None = Field(
        None,
        description="Limits of the code interpreter tool's sandbox; refused at the start of a run whose "
        "tools have no code interpreter.",
    )
