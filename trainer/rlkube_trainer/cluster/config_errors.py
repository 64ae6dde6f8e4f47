"""The errors that mean the configuration or data cannot work: no restart of a pod or a rank
helps, so the run exits with `ExitCode.CONFIG` (or `ExitCode.DATA`, pod/failures.py) and the
operator treats the failure as permanent. They are raised wherever the problem is found: in the
pod's preflight (pod/preflight.py), the driver, or a rank, whose Ray error carries them to the
driver (ray_group.py).
"""

from __future__ import annotations

import re


def config_errors() -> tuple[type[Exception], ...]:
    """The exceptions that mean the configuration or data cannot work (ExitCode.CONFIG),
    wherever they are raised: in the driver, or in a rank (whose Ray error carries them)."""
    from rlkube_trainer.checkpoint.owner import CheckpointDirTaken  # noqa: PLC0415
    from rlkube_trainer.data.prompts import DataError  # noqa: PLC0415
    from rlkube_trainer.parallel.layout import LayoutError  # noqa: PLC0415
    from rlkube_trainer.reward.scoring import RewardConfigError, RewardFunctionError  # noqa: PLC0415
    from rlkube_trainer.workers.memory import DoesNotFit  # noqa: PLC0415

    return (
        PreflightError,
        DataError,
        RewardFunctionError,
        RewardConfigError,
        DoesNotFit,
        CheckpointDirTaken,
        LayoutError,
    )


class PreflightError(Exception):
    """A configuration or data error found before training: names the key and the path."""

    def __init__(self, key: str, path: str | None, problem: str) -> None:
        self.key, self.path, self.problem = key, path, problem
        where = f"{key} (RLJob {rljob_field(key)})"
        super().__init__(f"{where} {path!r}: {problem}" if path is not None else f"{where}: {problem}")


def rljob_field(key: str) -> str:
    """The RLJob field of a trainer key: `data.train_files[0]` is `spec.data.trainFiles[0]`."""
    return "spec." + re.sub(r"_([a-z0-9])", lambda m: m.group(1).upper(), key)
