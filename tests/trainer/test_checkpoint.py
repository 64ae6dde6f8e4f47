"""Checkpoints: complete-or-invisible commits, the `latest` marker and its fallbacks, keep-last-N,
resume modes, RNG and optimizer round trips with identical continuation, and the HF export."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from rlkube_trainer.checkpoint import manager as manager_module
from rlkube_trainer.checkpoint.export import export_hf
from rlkube_trainer.checkpoint.folder import COMPLETE, LATEST, MANIFEST, Checkpoint, CheckpointError
from rlkube_trainer.checkpoint.integrity import check_checksum, written
from rlkube_trainer.checkpoint.manager import CheckpointManager
from rlkube_trainer.checkpoint.retention import Retention
from rlkube_trainer.checkpoint.state import capture_rng, load_torch, restore_rng, save_torch


def save_step(manager: CheckpointManager, step: int, value: int = 0) -> Path:
    """What the driver does: stage, let every writer save its part, commit."""
    staging = manager.staging(step)
    for rank in range(2):
        save_torch(staging / "actor" / f"rank_{rank}.pt", {"w": torch.full((3,), float(value + rank))})
    save_torch(staging / "driver.pt", {"step": step, "loader": {"epoch": 0, "batch_in_epoch": step}})
    return manager.commit(step, {"parts": {"actor": 2, "driver": 1}})


def names(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir())


def test_commit_writes_a_complete_checkpoint_and_the_marker(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path, max_to_keep=3)
    assert manager.latest() is None  # an empty (even missing) root has none
    final = save_step(manager, 7, value=5)
    assert final == tmp_path / "step_000007"
    assert names(tmp_path) == [LATEST, "step_000007"]  # the staging dir became the step dir
    assert (tmp_path / LATEST).read_text().strip() == "step_000007"
    assert (final / COMPLETE).is_file()
    manifest = json.loads((final / MANIFEST).read_text())
    assert manifest["step"] == 7 and manifest["parts"] == {"actor": 2, "driver": 1}
    assert set(manifest["files"]) == {"actor/rank_0.pt", "actor/rank_1.pt", "driver.pt"}
    assert "time" in manifest
    latest = manager.latest()
    assert latest == Checkpoint(7, final)
    assert torch.equal(load_torch(latest.file("actor/rank_1.pt"))["w"], torch.full((3,), 6.0))
    assert load_torch(latest.file("driver.pt"))["loader"] == {"epoch": 0, "batch_in_epoch": 7}


def test_keeps_the_last_n_complete_checkpoints(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path, max_to_keep=2)
    for step in (10, 20, 30, 40):
        save_step(manager, step)
    assert [c.step for c in manager.checkpoints()] == [30, 40]
    assert names(tmp_path) == [LATEST, "step_000030", "step_000040"]
    assert manager.latest() == Checkpoint(40, tmp_path / "step_000040")
    one = CheckpointManager(tmp_path / "one", max_to_keep=1)
    for step in (1, 2):
        save_step(one, step)
    assert [c.step for c in one.checkpoints()] == [2]  # max_to_keep=1 keeps the one just written


def test_a_crash_before_commit_is_never_resumed_and_is_cleaned_by_the_next_commit(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path, max_to_keep=3)
    assert manager.resolve("auto") is None
    # The first save crashes after the writers wrote: nothing to resume from.
    save_torch(manager.staging(5) / "actor" / "rank_0.pt", {"w": torch.ones(2)})
    assert manager.latest() is None and manager.resolve("auto") is None
    save_step(manager, 10)
    # The next one crashes, even with a COMPLETE file already in the staging dir: still step 10.
    staging = manager.staging(20)
    save_torch(staging / "driver.pt", {"step": 20})
    (staging / COMPLETE).touch()
    (staging / MANIFEST).write_text(json.dumps({"step": 20, "files": {}}))
    assert manager.latest() == Checkpoint(10, tmp_path / "step_000010")
    assert manager.resolve("auto") == Checkpoint(10, tmp_path / "step_000010")
    # A retry of step 20 starts from an empty staging dir, not from the crashed attempt's files.
    assert list(manager.staging(20).iterdir()) == []
    save_torch(manager.staging(20) / "driver.pt", {"step": 20})
    save_torch(manager.staging(30) / "driver.pt", {"step": 30})  # a later attempt crashes as well
    manager.commit(20, {})
    # Step 5's leftover is gone; step 30's staging (newer than the commit) is left alone.
    assert names(tmp_path) == [".tmp-step_000030", LATEST, "step_000010", "step_000020"]
    save_step(manager, 40)
    assert ".tmp-step_000030" not in names(tmp_path)


@pytest.mark.parametrize("marker", [None, b"", b"garbage\x00", b"step_000999", b"../step_000010", b"\xff\xfe"])
def test_a_missing_or_corrupt_marker_falls_back_to_the_newest_complete_dir(
    tmp_path: Path, marker: bytes | None
) -> None:
    manager = CheckpointManager(tmp_path, max_to_keep=3)
    save_step(manager, 10)
    save_step(manager, 20)
    latest = tmp_path / LATEST
    if marker is None:
        latest.unlink()
    else:
        latest.write_bytes(marker)  # empty, binary, a dir that is not there, outside the root
    assert manager.latest() == Checkpoint(20, tmp_path / "step_000020")
    assert manager.resolve("auto") == Checkpoint(20, tmp_path / "step_000020")


def test_an_incomplete_dir_named_by_the_marker_is_skipped(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path, max_to_keep=3)
    save_step(manager, 10)
    save_step(manager, 20)
    (tmp_path / "step_000020" / COMPLETE).unlink()
    assert manager.latest() == Checkpoint(10, tmp_path / "step_000010")
    # A part listed in the manifest that went missing or was truncated makes it incomplete too.
    save_step(manager, 30)
    (tmp_path / "step_000030" / "actor" / "rank_1.pt").unlink()
    assert manager.latest() == Checkpoint(10, tmp_path / "step_000010")
    save_step(manager, 40)
    (tmp_path / "step_000040" / "driver.pt").write_bytes(b"short")
    assert manager.latest() == Checkpoint(10, tmp_path / "step_000010")


def test_resolve(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path / "ckpt", max_to_keep=3)
    save_step(manager, 10)
    save_step(manager, 20)
    assert manager.resolve("disable") is None
    assert manager.resolve("auto") == Checkpoint(20, tmp_path / "ckpt" / "step_000020")
    explicit = tmp_path / "ckpt" / "step_000010"
    assert manager.resolve(str(explicit)) == Checkpoint(10, explicit)
    # A checkpoint copied elsewhere keeps its step (from the manifest, not the dir name).
    elsewhere = CheckpointManager(tmp_path / "other", max_to_keep=1).resolve(str(explicit))
    assert elsewhere is not None and elsewhere.step == 10

    missing = tmp_path / "nope" / "step_000010"
    with pytest.raises(CheckpointError, match=f"resume path {re.escape(str(missing))} .*no such directory"):
        manager.resolve(str(missing))
    (explicit / COMPLETE).unlink()
    with pytest.raises(CheckpointError, match=f"resume path {re.escape(str(explicit))} .*incomplete"):
        manager.resolve(str(explicit))
    with pytest.raises(CheckpointError, match="looks like a checkpoint root"):
        manager.resolve(str(tmp_path / "ckpt"))
    with pytest.raises(CheckpointError, match=r"'relative/step_000010'.*absolute"):
        manager.resolve("relative/step_000010")


def test_commit_errors_leave_nothing_behind(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path, max_to_keep=3)
    with pytest.raises(CheckpointError, match="call staging"):
        manager.commit(3, {})
    manager.staging(3)
    with pytest.raises(ValueError, match="reserved"):
        manager.commit(3, {"step": 4})
    with pytest.raises(TypeError):
        manager.commit(3, {"metric": object()})
    assert names(tmp_path) == [".tmp-step_000003"] and manager.latest() is None
    with pytest.raises(ValueError, match="max_to_keep"):
        CheckpointManager(tmp_path, max_to_keep=0)


def test_recommitting_a_step_replaces_it(tmp_path: Path) -> None:
    # Resumed from step 10, the run reaches step 20 again: the new step 20 replaces the old one.
    manager = CheckpointManager(tmp_path, max_to_keep=3)
    save_step(manager, 10)
    save_step(manager, 20, value=1)
    save_step(manager, 20, value=100)
    latest = manager.latest()
    assert latest is not None and latest.step == 20
    assert torch.equal(load_torch(latest.file("actor/rank_0.pt"))["w"], torch.full((3,), 100.0))
    assert names(tmp_path) == [LATEST, "step_000010", "step_000020"]


def test_load_torch_refuses_arbitrary_objects(tmp_path: Path) -> None:
    # weights_only: a pickled object of any class is not executed on load.
    save_torch(tmp_path / "evil.pt", {"thing": Checkpoint(1, tmp_path)})
    with pytest.raises(CheckpointError, match=re.escape(f"cannot load {tmp_path / 'evil.pt'}")):
        load_torch(tmp_path / "evil.pt")
    (tmp_path / "truncated.pt").write_bytes(b"PK\x03\x04")
    with pytest.raises(CheckpointError, match=r"truncated\.pt"):
        load_torch(tmp_path / "truncated.pt")


def draw() -> tuple[float, float, torch.Tensor]:
    return random.random(), float(np.random.standard_normal()), torch.rand(4)


def test_rng_round_trip(tmp_path: Path) -> None:
    draw()
    save_torch(tmp_path / "rng.pt", capture_rng())  # through the file: weights_only must accept it
    first = draw()
    draw()  # move on
    restore_rng(load_torch(tmp_path / "rng.pt"))
    again = draw()
    assert first[:2] == again[:2] and torch.equal(first[2], again[2])


def make_training(seed: int) -> tuple[nn.Module, torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 3))
    return model, optimizer, scheduler


def train_step(
    model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: torch.optim.lr_scheduler.LRScheduler
) -> None:
    x = torch.randn(16, 4)  # from the global RNG, so its state matters too
    loss = (model(x).squeeze(-1) - x.sum(-1)).pow(2).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    scheduler.step()


def test_optimizer_state_gives_an_identical_continuation(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path, max_to_keep=2)
    model, optimizer, scheduler = make_training(seed=0)
    for _ in range(3):
        train_step(model, optimizer, scheduler)
    staging = manager.staging(3)
    save_torch(
        staging / "actor" / "rank_0.pt",
        {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()},
    )
    save_torch(staging / "driver.pt", {"rng": capture_rng()})
    manager.commit(3, {})
    for _ in range(2):  # the uninterrupted run
        train_step(model, optimizer, scheduler)

    fresh, fresh_optimizer, fresh_scheduler = make_training(seed=123)  # a different init, overwritten
    checkpoint = manager.resolve("auto")
    assert checkpoint is not None
    state = load_torch(checkpoint.file("actor/rank_0.pt"))
    fresh.load_state_dict(state["model"])
    fresh_optimizer.load_state_dict(state["optimizer"])
    fresh_scheduler.load_state_dict(state["scheduler"])
    restore_rng(load_torch(checkpoint.file("driver.pt"))["rng"])
    for _ in range(2):
        train_step(fresh, fresh_optimizer, fresh_scheduler)

    assert fresh_scheduler.get_last_lr() == scheduler.get_last_lr()
    for (name, expected), (_, actual) in zip(model.state_dict().items(), fresh.state_dict().items(), strict=True):
        assert torch.equal(expected, actual), name


def test_export_hf_round_trip(tmp_path: Path) -> None:
    from rlkube_trainer.model.loading import load_causal_lm, load_tokenizer  # noqa: PLC0415  (transformers is slow to import)
    from rlkube_trainer.tiny.task import build_model  # noqa: PLC0415

    source = build_model(tmp_path / "model")
    model = load_causal_lm(str(source))
    tokenizer = load_tokenizer(str(source))
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.01)  # "trained": differs from the source
    out = tmp_path / "export" / "actor"
    assert export_hf(model, tokenizer, out) == out
    export_hf(model, tokenizer, out)  # a second export replaces the first in place
    assert names(out.parent) == ["actor"]  # no staging dir left behind

    loaded = load_causal_lm(str(out))
    assert load_tokenizer(str(out)).encode("1 2 =") == tokenizer.encode("1 2 =")
    for (name, expected), (_, actual) in zip(model.state_dict().items(), loaded.state_dict().items(), strict=True):
        assert torch.equal(expected, actual), name
    ids = torch.tensor([[2, 4, 5, 13]])
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, loaded(input_ids=ids).logits)


def test_retention_per_part_keeps_the_largest_limit_of_the_parts_a_checkpoint_holds() -> None:
    retention = Retention(3, {"actor": 1, "critic": 5})
    assert retention.kept({"actor", "driver.pt"}) == 1
    assert retention.kept({"actor", "critic", "driver.pt"}) == 5
    assert retention.kept({"driver.pt"}) == 3  # no part with a limit of its own: max_to_keep
    assert Retention(2, {"actor": None}).kept({"actor"}) == 2  # unset: max_to_keep
    with pytest.raises(ValueError, match="actor"):
        Retention(3, {"actor": 0})


def test_max_actor_ckpt_to_keep_prunes_older_checkpoints(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path, Retention(5, {"actor": 2}))
    for step in (10, 20, 30, 40):
        save_step(manager, step)
    assert [c.step for c in manager.checkpoints()] == [30, 40]


def test_the_only_complete_checkpoint_is_never_deleted(tmp_path: Path) -> None:
    """A part of the new checkpoint lost between the rename and the pruning (a volume that is
    not shared, a cleaner): the older checkpoints are all there is to resume from and stay."""
    manager = CheckpointManager(tmp_path, Retention(1, {"actor": 1}))
    save_step(manager, 10)
    staging = manager.staging(20)
    save_torch(staging / "actor" / "rank_0.pt", {"w": torch.zeros(3)})
    real_replace = manager_module.replace_dir

    def lose_a_part(src: Path, dst: Path) -> None:
        real_replace(src, dst)
        (dst / "actor" / "rank_0.pt").unlink()

    manager_module.replace_dir = lose_a_part  # type: ignore[assignment]
    try:
        manager.commit(20)
    finally:
        manager_module.replace_dir = real_replace  # type: ignore[assignment]
    assert [c.step for c in manager.checkpoints()] == [10]
    assert manager.latest() == Checkpoint(10, tmp_path / "step_000010")


def test_resume_from_seeds_a_run_until_it_has_checkpoints_of_its_own(tmp_path: Path) -> None:
    other = CheckpointManager(tmp_path / "other", max_to_keep=3)
    for step in (10, 20):
        save_step(other, step)
    mine = CheckpointManager(tmp_path / "mine", max_to_keep=3)
    seed_root, seed_step = str(tmp_path / "other"), str(tmp_path / "other" / "step_000010")
    assert mine.resolve("auto", seed_root) == Checkpoint(20, tmp_path / "other" / "step_000020")  # the root's latest
    assert mine.resolve("auto", seed_step) == Checkpoint(10, tmp_path / "other" / "step_000010")
    assert mine.resolve("auto") is None
    with pytest.raises(CheckpointError, match=r"resumeFrom path .*no such directory"):
        mine.resolve("auto", str(tmp_path / "nothing"))
    save_step(mine, 30)  # this run's own first checkpoint: restarts resume from it, not the seed
    assert mine.resolve("auto", seed_step) == Checkpoint(30, tmp_path / "mine" / "step_000030")


def test_a_writer_whose_file_the_driver_does_not_see_fails_the_commit_by_name(tmp_path: Path) -> None:
    """Rank 1's pod mounts no shared volume: it wrote into its own file system and reported the
    file; the driver's commit fails naming the rank and the file, and the previous checkpoint
    stays the one resumed from."""
    manager = CheckpointManager(tmp_path / "shared", max_to_keep=3)
    save_step(manager, 10)
    staging = manager.staging(20)
    save_torch(staging / "actor" / "rank_0.pt", {"w": torch.zeros(3)})
    expected = written(staging, ["actor/rank_0.pt"], "actor rank 0")
    own = tmp_path / "rank-1-pod" / staging.name  # the same path, in another pod's file system
    save_torch(own / "actor" / "rank_1.pt", {"w": torch.ones(3)})
    expected |= written(own, ["actor/rank_1.pt"], "actor rank 1")
    with pytest.raises(
        CheckpointError, match=r"actor rank 1 wrote actor/rank_1\.pt, which is not there.*checkpoint\.volume"
    ):
        manager.commit(20, expected=expected)
    assert manager.latest() == Checkpoint(10, tmp_path / "shared" / "step_000010")
    assert not (tmp_path / "shared" / "step_000020").exists()
    # A file cut short (a copy still going on, a full disk) fails the same way.
    save_torch(staging / "actor" / "rank_1.pt", {"w": torch.ones(3)})
    with open(staging / "actor" / "rank_1.pt", "r+b") as f:
        f.truncate(10)
    with pytest.raises(CheckpointError, match=r"actor rank 1 wrote actor/rank_1\.pt with \d+ bytes, 10 are there"):
        manager.commit(20, expected=expected)
    assert manager.latest() == Checkpoint(10, tmp_path / "shared" / "step_000010")
    # All there: committed, with the writers' checksums in the manifest.
    save_torch(staging / "actor" / "rank_1.pt", {"w": torch.ones(3)})
    expected |= written(staging, ["actor/rank_1.pt"], "actor rank 1")
    committed = manager.commit(20, expected=expected)
    manifest = json.loads((committed / MANIFEST).read_text())
    assert manifest["sha256"] == {name: record.sha256 for name, record in expected.items()}


def test_the_manifest_records_each_parts_ranks_and_layout() -> None:
    from rlkube_trainer.loop.saves import layout_of  # noqa: PLC0415

    files = ["actor/rank_0.pt", "actor/rank_1.pt", "actor/sharded/__0_0.distcp", "critic/rank_0.pt", "driver.pt"]
    assert layout_of(files) == {
        "actor": {"world_size": 2, "sharded": True},
        "critic": {"world_size": 1, "sharded": False},
    }


def test_a_part_changed_since_its_commit_is_refused_when_loaded(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path, max_to_keep=3)
    staging = manager.staging(10)
    save_torch(staging / "actor" / "rank_0.pt", {"w": torch.zeros(3)})
    committed = manager.commit(10, expected=written(staging, ["actor/rank_0.pt"], "actor rank 0"))
    check_checksum(committed, "actor/rank_0.pt")  # as written
    data = bytearray((committed / "actor" / "rank_0.pt").read_bytes())
    data[-1] ^= 0xFF  # one bit flipped, the size kept: the size check cannot see it
    (committed / "actor" / "rank_0.pt").write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"actor/rank_0\.pt is not what its writer wrote"):
        check_checksum(committed, "actor/rank_0.pt")
    check_checksum(committed, "driver.pt")  # no checksum recorded: not checked
