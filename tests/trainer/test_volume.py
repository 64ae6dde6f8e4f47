"""checkpoint/volume.py: an out-of-space error found wherever it hides in an error's chain and
named with its volume; rows appended whole or not at all on a real full file system; and a
torn last row (left by a writer before appends were whole) dropped on resume, not fatal."""

from __future__ import annotations

import errno
import json
import logging
import pickle
from pathlib import Path

import pytest

from rlkube_api.exit_codes import ExitCode
from rlkube_trainer.checkpoint.volume import StorageFull, append_row, mount_point, no_space_error, writing_to
from rlkube_trainer.loop.tracking import Tracker, keep_rows_through, read_rows
from rlkube_trainer.pod.failures import exit_code_of, failure_message
from tests.trainer.small_volume import fill, tmpfs

NO_SPACE = OSError(errno.ENOSPC, "No space left on device")


def _torch_writer_error() -> RuntimeError:
    """What torch.save raises on a full disk: a RuntimeError whose context is the OSError."""
    error = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")
    error.__context__ = NO_SPACE
    return error


@pytest.mark.parametrize(
    ("error", "found"),
    [
        pytest.param(NO_SPACE, True, id="enospc"),
        pytest.param(OSError(errno.EDQUOT, "Disk quota exceeded"), True, id="edquot"),
        pytest.param(_torch_writer_error(), True, id="torch-writer"),
        pytest.param(StorageFull("full", "/v", "/v/f"), True, id="named"),
        pytest.param(OSError(errno.EACCES, "Permission denied"), False, id="eacces"),
        pytest.param(RuntimeError("nan loss"), False, id="other"),
    ],
)
def test_an_out_of_space_error_is_found_in_the_chain(error: BaseException, found: bool) -> None:
    assert (no_space_error(error) is not None) is found
    assert (exit_code_of(error) is ExitCode.STORAGE_FULL) is found


def test_a_write_block_names_the_volume_and_the_file(tmp_path: Path) -> None:
    target = tmp_path / "step_000004" / "driver.pt"
    with pytest.raises(StorageFull) as caught, writing_to(target):
        raise _torch_writer_error()
    full = caught.value
    assert full.volume == str(mount_point(tmp_path)) and full.path == str(target)
    assert f"no space left on the volume mounted at {full.volume} (" in str(full)
    assert f"writing {target}: No space left on device" in str(full)
    # Pickled whole: a rank's error crosses to the driver through Ray.
    again = pickle.loads(pickle.dumps(full))
    assert (str(again), again.volume, again.path) == (str(full), full.volume, full.path)
    with pytest.raises(ValueError, match="other"), writing_to(target):
        raise ValueError("other")


def test_a_bare_oserror_with_a_file_is_named_in_the_exit_record(tmp_path: Path) -> None:
    error = OSError(errno.EDQUOT, "Disk quota exceeded", str(tmp_path / "trackers.json"))
    said = failure_message(error, ExitCode.STORAGE_FULL)
    assert said.startswith(f"disk quota exceeded on the volume mounted at {mount_point(tmp_path)}")
    assert f"writing {tmp_path / 'trackers.json'}" in said


def test_a_row_is_appended_whole_or_not_at_all_on_a_full_volume(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "volume", 1 << 20) as volume:
        rows = volume / "metrics.jsonl"
        append_row(rows, json.dumps({"step": 1, "x": 1.0}))
        fill(volume)
        before = rows.read_bytes()
        # Longer than what is left of the file's last page: the file system takes part of it.
        with pytest.raises(StorageFull) as caught:
            append_row(rows, json.dumps({"step": 2, "x": "y" * 8192}))
        assert rows.read_bytes() == before
        assert (caught.value.volume, caught.value.path) == (str(volume), str(rows))
        (volume / "ballast").unlink()
        append_row(rows, json.dumps({"step": 2, "x": 2.0}))
        assert [row["step"] for row in read_rows(rows)] == [1, 2]


def test_a_torn_last_row_is_dropped_on_resume_and_said(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    rows = tmp_path / "metrics.jsonl"
    rows.write_text('{"step": 1, "x": 1.0}\n{"step": 2, "x": 2.0}\n{"step": 3, "x": 3.')
    with caplog.at_level(logging.WARNING):
        keep_rows_through(rows, 2)
    assert rows.read_text() == '{"step": 1, "x": 1.0}\n{"step": 2, "x": 2.0}\n'
    assert "torn row" in caplog.text and str(rows) in caplog.text
    # The resumed run's rows follow on lines of their own.
    tracker = Tracker(tmp_path, [], "run", resumed_at=2)
    tracker.log(3, {"x": 3.5})
    assert [(row["step"], row["x"]) for row in tracker.history()] == [(1, 1.0), (2, 2.0), (3, 3.5)]


def test_a_bad_row_before_the_last_is_still_an_error(tmp_path: Path) -> None:
    rows = tmp_path / "metrics.jsonl"
    rows.write_text('{"step": 1, "x\n{"step": 2}\n')
    with pytest.raises(json.JSONDecodeError):
        keep_rows_through(rows, 2)
