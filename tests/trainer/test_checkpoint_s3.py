"""Checkpoints in an object store (checkpoint.uri: s3://bucket/prefix), against a real
S3-compatible server on loopback (gofakes3 with its on-disk backend, rlkube_e2e.s3server):
the same commit protocol as on a volume, a save cut by a server restart is never resumed
from and the next save works, and `rlkube-trainer run` checkpoints there and resumes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import yaml

from rlkube_e2e.s3server import S3Server
from rlkube_trainer.checkpoint.folder import COMPLETE, LATEST, MANIFEST, CheckpointError, check_complete
from rlkube_trainer.checkpoint.integrity import Written, check_checksum, sha256_of, written
from rlkube_trainer.checkpoint.manager import CheckpointManager
from rlkube_trainer.checkpoint.objectstore import CheckpointPath, ObjectPath, locate, storage_options
from rlkube_trainer.checkpoint.owner import JobIdentity, claim, owner_of
from rlkube_trainer.checkpoint.state import load_torch, save_torch
from rlkube_trainer.tiny.task import init


def root_of(s3: S3Server, prefix: str) -> ObjectPath:
    url = f"s3://{s3.bucket}/{prefix}"
    options = storage_options(url, s3.endpoint)
    # A request to a server that is down fails after a retry, not after the default backoff.
    options["retry_config"] = {"max_retries": 1, "retry_timeout": timedelta(seconds=5)}
    return ObjectPath(url, options)


def save_step(manager: CheckpointManager, step: int, value: int = 0) -> CheckpointPath:
    """What the driver does: stage, let every writer save its part and report it, commit."""
    staging = manager.staging(step)
    expected = {}
    for rank in range(2):
        save_torch(staging / "actor" / f"rank_{rank}.pt", {"w": torch.full((3,), float(value + rank))})
        expected |= written(staging, [f"actor/rank_{rank}.pt"], f"actor rank {rank}")
    save_torch(staging / "driver.pt", {"step": step})
    expected |= written(staging, ["driver.pt"], "the driver")
    return manager.commit(step, {"parts": ["actor", "driver.pt"]}, expected)


def test_a_checkpoint_is_written_in_place_its_manifest_and_marker_last(s3: S3Server) -> None:
    root = root_of(s3, "in-place")
    manager = CheckpointManager(root, max_to_keep=2)
    assert manager.latest() is None  # nothing under the prefix yet
    final = save_step(manager, 10, value=5)
    assert final == root / "step_000010"
    assert sorted(root.files()) == [
        LATEST,
        "step_000010/COMPLETE",
        "step_000010/actor/rank_0.pt",
        "step_000010/actor/rank_1.pt",
        "step_000010/driver.pt",
        "step_000010/manifest.json",
    ]  # no staging prefix, no rename
    manifest = json.loads((final / MANIFEST).read_text())
    assert set(manifest["files"]) == {"actor/rank_0.pt", "actor/rank_1.pt", "driver.pt"}
    assert manifest["sha256"]["actor/rank_1.pt"] == sha256_of(final / "actor" / "rank_1.pt")
    latest = manager.latest()
    assert latest is not None and latest.step == 10 and latest.path == final
    assert torch.equal(load_torch(latest.file("actor/rank_1.pt"))["w"], torch.full((3,), 6.0))
    check_checksum(final, "actor/rank_0.pt")
    for step in (20, 30):
        save_step(manager, step)
    assert [c.step for c in manager.checkpoints()] == [20, 30]  # keep-last-2 deletes in the store
    assert not any(name.startswith("step_000010/") for name in root.files())


def test_a_part_the_store_does_not_hold_fails_the_commit_by_name(s3: S3Server) -> None:
    manager = CheckpointManager(root_of(s3, "missing-part"), max_to_keep=3)
    save_step(manager, 10)
    staging = manager.staging(20)
    save_torch(staging / "actor" / "rank_0.pt", {"w": torch.zeros(3)})
    expected = written(staging, ["actor/rank_0.pt"], "actor rank 0")
    expected["actor/rank_1.pt"] = Written(100, "0" * 64, "actor rank 1")  # reported, never arrived
    with pytest.raises(CheckpointError, match=r"actor rank 1 wrote actor/rank_1\.pt, which is not there"):
        manager.commit(20, expected=expected)
    latest = manager.latest()
    assert latest is not None and latest.step == 10
    assert not (staging / COMPLETE).exists()


def test_a_save_cut_by_a_server_restart_is_never_resumed_and_the_next_save_works(s3: S3Server) -> None:
    """The server is killed (SIGKILL, its state on disk) while step 20 is being written: that
    save fails, the store comes back with step 10 as the latest complete checkpoint (step 20's
    parts are there, its manifest is not), and saving step 20 again, then 30, works."""
    root = root_of(s3, "restart")
    manager = CheckpointManager(root, max_to_keep=3)
    save_step(manager, 10, value=1)
    staging = manager.staging(20)
    save_torch(staging / "actor" / "rank_0.pt", {"w": torch.zeros(3)})  # one rank's part is in
    s3.stop(kill=True)
    try:
        with pytest.raises(Exception):  # noqa: B017  (obstore's own error)
            save_torch(staging / "actor" / "rank_1.pt", {"w": torch.ones(3)})
    finally:
        s3.start()
    assert (staging / "actor" / "rank_0.pt").is_file()  # the server kept what it had
    assert not (staging / MANIFEST).exists() and not (staging / COMPLETE).exists()
    latest = CheckpointManager(root, max_to_keep=3).latest()  # a new driver, after its restart
    assert latest is not None and latest.step == 10
    assert torch.equal(load_torch(latest.file("actor/rank_0.pt"))["w"], torch.full((3,), 1.0))
    # The next save of the same step clears the leftover first, then commits as usual.
    save_step(manager, 20, value=2)
    save_step(manager, 30, value=3)
    assert [c.step for c in manager.checkpoints()] == [10, 20, 30]
    latest = manager.latest()
    assert latest is not None and latest.step == 30
    assert (root / LATEST).read_text().strip() == "step_000030"


def test_resume_from_and_the_owner_file_live_in_the_store(s3: S3Server) -> None:
    other = CheckpointManager(root_of(s3, "seed"), max_to_keep=3)
    save_step(other, 10)
    mine_root = root_of(s3, "mine")
    mine = CheckpointManager(mine_root, max_to_keep=3)
    seeded = mine.resolve("auto", f"s3://{s3.bucket}/seed")
    assert seeded is not None and seeded.step == 10 and str(seeded.path) == f"s3://{s3.bucket}/seed/step_000010"
    explicit = mine.resolve(f"s3://{s3.bucket}/seed/step_000010")
    assert explicit is not None and explicit.step == 10
    with pytest.raises(CheckpointError, match="not a complete checkpoint"):
        mine.resolve(f"s3://{s3.bucket}/seed/step_000099")
    job = JobIdentity("ml", "grpo", "uid-1")
    claim(mine_root, job, adopt=False)
    assert owner_of(mine_root) == job


def test_a_location_is_local_unless_it_has_a_scheme(tmp_path: Path) -> None:
    assert locate(str(tmp_path)) == tmp_path
    assert isinstance(locate("s3://bucket/prefix", "http://127.0.0.1:1"), ObjectPath)
    assert storage_options("s3://b/p", "http://127.0.0.1:1") == {
        "config": {"endpoint": "http://127.0.0.1:1"},
        "client_options": {"allow_http": True},
    }
    assert storage_options("s3://b/p", None) == {}  # AWS S3, credentials and region from the environment


def _run(config: Path, s3: S3Server) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rlkube_trainer.pod.cli", "run", str(config), "--in-process", "--no-progress"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env={**os.environ, **s3.client_env()},
    )


@pytest.mark.trainer
def test_rlkube_trainer_run_checkpoints_to_the_s3_server_and_resumes_from_it(tmp_path: Path, s3: S3Server) -> None:
    """The tiny task with checkpoint.uri: every step's checkpoint, the HF export and
    metrics.jsonl go to the server; the local dir is then deleted (a new pod without a volume),
    the server restarted, and a longer run resumes from the last checkpoint in the store."""
    raw = yaml.safe_load(init(tmp_path, "grpo", steps=2).read_text())
    raw["rollout"]["name"] = "hf"
    raw["data"]["train_batch_size"] = 8
    raw["actor"].update(ppo_mini_batch_size=4, ppo_micro_batch_size_per_gpu=8)
    raw["trainer"].update(save_freq=1, logger=["console"], test_freq=-1, val_before_train=False)
    uri = f"s3://{s3.bucket}/runs/tiny"
    raw["checkpoint"].update(uri=uri, endpoint_url=s3.endpoint, dir=str(tmp_path / "work"))
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(raw))

    first = _run(config, s3)
    assert first.returncode == 0, first.stderr[-4000:]
    root = root_of(s3, "runs/tiny")
    objects = root.files()
    assert (root / LATEST).read_text().strip() == "step_000002"
    assert {"step_000001/COMPLETE", "step_000002/COMPLETE", "step_000002/driver.pt"} <= set(objects)
    assert any(name.startswith("step_000002/actor/") for name in objects)
    assert "hf/config.json" in objects and any(n.startswith("hf/") and n.endswith(".safetensors") for n in objects)
    assert [json.loads(line)["step"] for line in (root / "metrics.jsonl").read_text().splitlines()] == [1, 2]

    # A new pod: nothing local, the server restarted in between; two more steps.
    subprocess.run(["rm", "-rf", str(tmp_path / "work")], check=True)
    s3.restart()
    raw["trainer"]["total_training_steps"] = 4
    config.write_text(yaml.safe_dump(raw))
    second = _run(config, s3)
    assert second.returncode == 0, second.stderr[-4000:]
    assert f"resumed from {uri}/step_000002 (step 2)" in second.stderr
    assert (root / LATEST).read_text().strip() == "step_000004"
    steps = [json.loads(line)["step"] for line in (root / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]  # the first run's rows came back from the store, then this run's


@pytest.mark.trainer
def test_async_saves_write_to_the_s3_server_and_commit_once_written(tmp_path: Path, s3: S3Server) -> None:
    """checkpoint.async_save with checkpoint.uri: each rank uploads its part on its write
    thread, the driver writes manifest.json, COMPLETE and latest once all are there."""
    from rlkube_api.validation import parse_trainer_config  # noqa: PLC0415
    from rlkube_trainer.loop.driver import run_in_process  # noqa: PLC0415

    raw = yaml.safe_load(init(tmp_path, "grpo", steps=3).read_text())
    raw["rollout"]["name"] = "hf"
    raw["data"]["train_batch_size"] = 4
    raw["actor"].update(ppo_mini_batch_size=4, ppo_micro_batch_size_per_gpu=8)
    raw["trainer"].update(save_freq=1, logger=["console"], test_freq=-1, val_before_train=False)
    uri = f"s3://{s3.bucket}/runs/async"
    raw["checkpoint"].update(
        uri=uri, endpoint_url=s3.endpoint, dir=str(tmp_path / "work"), async_save=True, export_hf="never"
    )
    result = run_in_process(parse_trainer_config(raw), progress=False)
    root = root_of(s3, "runs/async")
    assert (root / LATEST).read_text().strip() == "step_000003"
    assert str(result.last_checkpoint) == f"{uri}/step_000003"
    for step in (1, 2, 3):
        checkpoint = check_complete(root / f"step_{step:06d}")
        assert checkpoint.step == step and "actor/rank_0.pt" in checkpoint.manifest()["sha256"]
    rows = [json.loads(line) for line in (root / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1, 2, 3]
    assert "timing_s/save_checkpoint_background" in rows[-1]


def test_the_preflight_writes_to_the_store_and_names_checkpoint_uri_when_it_cannot(s3: S3Server) -> None:
    from rlkube_trainer.pod.preflight import PreflightError, check_checkpoint_uri  # noqa: PLC0415

    check_checkpoint_uri(f"s3://{s3.bucket}/preflight", s3.endpoint)
    assert not root_of(s3, "preflight").exists()  # its probe deleted again
    with pytest.raises(PreflightError, match=r"checkpoint\.uri \(RLJob spec\.checkpoint\.uri\) .*not writable at"):
        check_checkpoint_uri("s3://no-such-bucket/run", s3.endpoint)
