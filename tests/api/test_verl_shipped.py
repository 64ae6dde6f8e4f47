"""verl's own composed configs, as its PyPI wheel ships them, with a user's usual overrides
applied the way Hydra applies them and saved the way Hydra saves them (interpolations kept):
`rlkube-trainer convert` maps what rlkube reads, ignores and lists what sits at verl's defaults,
and the RLJob it writes is admitted by the API server. The wheel is fetched once into the cache
outside the repository (keyed by version), with pip and the package index it is set up with."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import yaml
from omegaconf import OmegaConf

from rlkube_api.validation import load_trainer_config, parse_rljob
from rlkube_api.verl import VerlConfigError, convert
from rlkube_api.verl.defaults import DEFAULTS, VERL_VERSION
from rlkube_api.verl.shipped import SHIPPED_CONFIGS, defaults_of, read_wheel, render
from rlkube_trainer.pod.cli import main

Kubectl = Callable[..., subprocess.CompletedProcess[str]]

PPO, *OTHER_ENGINES = SHIPPED_CONFIGS

# What a verl user sets on the command line for a GRPO run (verl's examples/grpo_trainer).
OVERRIDES = [
    "actor_rollout_ref.model.path=/models/Qwen2.5-0.5B-Instruct",
    "data.train_files=/data/gsm8k/train.parquet",
    "data.val_files=/data/gsm8k/test.parquet",
    "data.max_prompt_length=1024",
    "algorithm.adv_estimator=grpo",
    "actor_rollout_ref.rollout.name=vllm",
    "actor_rollout_ref.rollout.n=5",
    "data.train_batch_size=256",
    "actor_rollout_ref.actor.ppo_mini_batch_size=64",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
    "actor_rollout_ref.actor.optim.lr=3e-6",
    "actor_rollout_ref.actor.use_kl_loss=true",
    "trainer.total_epochs=15",
    "trainer.n_gpus_per_node=4",
    "trainer.nnodes=2",
]


def _pip() -> list[str]:
    """A pip to download with: this interpreter's, or the one it was made from (a venv built
    by uv has none of its own)."""
    for python in (sys.executable, getattr(sys, "_base_executable", sys.executable), "python3"):
        command = [python, "-m", "pip"]
        if subprocess.run([*command, "--version"], capture_output=True, check=False).returncode == 0:
            return command
    pytest.fail("no pip to download verl's wheel with")


def verl_wheel(version: str = VERL_VERSION) -> Path:
    cache = Path(os.environ.get("RLKUBE_CACHE", Path.home() / ".cache" / "rlkube")) / f"verl-wheel-{version}"
    wheel = cache / f"verl-{version}-py3-none-any.whl"
    if not wheel.exists():
        partial = cache / "partial"
        partial.mkdir(parents=True, exist_ok=True)
        download = [*_pip(), "download", f"verl=={version}", "--no-deps", "--only-binary=:all:", "-d", str(partial)]
        result = subprocess.run(download, capture_output=True, text=True, check=False)
        assert result.returncode == 0, f"downloading verl {version}'s wheel failed:\n{result.stderr}"
        (partial / wheel.name).rename(wheel)
        partial.rmdir()
    return wheel


@pytest.fixture(scope="module")
def shipped() -> dict[str, dict[str, Any]]:
    version, configs = read_wheel(verl_wheel())
    assert version == VERL_VERSION
    return configs


def as_hydra_saves(config: dict[str, Any], overrides: list[str], resolve: bool = False) -> dict[str, Any]:
    """`config` with command-line overrides merged in, as written to a run's .hydra/config.yaml
    (interpolations kept), or resolved (`--cfg job --resolve`)."""
    merged = OmegaConf.merge(OmegaConf.create(config), OmegaConf.from_dotlist(overrides))
    tree = OmegaConf.to_container(merged, resolve=resolve, throw_on_missing=False)
    assert isinstance(tree, dict)
    return yaml.safe_load(yaml.safe_dump(tree))  # through text, as the command reads it


def test_the_defaults_table_is_verls_own(shipped: dict[str, dict[str, Any]]) -> None:
    assert defaults_of(shipped) == DEFAULTS
    table = resources.files("rlkube_api.verl").joinpath("verl-defaults.json").read_text()
    assert render(VERL_VERSION, defaults_of(shipped)) == table  # as `python -m rlkube_api.verl.shipped` writes it


def test_verls_ppo_config_with_a_users_overrides_converts(
    shipped: dict[str, dict[str, Any]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source, out = tmp_path / "config.yaml", tmp_path / "trainer.yaml"
    source.write_text(yaml.safe_dump(as_hydra_saves(shipped[PPO], OVERRIDES)))
    assert "${oc.select:" in source.read_text()
    assert main(["convert", str(source), "-o", str(out)]) == 0
    config = load_trainer_config(out)
    assert config.model.path == "/models/Qwen2.5-0.5B-Instruct"
    assert config.data.train_files == ["/data/gsm8k/train.parquet"] and config.data.max_prompt_length == 1024
    assert (config.algorithm.adv_estimator, config.rollout.n, config.rollout.name) == ("grpo", 5, "vllm")
    assert (config.data.train_batch_size, config.actor.ppo_mini_batch_size) == (256, 64)
    assert (config.actor.optim.lr, config.trainer.total_epochs) == (3e-6, 15)
    assert (config.roles.actor.replicas, config.roles.actor.gpus_per_replica) == (2, 4)
    assert config.roles.reference is not None and config.roles.critic is None
    # ${trainer.project_name}/${trainer.experiment_name}, resolved by OmegaConf.
    assert config.checkpoint.dir == "checkpoints/verl_examples/gsm8k"
    # No reward function path: verl's and rlkube's built-in scorers by data_source.
    assert config.reward.function is None and config.reward.model is None
    report = capsys.readouterr().err
    assert "actor_rollout_ref.rollout.n -> rollout.n" in report
    assert "actor_rollout_ref.rollout.mode: how verl reaches its engine" in report
    listed = next(line for line in report.splitlines() if "at verl 0.9.1's defaults" in line)
    assert int(listed.split()[1]) > 300, listed
    # Follows trainer.n_gpus_per_node (4 here) through verl's own interpolation: at default.
    assert "actor_rollout_ref.rollout: " in report and " n_gpus_per_node" in report


def test_verls_config_resolved_converts_alike(shipped: dict[str, dict[str, Any]]) -> None:
    """A resolved dump holds 4 where verl writes ${oc.select:trainer.n_gpus_per_node,8}:
    still verl's default, since verl's interpolation resolves to 4 in the same config."""
    written = convert(as_hydra_saves(shipped[PPO], OVERRIDES))
    resolved = convert(as_hydra_saves(shipped[PPO], OVERRIDES, resolve=True))
    assert resolved.config == written.config
    assert sorted(resolved.at_default) == sorted(written.at_default)


def test_a_changed_key_without_counterpart_is_refused_by_name(shipped: dict[str, dict[str, Any]]) -> None:
    changed = [
        *OVERRIDES,
        "actor_rollout_ref.rollout.over_sample_rate=0.1",
        "actor_rollout_ref.rollout.n_gpus_per_node=2",  # no longer trainer.n_gpus_per_node
    ]
    with pytest.raises(VerlConfigError) as caught:
        convert(as_hydra_saves(shipped[PPO], changed), "config.yaml")
    assert caught.value.errors == [
        "actor_rollout_ref.rollout.n_gpus_per_node: 2 is not verl 0.9.1's default "
        "('${oc.select:trainer.n_gpus_per_node,8}'), and rlkube has no counterpart",
        "actor_rollout_ref.rollout.over_sample_rate: 0.1 is not verl 0.9.1's default (0), and rlkube has no counterpart",
    ]


@pytest.mark.parametrize("path", OTHER_ENGINES, ids=lambda p: p.rsplit("_", 2)[-2])
def test_verls_other_engines_configs_are_refused_by_the_keys_that_choose_the_engine(
    shipped: dict[str, dict[str, Any]], path: str
) -> None:
    """Megatron, TorchTitan, VeOmni: every key of their configs is known; what is refused is the
    engine (and the optimizer names of Megatron and VeOmni). Megatron's engine is not refused: its
    parallel sizes become the roles' own (rlkube trains them with FSDP2 on one device mesh)."""
    with pytest.raises(VerlConfigError) as caught:
        convert(as_hydra_saves(shipped[path], OVERRIDES), "config.yaml")
    refused = {e.split(":")[0] for e in caught.value.errors}
    engine = {"actor_rollout_ref.actor.strategy", "actor_rollout_ref.ref.strategy", "critic.strategy"}
    assert engine.isdisjoint(refused) if "megatron" in path else engine <= refused
    assert refused <= {
        "actor_rollout_ref.actor.strategy",
        "actor_rollout_ref.ref.strategy",
        "critic.strategy",
        "actor_rollout_ref.actor.optim.optimizer",
        "critic.optim.optimizer",
    }, caught.value.errors


@pytest.mark.cluster
def test_the_api_server_admits_the_rljob_of_verls_config(
    shipped: dict[str, dict[str, Any]], tmp_path: Path, kubectl: Kubectl, rljob_crd: None, namespace: str
) -> None:
    source, out = tmp_path / "config.yaml", tmp_path / "rljob.yaml"
    source.write_text(yaml.safe_dump(as_hydra_saves(shipped[PPO], OVERRIDES)))
    assert main(["convert", str(source), "--rljob", "verl-grpo", "-o", str(out), "-q"]) == 0
    assert parse_rljob(yaml.safe_load(out.read_text())).spec.rollout is not None
    result = kubectl("create", "--dry-run=server", "-n", namespace, "-f", str(out), check=False)
    assert result.returncode == 0, result.stderr
