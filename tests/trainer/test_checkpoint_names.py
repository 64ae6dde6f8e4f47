"""A mixture of experts reaches the rollout engine as its checkpoint holds it: transformers 5
fuses a Qwen3-MoE's experts on load, and `CheckpointNames` cuts them back, tensor by tensor,
to the checkpoint's names, shapes and values (what vLLM loads); a dense model passes through
untouched. The tiny models are built here."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from rlkube_trainer.model.checkpoint_names import CheckpointNames
from rlkube_trainer.model.loading import causal_lm_skeleton, load_causal_lm
from rlkube_trainer.tiny.task import build_model

pytestmark = pytest.mark.trainer


def _saved(path: Path) -> dict[str, torch.Tensor]:
    with safe_open(str(path / "model.safetensors"), "pt") as saved:
        return {name: saved.get_tensor(name) for name in saved.keys()}  # noqa: SIM118 (safe_open is no dict)


def test_fused_experts_go_back_to_the_checkpoints_tensors(tmp_path: Path) -> None:
    path = build_model(tmp_path / "moe", experts=4)
    model = load_causal_lm(str(path))
    state = model.state_dict()
    assert any(name.endswith("mlp.experts.gate_up_proj") for name in state), "transformers no longer fuses experts"
    names = CheckpointNames(model, state.items())
    assert names.converts
    converted = dict(names.tensors(state.items()))
    saved = _saved(path)
    # The tied head is the embedding again: the engine's names allow it (rollout/vllm/weights.py).
    assert converted.keys() - {"lm_head.weight"} == saved.keys()
    assert "model.layers.1.mlp.experts.3.down_proj.weight" in converted
    for name, tensor in saved.items():
        assert torch.equal(converted[name], tensor), name
    # Names alone, from a rank's meta skeleton (no weights, no from_pretrained): the same.
    with torch.device("meta"):
        skeleton = causal_lm_skeleton(str(path))
    assert CheckpointNames(skeleton, skeleton.state_dict().items()).names(skeleton.state_dict().items()) == list(
        converted
    )


def test_a_dense_model_passes_through(tmp_path: Path) -> None:
    model = load_causal_lm(str(build_model(tmp_path / "dense")))
    names = CheckpointNames(model, model.state_dict().items())
    assert not names.converts
    assert [n for n, _ in names.tensors(model.state_dict().items())] == list(model.state_dict())


def test_vllm_on_cpu_refuses_a_mixture_of_experts_it_could_not_update(tmp_path: Path) -> None:
    """vLLM's CPU experts keep the weights they were packed with: the rollout is refused before
    the engine starts, naming the model, rather than sampling from a stale policy."""
    from rlkube_trainer.rollout.vllm.weights import check_updatable_on_cpu  # noqa: PLC0415

    moe = build_model(tmp_path / "moe", experts=4)
    with pytest.raises(ValueError, match=r"model.path .*moe: a mixture of experts \(4 experts, Qwen3MoeForCausalLM\)"):
        check_updatable_on_cpu(str(moe))
    check_updatable_on_cpu(str(build_model(tmp_path / "dense")))
