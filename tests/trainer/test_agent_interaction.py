"""Interactions (a user-simulating environment answers the model's turns without a tool call),
the classes a tool or interaction config names (`modules.import_class`), and the sandbox section
applied to the code interpreter. Pure: a character-level chat format and scripted model turns,
no model or engine."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from char_chat import CharChat, scripted
from pydantic import ValidationError

from rlkube_api.config import MultiTurnConfig, SandboxConfig
from rlkube_trainer.data.prompts import Prompt
from rlkube_trainer.rollout.agent.code_interpreter import CodeInterpreterTool, sandbox_overrides
from rlkube_trainer.rollout.agent.config import load_interaction_config, load_tools
from rlkube_trainer.rollout.agent.episode import Trajectory, run_episode
from rlkube_trainer.rollout.agent.interaction import BaseInteraction, load_interactions
from rlkube_trainer.rollout.agent.modules import import_class
from rlkube_trainer.rollout.agent.sampler import episode_numbers, interaction_of, to_sample
from rlkube_trainer.rollout.agent.tools import BaseTool

pytestmark = pytest.mark.trainer

CODE_INTERPRETER = "rlkube_trainer.tools.CodeInterpreterTool"


def multi_turn(**keys: Any) -> MultiTurnConfig:
    """An enabled rollout.multi_turn section with `keys` (the API's validation included)."""
    return MultiTurnConfig.model_validate({"enable": True, **keys})


class Grader(BaseInteraction):
    """Says "again" (score 0) until the model answers the ground truth, then ends (score 1)."""

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        self.started: list[dict[str, Any]] = []
        self.finalized: list[str] = []

    async def start_interaction(self, instance_id: str | None = None, **kwargs: Any) -> str:
        self.started.append(kwargs)
        return await super().start_interaction(instance_id, **kwargs)

    async def generate_response(
        self, instance_id: str, messages: list[dict[str, Any]], **kwargs: Any
    ) -> tuple[bool, str, float | None, dict[str, Any]]:
        right = messages[-1]["content"] == kwargs["answer"]
        return right, "correct" if right else "again", 1.0 if right else 0.0, {}

    async def finalize_interaction(self, instance_id: str, **kwargs: Any) -> None:
        self.finalized.append(instance_id)


def play(
    turns: list[str], interaction: BaseInteraction | None, response_length: int, section: MultiTurnConfig | None = None
) -> Trajectory:
    return asyncio.run(
        run_episode(
            [{"role": "user", "content": "q"}],
            scripted(turns),
            CharChat(),
            {},
            section or MultiTurnConfig(),
            response_length,
            interaction=interaction,
            interaction_kwargs={"name": "grader", "answer": "7"},
        )
    )


def test_an_interaction_answers_turns_scores_them_and_ends_the_episode() -> None:
    grader = Grader({"name": "grader"})
    traj = play(["5", "6", "7"], grader, 200)
    assert (traj.assistant_turns, traj.user_turns, traj.turn_scores) == (3, 3, [0.0, 0.0, 1.0])
    # Each reply is a user turn out of the mask; the model's answers are in it. As verl, the
    # reply that ends the episode is appended too.
    again, correct = "user: again;", "user: correct;"
    assert CharChat().decode(traj.response_ids) == "5" + again + "6" + again + "7" + correct
    assert traj.response_mask == [1] + [0] * len(again) + [1] + [0] * len(again) + [1] + [0] * len(correct)
    assert grader.started == [{"name": "grader", "answer": "7"}] and len(grader.finalized) == 1
    # Without an interaction, the first turn without a call ends the episode.
    alone = play(["5", "6"], None, 200)
    assert (alone.assistant_turns, alone.user_turns, alone.turn_scores) == (1, 0, [])


def test_turn_limits_end_an_interaction_and_it_is_finalized() -> None:
    grader = Grader({"name": "grader"})
    capped = play(["1", "2", "3", "4"], grader, 200, MultiTurnConfig(max_user_turns=2))
    assert (capped.assistant_turns, capped.user_turns, capped.turn_scores) == (3, 2, [0.0, 0.0])
    # A reply that would overflow the response budget ends the episode unappended.
    short = play(["1", "2"], grader, 5)
    assert short.response_ids == [ord("1")] and short.turn_scores == [0.0]
    assert len(grader.finalized) == 2


def test_turn_scores_reach_the_reward_function_and_the_metrics() -> None:
    traj = play(["5", "7"], Grader({"name": "grader"}), 200)
    sample = to_sample(3, traj, 200, with_logprobs=True, interaction=True)
    assert sample.reward_info == {
        "num_turns": traj.num_turns,
        "rollout_reward_scores": {"turn_scores": [0.0, 1.0], "tool_rewards": []},
    }
    assert episode_numbers(traj, interaction=True)["interaction_turn_scores"] == 1.0
    assert "interaction_turn_scores" not in episode_numbers(traj)


@pytest.fixture
def beside(tmp_path: Path) -> Iterator[Path]:
    """A folder as multiTurn.configMap mounts it: a config and the module it names, side by side."""
    (tmp_path / "my_env.py").write_text(
        "from rlkube_trainer.tools import BaseInteraction\n"
        "class EchoInteraction(BaseInteraction):\n"
        "    async def generate_response(self, instance_id, messages, **kwargs):\n"
        "        return True, 'echo ' + messages[-1]['content'], 0.5, {}\n"
        "class NotOne:\n"
        "    pass\n"
    )
    yield tmp_path
    sys.modules.pop("my_env", None)
    if str(tmp_path.resolve()) in sys.path:
        sys.path.remove(str(tmp_path.resolve()))


def test_an_interaction_class_beside_its_config_is_imported_and_picked_by_name(beside: Path) -> None:
    config = beside / "interaction.yaml"
    config.write_text(
        "interaction:\n"
        "  - {name: greeter, class_name: my_env.EchoInteraction, config: {tone: flat}}\n"
        "  - {class_name: my_env.EchoInteraction}\n"
    )
    interactions = load_interaction_config(multi_turn(interaction_config_path=str(config)))
    # verl's naming: the entry's name, else the class name without "Interaction", lower-cased.
    assert sorted(interactions) == ["echo", "greeter"]
    config.write_text("interaction:\n  - {name: echo, class_name: my_env.EchoInteraction, config: {tone: flat}}\n")
    interactions = load_interaction_config(multi_turn(interaction_config_path=str(config)))
    echo = interactions["echo"]
    assert type(echo).__name__ == "EchoInteraction" and echo.config == {"tone": "flat", "name": "echo"}
    row = Prompt(0, "train#0", [1], "q", [{"role": "user", "content": "q"}], "t", "7", {})
    assert interaction_of(row, interactions) == (echo, {})  # the only one: no name needed
    assert load_interaction_config(MultiTurnConfig()) == {}
    assert interaction_of(row, {}) is None


def test_two_entries_with_one_name_are_refused(beside: Path) -> None:
    config = beside / "interaction.yaml"
    config.write_text(
        "interaction:\n  - {class_name: my_env.EchoInteraction}\n  - {class_name: my_env.EchoInteraction}\n"
    )
    with pytest.raises(
        ValueError, match=r"interaction_config_path .*interaction\.yaml: interaction 'echo' is defined twice"
    ):
        load_interactions(config)


def test_a_row_names_an_interaction_that_is_not_configured(beside: Path) -> None:
    config = beside / "interaction.yaml"
    config.write_text(
        "interaction:\n  - {name: a, class_name: my_env.EchoInteraction}\n  - {name: b, class_name: my_env.EchoInteraction}\n"
    )
    interactions = load_interactions(config)
    row = Prompt(0, "train#4", [1], "q", [], "t", "7", {"interaction_kwargs": {"name": "c"}})
    with pytest.raises(
        ValueError, match=r"train#4: extra_info\.interaction_kwargs\.name 'c' is not one of \['a', 'b'\]"
    ):
        interaction_of(row, interactions)
    unnamed = Prompt(0, "train#5", [1], "q", [], "t", "7", {})
    with pytest.raises(ValueError, match=r"train#5: extra_info\.interaction_kwargs\.name is required"):
        interaction_of(unnamed, interactions)


@pytest.mark.parametrize(
    ("class_name", "error"),
    [
        ("EchoInteraction", r"class_name 'EchoInteraction' must be module\.Class"),
        ("no_such_module.Echo", r"class_name 'no_such_module\.Echo': cannot import no_such_module"),
        ("my_env.Missing", r"class_name 'my_env\.Missing' is not a BaseInteraction subclass"),
        ("my_env.NotOne", r"class_name 'my_env\.NotOne' is not a BaseInteraction subclass"),
    ],
)
def test_a_bad_class_name_is_refused_naming_the_file_and_field(beside: Path, class_name: str, error: str) -> None:
    config = beside / "interaction.yaml"
    config.write_text(f"interaction:\n  - {{name: x, class_name: {class_name}}}\n")
    with pytest.raises(ValueError, match=r"rollout\.multi_turn\.interaction_config_path " + str(config) + ": " + error):
        load_interactions(config)


def test_import_class_searches_the_folder_given_first(beside: Path) -> None:
    cls = import_class("my_env.EchoInteraction", beside, BaseInteraction, "where")
    assert issubclass(cls, BaseInteraction) and cls.__module__ == "my_env"
    with pytest.raises(ValueError, match=r"^where: class_name 'my_env\.EchoInteraction' is not a CodeInterpreterTool"):
        import_class("my_env.EchoInteraction", beside, CodeInterpreterTool, "where")


def test_a_missing_or_malformed_interaction_config_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"interaction_config_path .*nope\.yaml: cannot be read"):
        load_interactions(tmp_path / "nope.yaml")
    (tmp_path / "i.yaml").write_text("interactions: []\n")
    with pytest.raises(ValueError, match=r"expected a top-level 'interaction' list"):
        load_interactions(tmp_path / "i.yaml")


