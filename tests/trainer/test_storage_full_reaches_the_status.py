"""A full volume from the trainer's error to the job's status, with no cluster: a write that
failed for lack of space (a RuntimeError over an ENOSPC OSError, as torch.save raises it) is
classified and worded by the CLI's own exit path (`cli._classified`), left as the container's
termination message and as the exit Event (`exit_record.exit_event`); the operator's status
function, from either (the pod seen failing, or replaced unseen and known by its Event), fails
the job StorageFull, its condition and Event naming the volume's mount point and the file."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from rlkube_api.exit_codes import ExitCode
from rlkube_api.names import Env
from rlkube_trainer.checkpoint.volume import mount_point
from rlkube_trainer.pod import cli, preflight
from rlkube_trainer.pod.exit_record import exit_event
from tests.operator.helpers import CPU, NAMESPACE, at, gang_pods, load_job, replace_pod, set_path
from tests.operator.test_departed import VICTIM, judged, old_uid
from tests.operator.test_failure_policy import crashed
from tests.operator.test_status import cond, events, run, running


def _exit_of_a_full_volume(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[int, str, str, Path]:
    """The exit code and termination message the CLI leaves for a save that found no room."""
    written: list[str] = []
    monkeypatch.setattr(preflight, "write_termination_message", written.append)
    monkeypatch.delenv(Env.POD_NAME, raising=False)  # no exit Event posted from here
    part = tmp_path / "step_000004" / "rank_0.pt"
    try:
        try:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(part))
        except OSError as full:
            raise RuntimeError("[enforce fail at inline_container.cc:603] unexpected pos 4096") from full
    except RuntimeError as error:
        code = cli._classified(error)
    return code, written[0], str(mount_point(part)), part


def test_the_termination_message_of_a_full_volume_fails_the_job_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    code, said, volume, part = _exit_of_a_full_volume(tmp_path, monkeypatch)
    assert code == ExitCode.STORAGE_FULL
    job = running(load_job(CPU, set_path("spec.runPolicy.backoffLimit", 3)))
    d = run(job, replace_pod(gang_pods(job), crashed("actor", code, message=said)), 100)
    failed = cond(d.status, "Failed")
    assert (d.status.state, failed.reason) == ("Failed", "StorageFull")
    assert f"mounted at {volume}" in failed.message and str(part) in failed.message
    assert ("Warning", "StorageFull") in events(d)
    event = next(e.message for e in d.events if e.reason == "StorageFull")
    assert f"mounted at {volume}" in event and str(part) in event


def test_the_exit_event_of_a_pod_replaced_unseen_fails_the_job_naming_the_volume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    code, said, volume, part = _exit_of_a_full_volume(tmp_path, monkeypatch)
    d = judged(exit_event(code, said, VICTIM, old_uid(), NAMESPACE, at(40)))
    failed = cond(d.status, "Failed")
    assert (d.status.state, failed.reason) == ("Failed", "StorageFull")
    assert f"mounted at {volume}" in failed.message and str(part) in failed.message
