"""Each failure class the trainer meets exits with its own code (failures.py), and the
operator's default rules fail the job at once on exactly the permanent ones."""

from __future__ import annotations

import errno

import pytest
import torch

from rlkube_api.exit_codes import EXIT_CLASSES, PERMANENT_CODES, ExitCode, exit_class
from rlkube_operator.failure_policy import DEFAULT_RULES, FailureAction
from rlkube_trainer.checkpoint.folder import CheckpointError
from rlkube_trainer.checkpoint.owner import CheckpointDirTaken
from rlkube_trainer.checkpoint.volume import StorageFull
from rlkube_trainer.cluster.rank_group import RankLost
from rlkube_trainer.data.prompts import DataError, PromptTooLongError
from rlkube_trainer.loop.ppo import TooManyGenerations
from rlkube_trainer.loop.tracking import TrackerMissing
from rlkube_trainer.pod.failures import exit_code_of
from rlkube_trainer.pod.preflight import PreflightError
from rlkube_trainer.pod.ray_node import NodesMissing
from rlkube_trainer.reward.scoring import RewardFunctionError
from rlkube_trainer.workers.memory import DoesNotFit


def _lost_of(cause: BaseException) -> RankLost:
    try:
        raise RankLost("actor", 1, str(cause)) from cause
    except RankLost as lost:
        return lost


@pytest.mark.parametrize(
    ("error", "code"),
    [
        pytest.param(PreflightError("model.path", "/x", "does not exist"), ExitCode.CONFIG, id="config"),
        pytest.param(RewardFunctionError("no such function"), ExitCode.CONFIG, id="reward"),
        pytest.param(DoesNotFit("too big"), ExitCode.CONFIG, id="does-not-fit"),
        pytest.param(PreflightError("data.train_files[0]", "/x", "does not exist"), ExitCode.DATA, id="data-file"),
        pytest.param(DataError("no column prompt"), ExitCode.DATA, id="data"),
        pytest.param(PromptTooLongError("too long"), ExitCode.DATA, id="prompt-too-long"),
        pytest.param(TrackerMissing("wandb is not installed"), ExitCode.TRACKER_MISSING, id="tracker"),
        pytest.param(CheckpointError("incomplete"), ExitCode.CHECKPOINT, id="checkpoint"),
        pytest.param(CheckpointDirTaken("another job's"), ExitCode.CHECKPOINT, id="checkpoint-taken"),
        pytest.param(torch.OutOfMemoryError("CUDA out of memory"), ExitCode.OUT_OF_MEMORY, id="oom"),
        pytest.param(TooManyGenerations("3 rounds"), ExitCode.GENERATION_BUDGET, id="generation-budget"),
        pytest.param(RankLost("actor", 1, "died"), ExitCode.RANK_LOST, id="rank-lost"),
        pytest.param(NodesMissing("role pods did not join"), ExitCode.NODES_MISSING, id="nodes-missing"),
        pytest.param(RuntimeError("something else"), ExitCode.UNEXPECTED, id="unexpected"),
        # A rank that died of a classified error is that error, not a lost rank.
        pytest.param(_lost_of(torch.OutOfMemoryError("CUDA")), ExitCode.OUT_OF_MEMORY, id="rank-oom"),
        pytest.param(_lost_of(CheckpointError("bad")), ExitCode.CHECKPOINT, id="rank-checkpoint"),
        pytest.param(_lost_of(ValueError("?")), ExitCode.RANK_LOST, id="rank-unclassified"),
        pytest.param(StorageFull("no space left on the volume mounted at /ckpt"), ExitCode.STORAGE_FULL, id="full"),
        pytest.param(_lost_of(StorageFull("no space")), ExitCode.STORAGE_FULL, id="rank-storage-full"),
        pytest.param(_lost_of(OSError(errno.ENOSPC, "No space")), ExitCode.STORAGE_FULL, id="rank-enospc"),
    ],
)
def test_each_error_exits_with_its_class(error: BaseException, code: ExitCode) -> None:
    assert exit_code_of(error) is code


def test_every_code_but_ok_has_one_class_and_the_operator_fails_at_once_on_the_permanent_ones() -> None:
    assert {c.code for c in EXIT_CLASSES} == set(ExitCode) - {ExitCode.OK}
    assert len({int(c.code) for c in EXIT_CLASSES}) == len(EXIT_CLASSES)
    failing = {
        value
        for rule, verdict in DEFAULT_RULES
        if verdict.action is FailureAction.FAIL_JOB and rule.on_exit_codes is not None
        for value in rule.on_exit_codes.values
    }
    assert failing == set(PERMANENT_CODES)
    assert {ExitCode.RANK_LOST, ExitCode.NODES_MISSING, ExitCode.UNEXPECTED}.isdisjoint(failing)
    assert exit_class(137) is None
    klass = exit_class(int(ExitCode.TRACKER_MISSING))
    assert klass is not None and klass.permanent and klass.reason == "TrackerMissing"