# --- the sandbox section ------------------------------------------------------------------------


def _tool_config(tmp_path: Path, config: str = "{type: native}", class_name: str = CODE_INTERPRETER) -> str:
    path = tmp_path / "tools.yaml"
    path.write_text(
        "tools:\n"
        f"  - class_name: {class_name}\n"
        f"    config: {config}\n"
        "    tool_schema:\n"
        "      type: function\n"
        "      function:\n"
        "        name: python\n"
        "        description: Run Python.\n"
        "        parameters: {type: object, properties: {code: {type: string}}, required: [code]}\n"
    )
    return str(path)


def test_sandbox_overrides_are_the_limits_set_under_sandbox_limits_names() -> None:
    assert sandbox_overrides(SandboxConfig()) == {}
    full = SandboxConfig(
        cpu_seconds=2,
        wall_seconds=3.5,
        memory_bytes=2**28,
        max_processes=4,
        max_output_bytes=100,
        max_file_bytes=0,
    )
    assert sandbox_overrides(full) == {
        "cpu_seconds": 2,
        "wall_seconds": 3.5,
        "memory_bytes": 2**28,
        "max_processes": 4,
        "max_output_bytes": 100,
        "max_file_bytes": 0,
    }
    # Every field of the API's section reaches the tool: none accepted and dropped.
    assert set(sandbox_overrides(full)) == set(SandboxConfig.model_fields)


