"""What each rank sends and holds in a weight sync, on 4 gloo ranks with the tiny model:

- colocated, from FSDP 4 and from FSDP 2 × tensor parallel 2 (the trainer's DTensor plan on a 2-D
  mesh), into tensor-parallel-2 engines: each rank ends with exactly its slices, sends only
  what others keep of its shards, and never holds the whole model;
- separate, from an actor of 2 FSDP ranks (both send) to 2 rollout ranks with real HF engines:
  each sender sends half the model, each receiver receives it once, nobody holds it all, and
  the engines' weights equal the actor's bit for bit.

vLLM reading the slices (greedy TP 2 == TP 1, the rest of every tensor NaN) is test_distributed's.
"""

from __future__ import annotations

import datetime
import os
import pickle
import socket
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from rlkube_trainer.tiny.task import build_model
from rlkube_trainer.workers.resharding import ModelShape, gather_slices, tp_slice
from rlkube_trainer.workers.shard_boxes import SyncLedger
from rlkube_trainer.workers.weight_sync import WeightSyncGroup, load_into_engine, manifest_of

WORLD = 4
TP = 2
BUCKET = 48_000  # bytes of full fp32 tensors: the tiny model (~0.3 MB) in about 9 buckets


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _model(path: str) -> Any:
    from transformers import AutoModelForCausalLM  # noqa: PLC0415

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    torch.manual_seed(1)
    with torch.no_grad():  # the trained weights differ from the saved ones the engines start from
        for p in model.parameters():
            p.add_(0.01 * torch.randn_like(p))
    return model


def _colocated(rank: int, model_path: str, layout: tuple[int, ...]) -> dict[str, Any]:
    from torch.distributed.device_mesh import init_device_mesh  # noqa: PLC0415

    from rlkube_trainer.model.fsdp import shard_with_fsdp2  # noqa: PLC0415
    from rlkube_trainer.parallel.tensor import parallelize_decoder_layers  # noqa: PLC0415

    model = _model(model_path)
    full = {k: v.clone() for k, v in model.state_dict().items()}
    if len(layout) == 2:
        mesh = init_device_mesh("cpu", layout, mesh_dim_names=("dp", "tp"))
        parallelize_decoder_layers(model, mesh["tp"])  # the trainer's tensor-parallel plan
        shard_with_fsdp2(model, mesh["dp"])
    else:
        shard_with_fsdp2(model, init_device_mesh("cpu", layout, mesh_dim_names=("dp",)))
    shape = ModelShape.of(model.config)
    ledger = SyncLedger()
    wrong = []
    for name, piece, part, _ in gather_slices(
        model.state_dict().items(),
        lambda n, s, r: tp_slice(n, s, shape, TP, r % TP),
        torch.device("cpu"),
        BUCKET,
        ledger,
    ):
        want = full[name] if part is None else full[name].narrow(part.dim, part.start, part.length)
        if not torch.equal(piece, want):
            wrong.append(name)
    return {"sent": ledger.sent, "received": ledger.received, "peak": ledger.peak, "wrong": wrong}


def _separate(rank: int, model_path: str, port: int, out: str) -> dict[str, Any]:
    """Ranks 0-1: the actor (FSDP 2 over a mesh of their own); ranks 2-3: rollout engines."""
    from torch.distributed.device_mesh import DeviceMesh  # noqa: PLC0415

    from rlkube_trainer.model.fsdp import shard_with_fsdp2  # noqa: PLC0415
    from rlkube_trainer.rollout.hf_engine import HFRolloutEngine  # noqa: PLC0415

    mesh = DeviceMesh("cpu", [0, 1], mesh_dim_names=("dp",))  # every rank takes part in forming it
    timeout = datetime.timedelta(seconds=60)
    ledger = SyncLedger()
    if rank < 2:
        model = _model(model_path)
        shard_with_fsdp2(model, mesh)
        state = model.state_dict()
        manifest = manifest_of(state.items(), senders=2, group=mesh.get_group())
        group = WeightSyncGroup("127.0.0.1", port, WORLD, rank, torch.device("cpu"), timeout, senders=2)
        if rank == 0:
            group.store.set("manifest", pickle.dumps(manifest))
        group.send(iter(state.items()), manifest, BUCKET, ledger)
        full = {k: v.full_tensor() for k, v in state.items()}  # type: ignore[attr-defined]
        if rank == 0:
            torch.save(full, f"{out}/actor.pt")
    else:
        engine = HFRolloutEngine(model_path)
        group = WeightSyncGroup("127.0.0.1", port, WORLD, rank, torch.device("cpu"), timeout)
        manifest = pickle.loads(group.store.get("manifest"))
        load_into_engine(engine, group.receive(manifest, BUCKET, ledger), [s.name for s in manifest])
        torch.save({k: v.clone() for k, v in engine._model.state_dict().items()}, f"{out}/engine-{rank}.pt")
    return {"sent": ledger.sent, "received": ledger.received, "peak": ledger.peak}


def _rank(rank: int, model_path: str, ports: tuple[int, int], out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{ports[0]}", rank=rank, world_size=WORLD)
    results = {
        "fsdp4": _colocated(rank, model_path, (4,)),
        "fsdp2xtp2": _colocated(rank, model_path, (2, 2)),
        "separate": _separate(rank, model_path, ports[1], out),
    }
    torch.save(results, f"{out}/rank-{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def synced(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    out = tmp_path_factory.mktemp("weight-sync-bytes")
    build_model(out / "model")
    from transformers import AutoModelForCausalLM  # noqa: PLC0415

    model = AutoModelForCausalLM.from_pretrained(out / "model")
    model_bytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.spawn(_rank, args=(str(out / "model"), (_free_port(), _free_port()), str(out)), nprocs=WORLD)
    return out, model_bytes


def _ranks(out: Path) -> list[dict[str, Any]]:
    return [torch.load(out / f"rank-{r}.pt", weights_only=False) for r in range(WORLD)]


@pytest.mark.parametrize("layout", ["fsdp4", "fsdp2xtp2"])
def test_colocated_ranks_get_their_slices_and_never_hold_the_model(synced: tuple[Path, int], layout: str) -> None:
    out, model_bytes = synced
    ranks = [r[layout] for r in _ranks(out)]
    for r in ranks:
        assert r["wrong"] == []
        assert 0 < r["peak"] < model_bytes / 2  # slices of one bucket and what it sends of it
        assert r["received"] < model_bytes / 2  # about its half, less what it holds itself
    # What is sent is what is received, all told.
    assert sum(r["sent"] for r in ranks) == sum(r["received"] for r in ranks)


def test_separate_rollout_takes_each_senders_shard_and_equals_the_actor(synced: tuple[Path, int]) -> None:
    out, model_bytes = synced
    ranks = [r["separate"] for r in _ranks(out)]
    senders, receivers = ranks[:2], ranks[2:]
    # Each actor rank sends its own half (FSDP 2's rows); neither sends the model.
    assert all(0 < s["sent"] < 0.6 * model_bytes for s in senders)
    assert all(s["peak"] < model_bytes / 2 for s in senders)
    for r in receivers:
        assert r["received"] == model_bytes  # every full tensor once (lm_head is tied: its own entry)
        assert r["peak"] < model_bytes / 2  # every sender's boxes of one bucket + one full tensor
    actor = torch.load(out / "actor.pt")
    for rank in (2, 3):
        engine = torch.load(out / f"engine-{rank}.pt")
        assert engine.keys() == actor.keys()
        assert all(torch.equal(engine[k], actor[k]) for k in actor), rank
