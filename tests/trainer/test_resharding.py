"""Training shards → tensor-parallel slices: which slice each engine rank keeps, what a
sharded actor's ranks send each other for it, and how many bytes that is per rank against
gathering every full tensor. vLLM reading only those slices is test_distributed's proof
(greedy TP 2 == TP 1 with the rest of every tensor NaN)."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from rlkube_trainer.workers.resharding import (
    ModelShape,
    Slice,
    SyncBytes,
    gather_full_tensors,
    gather_slices,
    shard_buckets,
    staged,
    sync_bytes,
    tp_slice,
)

GQA = ModelShape(num_attention_heads=8, num_key_value_heads=2)


@pytest.mark.parametrize(
    ("name", "shape", "tp", "rank", "expected"),
    [
        ("model.layers.0.self_attn.q_proj.weight", (512, 512), 4, 1, Slice(0, 128, 128)),
        ("model.layers.0.self_attn.q_proj.bias", (512,), 4, 3, Slice(0, 384, 128)),
        ("model.layers.0.self_attn.k_proj.weight", (128, 512), 2, 1, Slice(0, 64, 64)),
        # 2 KV heads over 4 ranks: ranks 0-1 keep head 0, ranks 2-3 head 1.
        ("model.layers.0.self_attn.v_proj.weight", (128, 512), 4, 1, Slice(0, 0, 64)),
        ("model.layers.0.self_attn.v_proj.weight", (128, 512), 4, 2, Slice(0, 64, 64)),
        ("model.layers.0.self_attn.o_proj.weight", (512, 512), 2, 1, Slice(1, 256, 256)),
        ("model.layers.0.mlp.gate_proj.weight", (1024, 512), 2, 1, Slice(0, 512, 512)),
        ("model.layers.0.mlp.down_proj.weight", (512, 1024), 4, 0, Slice(1, 0, 256)),
        # 1000 words pad to 1024: ranges of 512, the last cut at the real vocabulary.
        ("model.embed_tokens.weight", (1000, 512), 2, 1, Slice(0, 512, 488)),
        ("lm_head.weight", (1000, 512), 2, 0, Slice(0, 0, 512)),
        ("model.layers.0.input_layernorm.weight", (512,), 2, 1, None),
        ("model.norm.weight", (512,), 4, 3, None),
        ("model.layers.0.mlp.down_proj.weight", (512, 1024), 1, 0, None),
    ],
)
def test_each_tensor_parallel_rank_keeps_vllms_slice(
    name: str, shape: tuple[int, ...], tp: int, rank: int, expected: Slice | None
) -> None:
    assert tp_slice(name, shape, GQA, tp, rank) == expected


def test_a_dimension_that_does_not_split_is_refused() -> None:
    with pytest.raises(ValueError, match="does not split over tensor parallel 3"):
        tp_slice("model.layers.0.mlp.up_proj.weight", (1024, 512), GQA, 3, 0)


# A Llama layer shaped like the 7B's (4096 hidden, 11008 intermediate, 32 heads, 32000 words).
LLAMA_7B_LAYER = [
    ("model.embed_tokens.weight", (32000, 4096), torch.bfloat16),
    *[(f"model.layers.0.self_attn.{p}_proj.weight", (4096, 4096), torch.bfloat16) for p in "qkvo"],
    *[(f"model.layers.0.mlp.{p}_proj.weight", (11008, 4096), torch.bfloat16) for p in ("gate", "up")],
    ("model.layers.0.mlp.down_proj.weight", (4096, 11008), torch.bfloat16),
    ("model.layers.0.input_layernorm.weight", (4096,), torch.bfloat16),
]


def test_a_rank_receives_its_slice_not_every_full_tensor() -> None:
    """8 ranks, FSDP over all of them, tensor parallel 8: a rank needs 1/8 of each sharded
    matrix, and holds 1/8 of its rows already."""
    model = ModelShape(32, 32)
    per_rank = [sync_bytes(LLAMA_7B_LAYER, model, 8, r, 8) for r in range(8)]
    total = sum(2 * (s[0] * s[1] if len(s) == 2 else s[0]) for _, s, _ in LLAMA_7B_LAYER)
    # Naive: every full tensor, less the rows this rank holds.
    assert per_rank[0].full == total - total // 8
    # Column-parallel slices are exactly this rank's FSDP rows (nothing to receive); the
    # row-parallel o/down slices are 1/8 of the columns of the 7/8 rows held elsewhere.
    o_and_down = 2 * (4096 * 4096 + 4096 * 11008)
    norm_rows_elsewhere = 2 * 4096 * 7 // 8
    assert per_rank[0].sliced == o_and_down * 7 // 64 + norm_rows_elsewhere
    assert all(s.sliced < s.full / 7 for s in per_rank)


def test_with_tensor_parallel_1_a_rank_needs_every_full_tensor() -> None:
    one = sync_bytes(LLAMA_7B_LAYER, ModelShape(32, 32), 8, 3, 1)
    assert one.sliced == one.full
    assert sync_bytes(LLAMA_7B_LAYER, ModelShape(32, 32), 1, 0, 1) == SyncBytes(0, 0)


def test_staged_holds_the_slice_where_the_loader_cuts_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLKUBE_CHECK_TP_SLICES", "1")
    piece = torch.arange(6.0).view(2, 3)
    full = staged(piece, Slice(1, 3, 3), (2, 9))
    assert torch.equal(full.narrow(1, 3, 3), piece)
    assert full.isnan().sum() == 12
    assert staged(piece, None, (2, 3)) is piece


# --- a 2-rank gloo group: FSDP2 shards, each rank gathers its slice ---------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class TinyDecoderLayer(torch.nn.Module):
    """A Llama layer's tensors under their Hugging Face names (transformers stays unimported
    in the spawned ranks: it costs more than the test)."""

    def __init__(self, hidden: int, heads: int, kv_heads: int, intermediate: int) -> None:
        super().__init__()
        kv = hidden // heads * kv_heads
        self.self_attn = torch.nn.ModuleDict(
            {
                "q_proj": torch.nn.Linear(hidden, hidden, bias=False),
                "k_proj": torch.nn.Linear(hidden, kv, bias=False),
                "v_proj": torch.nn.Linear(hidden, kv, bias=False),
                "o_proj": torch.nn.Linear(hidden, hidden, bias=False),
            }
        )
        self.mlp = torch.nn.ModuleDict(
            {
                "gate_proj": torch.nn.Linear(hidden, intermediate, bias=False),
                "up_proj": torch.nn.Linear(hidden, intermediate, bias=False),
                "down_proj": torch.nn.Linear(intermediate, hidden, bias=False),
            }
        )
        self.input_layernorm = torch.nn.LayerNorm(hidden, bias=False)
        self.post_attention_layernorm = torch.nn.LayerNorm(hidden, bias=False)


class TinyLlama(torch.nn.Module):
    def __init__(self, vocab: int, hidden: int, heads: int, kv_heads: int, intermediate: int) -> None:
        super().__init__()
        self.model = torch.nn.Module()
        self.model.embed_tokens = torch.nn.Embedding(vocab, hidden)
        self.model.layers = torch.nn.ModuleList([TinyDecoderLayer(hidden, heads, kv_heads, intermediate)])
        self.model.norm = torch.nn.LayerNorm(hidden, bias=False)
        self.lm_head = torch.nn.Linear(hidden, vocab, bias=False)


class Counted:
    """A torch.distributed collective that counts its calls."""

    def __init__(self, name: str) -> None:
        self.name, self.calls = name, 0
        self.wrapped = getattr(dist, name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        return self.wrapped(*args, **kwargs)

    def __enter__(self) -> Counted:
        setattr(dist, self.name, self)
        return self

    def __exit__(self, *_: object) -> None:
        setattr(dist, self.name, self.wrapped)


def _gather(rank: int, world: int, port: int, tp: int, out: str) -> None:
    """Both gathers in one 2-rank group (spawning ranks costs more than the gathers)."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    _gather_slices(rank, world, tp, out)
    _gather_full(rank, world, out)
    dist.barrier()
    dist.destroy_process_group()