def test_the_sandbox_section_sets_the_code_interpreters_limits_under_its_own_keys(tmp_path: Path) -> None:
    path = _tool_config(tmp_path, "{type: native, cpu_seconds: 1}")
    tool = load_tools(multi_turn(tool_config_path=path, sandbox={"cpu_seconds": 3, "memory_bytes": 2**28}))["python"]
    assert isinstance(tool, CodeInterpreterTool)
    # The section is the default; the tool config's own key wins; the rest keep the sandbox's.
    assert (tool.limits.cpu_seconds, tool.limits.memory_bytes, tool.limits.wall_seconds) == (1, 2**28, 10.0)
    plain = load_tools(multi_turn(tool_config_path=path))["python"]
    assert isinstance(plain, CodeInterpreterTool) and plain.limits.memory_bytes == 512 * 1024 * 1024


def test_a_sandbox_section_without_a_code_interpreter_is_refused(tmp_path: Path) -> None:
    functions = tmp_path / "lookup.py"
    functions.write_text(
        "from rlkube_trainer.tools import function_tool\n"
        "@function_tool\n"
        "def lookup(key: str) -> str:\n"
        '    """Look up.\n\n    Args:\n        key: The key.\n    """\n'
        "    return key\n"
    )
    with pytest.raises(ValueError, match=r"rollout\.multi_turn\.sandbox is set, but no tool .* is a code interpreter"):
        load_tools(multi_turn(function_tool_path=str(functions), sandbox={"cpu_seconds": 2}))
    with pytest.raises(ValidationError, match=r"memory_bytes"):  # the section's bounds are the API's
        multi_turn(tool_config_path=_tool_config(tmp_path), sandbox={"memory_bytes": 1})


