"""The experiment trackers on a full volume, for real: TensorBoard's event files and MLflow's
file store on a small tmpfs that a ballast file fills between two steps. The next step's write
is StorageFull naming the mount point and the tracker's folder, which the driver exits with as
STORAGE_FULL (the exit code checked here from the error itself).

Needs root (mount); skipped elsewhere.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rlkube_api.exit_codes import ExitCode
from rlkube_trainer.checkpoint.volume import StorageFull
from rlkube_trainer.loop.tracking import ExperimentTracker, MlflowTracker, TensorBoardWriter
from rlkube_trainer.pod.failures import exit_code_of
from tests.trainer.small_volume import fill, tmpfs

pytestmark = pytest.mark.trainer

VOLUME_BYTES = 4 * 2**20
# More than the free part of a file's last page: the step needs new blocks (and new files).
WIDE_STEP = {f"key_{i:04d}/mean": float(i) for i in range(400)}


def _full_after_one_step(tracker: ExperimentTracker, volume: Path) -> StorageFull:
    tracker.log(1, {"critic/score/mean": 0.5})
    fill(volume)
    with pytest.raises(StorageFull) as raised:
        tracker.log(2, WIDE_STEP)
    return raised.value


# TensorBoard's writer thread dies raising the error; its writer raises it again in the step.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_tensorboard_on_a_full_volume_names_it(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "volume", VOLUME_BYTES) as volume:
        folder = volume / "tensorboard" / "run"
        full = _full_after_one_step(TensorBoardWriter(folder), volume)
        assert full.volume == str(volume)
        assert full.path.startswith(str(folder))
        assert f"no space left on the volume mounted at {volume}" in str(full)
        assert exit_code_of(full) is ExitCode.STORAGE_FULL


def test_mlflow_file_store_on_a_full_volume_names_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("mlflow")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    with tmpfs(tmp_path / "volume", VOLUME_BYTES) as volume:
        full = _full_after_one_step(MlflowTracker(volume, "rlkube", "run"), volume)
        assert full.volume == str(volume)
        assert full.path.startswith(str(volume / "mlruns"))
        assert exit_code_of(full) is ExitCode.STORAGE_FULL
