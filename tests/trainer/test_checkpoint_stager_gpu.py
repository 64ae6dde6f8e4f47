"""checkpoint.asyncSave on a GPU (skipped without one; CI has none: run it on a GPU host, as
bench/gpu/run.sh's `gpu-tests` phase does): one FSDP2 rank over NCCL. A rank's background
saves stage its sharded state into pinned host buffers made at the first save and reused by the
next (checkpoint/state.py: _stager), and what a save writes is the state of its step even though
the next update runs while the write goes on."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from tests.trainer.test_optimizer_offload_gpu import actor_for, nccl, step, weights, workdir

pytestmark = [
    pytest.mark.trainer,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

sys.path.insert(0, str(Path(__file__).parent))
__all__ = ["nccl", "workdir"]  # the fixtures this module uses


def staged_storages() -> dict[int, bool]:
    """The stager's host buffers: data pointer -> pinned (its cache, a public attribute of
    torch's BlockingAsyncStager)."""

    from rlkube_trainer.checkpoint import state  # noqa: PLC0415

    found: dict[int, bool] = {}

    def walk(obj: object) -> None:
        local = obj.to_local() if hasattr(obj, "to_local") else obj
        if isinstance(local, torch.Tensor) and local.dim() > 0:
            found[local.data_ptr()] = local.is_pinned()
        elif isinstance(obj, dict):
            for value in obj.values():
                walk(value)
        elif isinstance(obj, list | tuple):
            for value in obj:
                walk(value)

    walk(state._stager().state_dict_cache)
    return found


def test_background_saves_reuse_pinned_host_buffers_and_hold_their_steps_weights(
    nccl: None, workdir: Path, tmp_path: Path
) -> None:
    from fsdp_probe import global_batch  # noqa: PLC0415

    from rlkube_trainer.checkpoint.state import load_rank_state, stage_rank_state  # noqa: PLC0415

    actor = actor_for(workdir, offload=False)
    assert actor.sharded
    batch = global_batch(int(actor.model.config.vocab_size))
    step(actor, batch)
    first = stage_rank_state(tmp_path / "first", {"actor": actor}, 0)
    assert first.result(wait=True) is not None
    buffers = staged_storages()
    # torch stages a 0-dim tensor (the optimizer's step count) as a new unpinned scalar.
    assert buffers and all(buffers.values()), "the staged state is not in pinned host memory"

    step(actor, batch)
    at_save = weights(actor)
    second = stage_rank_state(tmp_path / "second", {"actor": actor}, 0)
    step(actor, batch)  # the next update, while the write may still go on
    assert second.result(wait=True) is not None
    assert staged_storages() == buffers, "the second save staged into new host buffers"

    resumed = actor_for(workdir, offload=False)
    load_rank_state(tmp_path / "second", {"actor": resumed}, 0)
    got = weights(resumed)
    for name, tensor in at_save.items():
        torch.testing.assert_close(got[name], tensor, rtol=0, atol=0, msg=name)
