"""Experiment trackers with the real packages, offline: the metrics the Tracker logs
are read back from MLflow's file store and from W&B's offline run file."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from rlkube_trainer.loop.tracking import RUN_IDS_FILE, Tracker, TrackerMissing, WandbTracker, mlflow_tracking_uri
from tests.trainer.wandb_records import history, run_info

MlflowClient = pytest.importorskip("mlflow.tracking").MlflowClient
pytest.importorskip("wandb")

STEPS = [
    {"critic/score/mean": 0.25, "actor/pg_loss": 1.5, "perf/throughput": 100.0},
    {"critic/score/mean": 0.5, "actor/pg_loss": 1.25, "perf/throughput": 120.0},
]


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("MLFLOW_TRACKING_URI", "WANDB_API_KEY", "WANDB_MODE", "WANDB_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")


def _train(out: Path, loggers: list[str], steps: list[dict[str, float]], first: int = 1) -> None:
    tracker = Tracker(out, loggers, "grpo-run", project="gsm8k")
    try:
        for step, metrics in enumerate(steps, start=first):
            tracker.log(step, metrics)
    finally:
        tracker.close()


def _mlflow_history(out: Path, key: str) -> tuple[str, str, list[tuple[int, float]]]:
    client = MlflowClient(tracking_uri=mlflow_tracking_uri(out, {}))
    [experiment] = [e for e in client.search_experiments() if e.name == "gsm8k"]
    [run] = client.search_runs([experiment.experiment_id])
    points = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, key))
    return experiment.name, run.info.run_name, points


def test_mlflow_logs_to_a_file_store_in_the_output_directory_by_default(tmp_path: Path) -> None:
    _train(tmp_path, ["mlflow"], STEPS)
    assert (tmp_path / "mlruns").is_dir()
    experiment, run, points = _mlflow_history(tmp_path, "critic/score/mean")
    assert (experiment, run) == ("gsm8k", "grpo-run")
    assert points == [(1, 0.25), (2, 0.5)]


def test_mlflow_follows_the_tracking_uri(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = tmp_path / "elsewhere"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store.as_uri())
    _train(tmp_path / "out", ["mlflow"], STEPS)
    assert not (tmp_path / "out" / "mlruns").exists()
    client = MlflowClient(tracking_uri=store.as_uri())
    assert [e.name for e in client.search_experiments() if e.name == "gsm8k"] == ["gsm8k"]


def test_a_restarted_driver_continues_the_same_mlflow_run(tmp_path: Path) -> None:
    _train(tmp_path, ["mlflow"], STEPS[:1])
    _train(tmp_path, ["mlflow"], STEPS[1:], first=2)
    _, _, points = _mlflow_history(tmp_path, "actor/pg_loss")
    assert points == [(1, 1.5), (2, 1.25)]


def _wandb_file(out: Path) -> Path:
    [path] = sorted((out / "wandb").glob("offline-run-*/run-*.wandb"))
    return path


def test_wandb_without_an_api_key_logs_offline_and_reads_back(tmp_path: Path) -> None:
    _train(tmp_path, ["wandb"], STEPS)
    path = _wandb_file(tmp_path)
    info = run_info(path)
    assert (info["project"], info["name"]) == ("gsm8k", "grpo-run")
    rows = [{k: v for k, v in row.items() if not k.startswith("_")} for row in history(path)]
    assert rows == STEPS
    assert [row["_step"] for row in history(path)] == [1, 2]


def test_wandb_goes_online_only_with_an_api_key() -> None:
    assert WandbTracker.mode_for({}) == "offline"
    assert WandbTracker.mode_for({"WANDB_API_KEY": "k"}) == "online"
    assert WandbTracker.mode_for({"WANDB_API_KEY": "k", "WANDB_MODE": "disabled"}) == "disabled"


def test_both_trackers_and_the_jsonl_see_the_same_steps(tmp_path: Path) -> None:
    _train(tmp_path, ["console", "mlflow", "wandb"], STEPS)
    tracker = Tracker(tmp_path, ["console"], "grpo-run")
    assert [row["critic/score/mean"] for row in tracker.history()] == [0.25, 0.5]
    _, _, points = _mlflow_history(tmp_path, "perf/throughput")
    assert [v for _, v in points] == [100.0, 120.0]
    assert [row["perf/throughput"] for row in history(_wandb_file(tmp_path))] == [100.0, 120.0]
    assert set((tmp_path / RUN_IDS_FILE).read_text().split('"')) >= {"mlflow", "wandb"}


def test_a_tracker_that_is_not_installed_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)  # an import of it now fails
    with pytest.raises(TrackerMissing, match=r"trainer.logger names wandb, but wandb is not installed"):
        Tracker(tmp_path, ["wandb"], "grpo-run")