# --- the example's files (examples/multi-turn-tools.yaml) ----------------------------------------

EXAMPLE_TOOLS = Path(__file__).resolve().parents[2] / "examples" / "tools"


def test_the_examples_tools_and_interaction_load_and_answer(tmp_path: Path) -> None:
    # As the ConfigMap mounts them: the files side by side in one folder.
    for file in EXAMPLE_TOOLS.iterdir():
        (tmp_path / file.name).write_text(file.read_text())
    section = multi_turn(
        tool_config_path=str(tmp_path / "tools.yaml"),
        interaction_config_path=str(tmp_path / "interaction.yaml"),
        sandbox={"cpu_seconds": 2, "wall_seconds": 4.0},
    )
    try:
        tools = load_tools(section)
        interactions = load_interaction_config(section)
    finally:
        sys.modules.pop("gsm8k_agent", None)
        sys.path.remove(str(tmp_path.resolve()))
    interpreter = tools["code_interpreter"]
    assert isinstance(interpreter, CodeInterpreterTool)
    assert (interpreter.limits.cpu_seconds, interpreter.limits.wall_seconds) == (2, 4.0)
    calculator = tools["calculator"]
    assert isinstance(calculator, BaseTool)
    (response, _, _) = asyncio.run(calculator.execute("i", {"expression": "(3 + 4) * 12 / 2"}))
    assert response.text == "42"
    (response, _, _) = asyncio.run(calculator.execute("i", {"expression": "__import__('os')"}))
    assert (response.text or "").startswith("Error: not arithmetic")
    gsm8k = interactions["gsm8k"]
    wrong = asyncio.run(
        gsm8k.generate_response("i", [{"role": "assistant", "content": "It is 41."}], ground_truth="42")
    )
    right = asyncio.run(gsm8k.generate_response("i", [{"role": "assistant", "content": "So 42."}], ground_truth="42"))
    assert wrong[0] is False and wrong[2] == 0.0 and "answer again" in wrong[1]
    assert right[:3] == (True, "Correct.", 1.0)


def test_the_example_seccomp_profile_allows_what_the_sandbox_calls() -> None:
    """sandbox_exec.py: unshare (a network namespace, through a user namespace when not root),
    Landlock's three calls and prctl(PR_SET_NO_NEW_PRIVS); RuntimeDefault refuses unshare."""
    profile = json.loads((EXAMPLE_TOOLS.parent / "seccomp" / "rlkube-sandbox.json").read_text())
    denied = {name for rule in profile["syscalls"] if rule["action"] != "SCMP_ACT_ALLOW" for name in rule["names"]}
    assert profile["defaultAction"] == "SCMP_ACT_ALLOW"
    needed = {"unshare", "landlock_create_ruleset", "landlock_add_rule", "landlock_restrict_self", "prctl", "execve"}
    assert not needed & denied
    # What RuntimeDefault also refuses stays refused: joining or mounting namespaces, tracing, the kernel.
    assert {"setns", "mount", "umount2", "pivot_root", "ptrace", "bpf", "kexec_load", "init_module"} <= denied
