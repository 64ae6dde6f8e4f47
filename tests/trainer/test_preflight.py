"""Pre-flight: each file a run needs is checked before anyone waits, and a failure names the
trainer key, the RLJob field and the path (rlkube_trainer.pod.preflight, the CLI's exit code)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rlkube_api.config import TrainerConfig
from rlkube_api.exit_codes import ExitCode
from rlkube_api.validation import load_trainer_config
from rlkube_trainer.pod.preflight import PreflightError, check_driver, check_group, write_termination_message
from rlkube_trainer.tiny.task import init


@pytest.fixture(scope="module")
def task(tmp_path_factory: pytest.TempPathFactory) -> Path:
    workdir = tmp_path_factory.mktemp("preflight")
    init(workdir, "grpo", steps=2)
    return workdir


def config_with(task: Path, tmp_path: Path, **changes: object) -> TrainerConfig:
    """The tiny task's config with dotted keys changed, its checkpoints under tmp_path."""
    raw = yaml.safe_load((task / "config.yaml").read_text())
    raw["checkpoint"]["dir"] = str(tmp_path / "checkpoints")
    for dotted, value in changes.items():
        section = raw
        *parents, leaf = dotted.split("__")
        for name in parents:
            section = section.setdefault(name, {})
        section[leaf] = value
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    return load_trainer_config(path)


def failure(config: TrainerConfig) -> PreflightError:
    with pytest.raises(PreflightError) as caught:
        check_driver(config)
    return caught.value


def test_the_tiny_task_passes(task: Path, tmp_path: Path) -> None:
    check_driver(config_with(task, tmp_path))
    assert (tmp_path / "checkpoints").is_dir()


def test_a_model_path_that_does_not_exist_is_named(task: Path, tmp_path: Path) -> None:
    error = failure(config_with(task, tmp_path, model__path="/no/such/model"))
    assert error.key == "model.path"
    assert "model.path (RLJob spec.model.path) '/no/such/model': does not exist" in str(error)
    assert "Repo id" not in str(error)


def test_a_directory_without_a_model_is_named(task: Path, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "no config.json there" in str(failure(config_with(task, tmp_path, model__path=str(empty))))
    shutil.copy(task / "model" / "config.json", empty / "config.json")
    assert "no weights there" in str(failure(config_with(task, tmp_path, model__path=str(empty))))


def test_a_tokenizer_path_that_does_not_exist_is_named(task: Path, tmp_path: Path) -> None:
    error = failure(config_with(task, tmp_path, model__tokenizer_path="/no/tokenizer"))
    assert error.key == "model.tokenizer_path"
    assert "spec.model.tokenizerPath" in str(error)


def test_prompt_and_response_beyond_the_models_positions(task: Path, tmp_path: Path) -> None:
    # The tiny model has 128 positions.
    error = failure(config_with(task, tmp_path, data__max_prompt_length=100, data__max_response_length=64))
    assert error.key == "data.max_prompt_length"
    assert "164 exceeds the model's max_position_embeddings 128" in str(error)


def test_data_files_missing_or_without_the_prompt_column(task: Path, tmp_path: Path) -> None:
    train = str(task / "data" / "train.parquet")
    error = failure(config_with(task, tmp_path, data__train_files=[train, "/data/missing.parquet"]))
    assert error.key == "data.train_files[1]"
    assert "spec.data.trainFiles[1]" in str(error) and "'/data/missing.parquet': does not exist" in str(error)
    error = failure(config_with(task, tmp_path, data__prompt_key="question"))
    assert error.key == "data.train_files[0]" and "data.prompt_key 'question' not in" in str(error)
    error = failure(config_with(task, tmp_path, data__val_files=["/data/val.csv"]))
    assert error.key == "data.val_files[0]" and "unknown extension '.csv'" in str(error)


def test_reward_function_missing_or_misnamed(task: Path, tmp_path: Path) -> None:
    error = failure(config_with(task, tmp_path, reward__function__path="/no/reward.py"))
    assert error.key == "reward.function.path" and "does not exist" in str(error)
    error = failure(config_with(task, tmp_path, reward__function__name="score_it"))
    assert "defines no 'score_it'" in str(error)


def test_a_checkpoint_dir_that_cannot_be_written(task: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    config = config_with(task, tmp_path)
    config.checkpoint.dir = str(blocker / "checkpoints")
    error = failure(config)
    assert error.key == "checkpoint.dir" and "not writable" in str(error)


def test_a_role_pod_checks_the_models_its_roles_load(task: Path, tmp_path: Path) -> None:
    good = config_with(task, tmp_path)
    check_group(good, "actor")
    bad = config_with(task, tmp_path, model__path="/models/missing")
    with pytest.raises(PreflightError, match=r"model\.path .*'/models/missing': does not exist"):
        check_group(bad, "actor")


def test_the_termination_message_goes_only_where_the_file_exists(tmp_path: Path) -> None:
    target = tmp_path / "termination-log"
    write_termination_message("nothing here", str(target))
    assert not target.exists()
    target.write_text("")
    write_termination_message("x" * 5000 + "the error", str(target))
    assert target.read_text() == "x" * 4087 + "the error"  # the kubelet's limit, the end kept


def test_the_cli_exits_with_the_config_code_before_starting_ray(task: Path, tmp_path: Path) -> None:
    raw = yaml.safe_load((task / "config.yaml").read_text())
    raw["model"]["path"] = "/no/such/model"
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(raw))
    result = subprocess.run(
        [sys.executable, "-m", "rlkube_trainer.pod.cli", "run", str(config)],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert result.returncode == ExitCode.CONFIG
    assert "error: model.path (RLJob spec.model.path) '/no/such/model': does not exist" in result.stderr
    assert "Traceback" not in result.stderr and "Ray" not in result.stderr


def test_use_liger_without_liger_kernel_is_refused_naming_the_field(task: Path, tmp_path: Path) -> None:
    """The CPU environment (the venv and the CPU image) has no liger-kernel: model.use_liger is
    refused before training, not an import error in the actor once the gang runs."""
    import importlib.util  # noqa: PLC0415

    if importlib.util.find_spec("liger_kernel") is not None:
        pytest.skip("liger-kernel is installed here")
    error = failure(config_with(task, tmp_path, model__use_liger=True))
    assert error.key == "model.use_liger"
    assert "spec.model.useLiger" in str(error) and "liger-kernel" in str(error)


def test_a_multi_turn_file_missing_is_named_as_a_key_the_config_map_lacks(task: Path, tmp_path: Path) -> None:
    """In an RLJob the operator turns multiTurn.configMap's keys into /etc/rlkube-agent/<key>;
    a key the ConfigMap lacks is a missing file there, named before any model loads."""
    missing = "/etc/rlkube-agent/tools.yaml"
    error = failure(config_with(task, tmp_path, rollout__multi_turn={"enable": True, "tool_config_path": missing}))
    assert error.key == "rollout.multi_turn.tool_config_path"
    assert f"(RLJob spec.rollout.multiTurn.toolConfigPath) '{missing}'" in str(error)
    assert "a key the ConfigMap lacks" in str(error)


def test_a_harness_program_that_is_not_there_is_named(task: Path, tmp_path: Path) -> None:
    """Otherwise every episode of the first batch would be lost to the same error."""
    error = failure(config_with(task, tmp_path, rollout__harness={"command": ["/app/no-agent.py", "--fast"]}))
    assert error.key == "rollout.harness.command"
    assert "'/app/no-agent.py': is not a program in this container" in str(error)
    check_driver(config_with(task, tmp_path, rollout__harness={"command": [sys.executable, "/app/agent.py"]}))
