"""Tensor parallel and Ulysses sequence parallel train as one process does: on gloo ranks (CPU),
the actor's policy loss and the critic's value loss through their real update code, for TP 2,
SP 2 and TP 2 × DP 2 against a single rank (fp32 under FSDP2 both): the old log-probs and
values, each update's losses, the gradients of the first optimizer step and the weights after
three updates (six optimizer steps) agree within float32 reduction-order noise. And a layout
the ranks or the model cannot take is refused, naming the RLJob field."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from transformers import LlamaConfig

from rlkube_trainer.parallel.layout import LayoutError, ParallelLayout
from rlkube_trainer.tiny.task import build_model, trainer_config

PROBE = Path(__file__).with_name("model_parallel_probe.py")
# name: (ranks, tensorParallelSize, ulyssesSequenceParallelSize)
LAYOUTS = {"one": (1, 1, 1), "tp2": (2, 2, 1), "sp2": (2, 1, 2), "tp2dp2": (4, 2, 1)}
# Measured differences to one rank: log-probs and losses about 1e-7, gradients 1e-7 (largest
# entry 0.5), weights 7e-6 after six AdamW steps of lr 3e-3 (a wrong gradient moves a weight by
# about lr per step, 300 times the tolerance).
CLOSE = {"atol": 1e-5, "rtol": 1e-4}
WEIGHTS = {"atol": 1e-4, "rtol": 0.0}


def config_for(workdir: Path, ranks: int, tensor: int, sequence: int) -> dict[str, Any]:
    sys.path.insert(0, str(PROBE.parent))
    from fsdp_probe import SAMPLES  # noqa: PLC0415

    raw = trainer_config(workdir, "gae")
    raw["model"]["use_remove_padding"] = False  # Ulysses runs padded batches
    sizes = {"tensor_parallel_size": tensor, "ulysses_sequence_parallel_size": sequence}
    raw["roles"] = {
        "actor": {"replicas": ranks, "gpus_per_replica": 0, **sizes},
        "critic": {"colocate_with": "actor", **sizes},
    }
    raw["data"]["train_batch_size"] = SAMPLES // 4
    for role in ("actor", "critic"):
        raw[role].update(
            {
                "strategy": "fsdp2",
                "ppo_mini_batch_size": SAMPLES // 8,
                "ppo_micro_batch_size_per_gpu": 2,
                "fsdp_config": {"mixed_precision": {"param_dtype": "fp32"}},
            }
        )
    return raw


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Every layout's results, from one start of the probe's processes."""
    from fsdp_probe import free_port  # noqa: PLC0415

    workdir = tmp_path_factory.mktemp("model-parallel")
    build_model(workdir / "model")
    (workdir / "data").mkdir()
    (workdir / "data" / "train.parquet").touch()  # the config names it; the probe reads no data
    (workdir / "reward.py").touch()
    arguments = []
    for name, (ranks, tensor, sequence) in LAYOUTS.items():
        (workdir / name).mkdir()
        config = workdir / name / "config.yaml"
        config.write_text(yaml.safe_dump(config_for(workdir, ranks, tensor, sequence)))
        arguments += [str(config), str(free_port())]
    result = subprocess.run(
        [sys.executable, str(PROBE), *arguments], capture_output=True, text=True, timeout=600, check=False
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return {name: torch.load(workdir / name / "results.pt") for name in LAYOUTS}


def assert_same_run(run: dict[str, Any], one: dict[str, Any]) -> None:
    torch.testing.assert_close(run["old_log_probs"], one["old_log_probs"], **CLOSE)
    torch.testing.assert_close(run["values"], one["values"], **CLOSE)
    for role, loss in (("actor", "actor/pg_loss"), ("critic", "critic/vf_loss")):
        for update, (mine, single) in enumerate(zip(run[role], one[role], strict=True)):
            for key in (loss, f"{role}/grad_norm"):
                assert mine[key] == pytest.approx(single[key], abs=1e-5, rel=1e-4), (role, update, key)
        grads, single_grads = run[f"{role}_grads"], one[f"{role}_grads"]
        assert grads.keys() == single_grads.keys()
        for name, grad in grads.items():
            torch.testing.assert_close(grad, single_grads[name], **CLOSE, msg=f"{role} gradient of {name}")
        weights, single_weights = run[f"{role}_weights"], one[f"{role}_weights"]
        assert weights.keys() == single_weights.keys()
        for name, weight in weights.items():
            torch.testing.assert_close(weight, single_weights[name], **WEIGHTS, msg=f"{role} weight {name}")


@pytest.mark.trainer
def test_the_single_rank_run_moves_the_weights(runs: dict[str, dict[str, Any]]) -> None:
    """What the layouts are compared with is a real update, not a standing start."""
    one = runs["one"]
    assert one["split"] == {"attention": "sdpa", "q_proj": [64, 64]}
    assert all(m["actor/grad_norm"] > 0 for m in one["actor"]) and all(m["critic/grad_norm"] > 0 for m in one["critic"])
    assert one["actor"][0]["actor/pg_loss"] != one["actor"][2]["actor/pg_loss"]


@pytest.mark.trainer
def test_tensor_parallel_2_trains_as_one_rank(runs: dict[str, dict[str, Any]]) -> None:
    assert runs["tp2"]["split"] == {"attention": "sdpa", "q_proj": [32, 64]}  # half the heads each
    assert_same_run(runs["tp2"], runs["one"])


@pytest.mark.trainer
def test_ulysses_sequence_parallel_2_trains_as_one_rank(runs: dict[str, dict[str, Any]]) -> None:
    # FSDP2 shards over the Ulysses group: the projection's rows are split between its 2 ranks.
    assert runs["sp2"]["split"] == {"attention": "rlkube_ulysses", "q_proj": [32, 64]}
    assert_same_run(runs["sp2"], runs["one"])


@pytest.mark.trainer
def test_tensor_parallel_2_by_data_parallel_2_trains_as_one_rank(runs: dict[str, dict[str, Any]]) -> None:
    assert runs["tp2dp2"]["split"] == {"attention": "sdpa", "q_proj": [16, 64]}  # tensor, then FSDP2
    assert_same_run(runs["tp2dp2"], runs["one"])


def test_a_layout_that_does_not_divide_the_ranks_is_refused_naming_the_field() -> None:
    with pytest.raises(LayoutError, match=r"roles\.actor\.tensorParallelSize 3 does not divide the role's 4 ranks"):
        ParallelLayout.of("actor", 4, tensor=3)
    with pytest.raises(LayoutError, match=r"roles\.critic: tensorParallelSize 4 × pipelineParallelSize 1 × "):
        ParallelLayout.of("critic", 12, tensor=4, sequence=6)
    with pytest.raises(LayoutError, match=r"roles\.actor\.fsdpSize 4 must divide"):
        ParallelLayout.of("actor", 4, tensor=2, fsdp_size=4)
    assert ParallelLayout.of("actor", 8, tensor=2, sequence=2) == ParallelLayout(2, 1, 2, 2)


def test_heads_that_the_layout_cannot_split_are_refused_naming_the_field_and_the_model() -> None:
    model = LlamaConfig(num_attention_heads=6, num_key_value_heads=2, hidden_size=48)
    with pytest.raises(LayoutError, match=r"roles\.actor\.tensorParallelSize 4 .* 6 attention heads and 2 key/value"):
        ParallelLayout.of("actor", 4, tensor=4).check_model(model)
    with pytest.raises(
        LayoutError, match=r"roles\.actor\.ulyssesSequenceParallelSize 2 .*\(3 attention, 1 key/value\)"
    ):
        ParallelLayout.of("actor", 4, tensor=2, sequence=2).check_model(model)
    ParallelLayout.of("actor", 4, tensor=2).check_model(model)
