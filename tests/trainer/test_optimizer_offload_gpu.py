"""fsdpConfig.optimizerOffload on a GPU (skipped without one; CI has none: run it on a GPU host,
docs/trainer.md "Memory: a step's timeline"): one FSDP2 rank over NCCL. Between updates every
state tensor but the step count is in pinned host memory and the GPU holds exactly the moments
less; loading it back for the step and moving it out again round-trip; two updates give the
weights they give without the offload; a sharded checkpoint (DCP over NCCL) saved with the
state on the host resumes to the same weights."""

from __future__ import annotations

import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

pytestmark = [
    pytest.mark.trainer,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(scope="module")
def nccl() -> Iterator[None]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from rlkube_trainer.tiny.task import build_model  # noqa: PLC0415

    path = tmp_path_factory.mktemp("offload-gpu")
    build_model(path / "model")
    (path / "data").mkdir()
    (path / "data" / "train.parquet").touch()
    (path / "reward.py").touch()
    return path


def actor_for(workdir: Path, offload: bool) -> Any:
    from fsdp_probe import config_for  # noqa: PLC0415

    from rlkube_api.validation import parse_trainer_config  # noqa: PLC0415
    from rlkube_trainer.workers.builders import build_actor  # noqa: PLC0415

    raw = config_for(workdir, 1, "fsdp2", None, "fp32", optimizer_offload=offload)
    return build_actor(parse_trainer_config(raw), torch.device("cuda"), total_steps=10)


def state_tensors(actor: Any) -> list[torch.Tensor]:
    return [
        value
        for state in actor.optimizer.state.values()
        for key, value in state.items()
        if key != "step" and isinstance(value, torch.Tensor)
    ]


def local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor  # type: ignore[no-any-return]


def step(actor: Any, batch: Any) -> None:
    batch.old_log_probs = actor.compute_log_prob(batch)
    actor.update(batch)


def weights(actor: Any) -> dict[str, torch.Tensor]:
    return {name: t.detach().cpu().clone() for name, t in actor.named_weights()}


def test_optimizer_state_waits_in_pinned_host_memory_and_trains_the_same(
    nccl: None, workdir: Path, tmp_path: Path
) -> None:
    from fsdp_probe import global_batch  # noqa: PLC0415

    from rlkube_trainer.checkpoint.state import load_rank_state, save_rank_state  # noqa: PLC0415

    kept = actor_for(workdir, offload=False)
    batch = global_batch(int(kept.model.config.vocab_size))
    step(kept, batch)
    assert {local(t).device.type for t in state_tensors(kept)} == {"cuda"}
    step(kept, batch)
    want = weights(kept)
    del kept
    torch.cuda.empty_cache()

    actor = actor_for(workdir, offload=True)
    step(actor, batch)
    tensors = state_tensors(actor)
    assert tensors and all(local(t).device.type == "cpu" and local(t).is_pinned() for t in tensors)
    moments = sum(local(t).numel() * local(t).element_size() for t in tensors)
    params = sum(local(p).numel() * local(p).element_size() for p in actor.model.parameters())
    assert moments == 2 * params  # AdamW's exp_avg and exp_avg_sq
    off = torch.cuda.memory_allocated()
    actor._load_optimizer_state()
    assert {local(t).device.type for t in state_tensors(actor)} == {"cuda"}
    on = torch.cuda.memory_allocated()
    assert moments <= on - off <= moments + 512 * len(tensors)  # the allocator rounds to 512 bytes
    actor._offload_optimizer_state()
    assert torch.cuda.memory_allocated() == off

    save_rank_state(tmp_path / "checkpoint", {"actor": actor}, 0)  # DCP over NCCL, state on the host
    step(actor, batch)
    assert all(local(t).is_pinned() for t in state_tensors(actor))
    got = weights(actor)
    for name, tensor in want.items():
        torch.testing.assert_close(got[name], tensor, rtol=0, atol=1e-6, msg=name)
    del actor
    torch.cuda.empty_cache()

    resumed = actor_for(workdir, offload=True)
    load_rank_state(tmp_path / "checkpoint", {"actor": resumed}, 0)
    assert all(local(t).device.type == "cpu" for t in state_tensors(resumed))
    step(resumed, batch)
    again = weights(resumed)
    for name, tensor in want.items():
        torch.testing.assert_close(again[name], tensor, rtol=0, atol=1e-6, msg=name)