def _gather_slices(rank: int, world: int, tp: int, out: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh  # noqa: PLC0415

    from rlkube_trainer.model.fsdp import shard_with_fsdp2  # noqa: PLC0415

    torch.manual_seed(0)
    # A vocabulary of 100 pads to 128: the ranges [0, 64) and [64, 100) cut across the FSDP
    # rows [0, 50), [50, 100). 1 KV head over tp 2: both ranks keep it.
    shape = ModelShape(num_attention_heads=4, num_key_value_heads=1)
    model = TinyLlama(vocab=100, hidden=64, heads=4, kv_heads=1, intermediate=96)
    full = {k: v.clone() for k, v in model.state_dict().items()}
    shard_with_fsdp2(model, init_device_mesh("cpu", (world,), mesh_dim_names=("shard",)))
    state = model.state_dict()
    results = {}
    # One tensor a bucket (a bucket smaller than any tensor), a few, all of them in one.
    for bucket_bytes in (1, 40_000, 2**30):
        received, checked = 0, 0
        with Counted("all_to_all_single") as all_to_all:
            for name, piece, part, got in gather_slices(
                state.items(), lambda n, s, r: tp_slice(n, s, shape, tp, r % tp), torch.device("cpu"), bucket_bytes
            ):
                want = full[name] if part is None else full[name].narrow(part.dim, part.start, part.length)
                assert torch.equal(piece, want), name
                received += got
                checked += 1
        buckets = len(list(shard_buckets(state.items(), bucket_bytes)))
        results[bucket_bytes] = {"received": received, "checked": checked, "collectives": all_to_all.calls,
                                 "buckets": buckets}  # fmt: skip
    manifest = [(k, tuple(v.shape), v.dtype) for k, v in full.items()]
    predicted = sync_bytes(manifest, shape, world, rank, tp)
    torch.save({"results": results, "predicted": predicted}, f"{out}/slices-{rank}.pt")


WORLD = 2


@pytest.fixture(scope="module")
def gathered(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("gathers")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.spawn(_gather, args=(WORLD, _free_port(), 2, str(out)), nprocs=WORLD)
    return out


def test_sharded_ranks_gather_exactly_their_slices(gathered: Path) -> None:
    ranks: list[dict[str, Any]] = [torch.load(gathered / f"slices-{r}.pt", weights_only=False) for r in range(WORLD)]
    for rank in ranks:
        assert rank["predicted"].sliced < rank["predicted"].full
        for bucket_bytes, r in rank["results"].items():
            assert r["checked"] == 12  # 9 layer tensors + embedding, norm, LM head
            assert r["received"] == rank["predicted"].sliced
            assert r["collectives"] == r["buckets"], bucket_bytes  # one all-to-all per bucket
        # Every tensor alone; at 40 kB of fp32 full tensors: [embed 25.6k], [q 16.4k, k 4.1k,
        # v 4.1k], [o 16.4k], [gate 24.6k], [up 24.6k], [down 24.6k, 2 layer norms, norm],
        # [lm_head 25.6k]; all in one (the layer's and the root's FSDP2 units share a group).
        assert [rank["results"][b]["buckets"] for b in (1, 40_000, 2**30)] == [12, 7, 1]


def _gather_full(rank: int, world: int, out: str) -> None:
    """Full tensors from FSDP2 shards, per tensor (DTensor.full_tensor) and in buckets."""
    from torch.distributed.device_mesh import init_device_mesh  # noqa: PLC0415

    from rlkube_trainer.model.fsdp import shard_with_fsdp2  # noqa: PLC0415

    torch.manual_seed(0)
    # Uneven shards: 101 words (51 + 50 rows), 3 rows of `odd` (2 + 1), and 1 row of `single`
    # (rank 1 holds none of it).
    model = TinyLlama(vocab=101, hidden=64, heads=4, kv_heads=1, intermediate=96)
    model.odd = torch.nn.Parameter(torch.randn(3, 5))
    model.single = torch.nn.Parameter(torch.randn(1, 7))
    shard_with_fsdp2(model, init_device_mesh("cpu", (world,), mesh_dim_names=("shard",)))
    state = model.state_dict()
    assert state["single"].to_local().shape[0] == (1 if rank == 0 else 0)  # type: ignore[attr-defined]
    per_tensor = [(name, t.full_tensor()) for name, t in state.items()]  # type: ignore[attr-defined]
    results = {}
    for bucket_bytes in (1, 40_000, 2**30):
        with Counted("all_gather_into_tensor") as all_gather:
            bucketed = list(gather_full_tensors(state.items(), bucket_bytes, torch.device("cpu")))
        buckets = [[n for n, _ in b] for _, b in shard_buckets(state.items(), bucket_bytes)]
        identical = [n for (n, a), (m, b) in zip(per_tensor, bucketed, strict=True) if n == m and torch.equal(a, b)]
        results[bucket_bytes] = {"identical": identical, "collectives": all_gather.calls, "buckets": buckets}
    torch.save({"names": [n for n, _ in per_tensor], "results": results}, f"{out}/full-{rank}.pt")


def test_bucketed_gathers_give_every_full_tensor_bit_for_bit_with_one_collective_per_bucket(gathered: Path) -> None:
    for r in range(WORLD):
        rank = torch.load(gathered / f"full-{r}.pt", weights_only=False)
        names = rank["names"]
        assert len(names) == 14
        for bucket_bytes, result in rank["results"].items():
            assert result["identical"] == names, bucket_bytes  # every tensor, in order, bit for bit
            assert result["collectives"] == len(result["buckets"]), bucket_bytes
            assert [n for b in result["buckets"] for n in b] == names
        buckets = {b: r["buckets"] for b, r in rank["results"].items()}
        assert len(buckets[1]) == 14  # a bucket smaller than any tensor: each alone
        assert len(buckets[2**30]) == 1
        # 40 kB: tensors gathered together up to it (a larger one alone: the 101 × 64 fp32
        # embedding is 25.9 kB, the 96 × 64 projections 24.6 kB each).
        assert 1 < len(buckets[40_000]) < 14
        assert any(len(b) > 1 for b in buckets[40_000])


def test_a_rank_removes_only_its_own_stale_cpu_shm_segment(tmp_path: Path) -> None:
    from rlkube_trainer.workers.rank import clear_stale_cpu_shm  # noqa: PLC0415

    names = ["-tp:0-[2-3]-cpushm_1", "-tp:0-[2-3]-cpushm_0", "-tp:0-[0-1]-cpushm_1", "other"]
    for name in names:
        (tmp_path / name).write_bytes(b"")
    removed = clear_stale_cpu_shm(3, 2, tmp_path)  # rank 3 = tp rank 1 of the engine over ranks 2-3
    assert [p.name for p in removed] == ["-tp:0-[2-3]-cpushm_1"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names[1:])
