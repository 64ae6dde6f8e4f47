"""Which failure class (api/rlkube_api/exit_codes.py) an error the driver or a rank raised
belongs to. Pure: the exception types are imported here, the CLI exits with the result.

An error raised in a Ray actor arrives as Ray's task error, which is also an instance of the
error's own class (`RayTaskError.as_instanceof_cause`), so one isinstance check covers both.
"""

from __future__ import annotations

from rlkube_api.exit_codes import ExitCode


def exit_code_of(exc: BaseException) -> ExitCode:
    """The exit code for `exc`; `ExitCode.UNEXPECTED` for an error no class claims."""
    import torch  # noqa: PLC0415

    from rlkube_trainer.checkpoint.folder import CheckpointError  # noqa: PLC0415
    from rlkube_trainer.checkpoint.owner import CheckpointDirTaken  # noqa: PLC0415
    from rlkube_trainer.checkpoint.volume import no_space_error  # noqa: PLC0415
    from rlkube_trainer.cluster.config_errors import PreflightError  # noqa: PLC0415
    from rlkube_trainer.cluster.rank_group import RankLost  # noqa: PLC0415
    from rlkube_trainer.data.prompts import DataError  # noqa: PLC0415
    from rlkube_trainer.loop.ppo import TooManyGenerations  # noqa: PLC0415
    from rlkube_trainer.loop.tracking import TrackerMissing  # noqa: PLC0415
    from rlkube_trainer.parallel.layout import LayoutError  # noqa: PLC0415
    from rlkube_trainer.pod.ray_node import NodesMissing  # noqa: PLC0415
    from rlkube_trainer.reward.scoring import RewardConfigError, RewardFunctionError  # noqa: PLC0415
    from rlkube_trainer.workers.memory import DoesNotFit  # noqa: PLC0415

    # Most specific first: a rank that died of an out-of-memory error is OUT_OF_MEMORY.
    classes: tuple[tuple[tuple[type[BaseException], ...], ExitCode], ...] = (
        ((torch.OutOfMemoryError, MemoryError), ExitCode.OUT_OF_MEMORY),
        ((TooManyGenerations,), ExitCode.GENERATION_BUDGET),
        ((TrackerMissing,), ExitCode.TRACKER_MISSING),
        ((CheckpointError, CheckpointDirTaken), ExitCode.CHECKPOINT),
        ((DataError,), ExitCode.DATA),
        ((PreflightError, RewardFunctionError, RewardConfigError, DoesNotFit, LayoutError), ExitCode.CONFIG),
        ((RankLost,), ExitCode.RANK_LOST),
        ((NodesMissing,), ExitCode.NODES_MISSING),
    )
    if no_space_error(exc) is not None:
        # Anywhere in the chain (a rank's save under Ray, torch's writer wrapping the OSError):
        # a full volume, whatever else the error says (a lost rank, an unexpected error).
        return ExitCode.STORAGE_FULL
    if isinstance(exc, RankLost):
        # A rank that died of a classified error (out of memory, a checkpoint it cannot read)
        # is that error's class, not a lost rank that a restart may bring back.
        inner = _cause(exc)
        if inner is not None and (code := exit_code_of(inner)) is not ExitCode.UNEXPECTED:
            return code
    for types, code in classes:
        if isinstance(exc, types):
            if code is ExitCode.CONFIG and isinstance(exc, PreflightError) and exc.key.startswith("data."):
                # A data file that does not exist or lacks a column: the data's class.
                return ExitCode.DATA
            return code
    inner = _cause(exc)
    return exit_code_of(inner) if inner is not None else ExitCode.UNEXPECTED


def _cause(exc: BaseException) -> BaseException | None:
    """The error `exc` wraps: its `raise ... from`, or a Ray task error's `cause`."""
    inner = exc.__cause__ or getattr(exc, "cause", None)
    return inner if isinstance(inner, BaseException) and inner is not exc else None


def failure_message(exc: BaseException, code: ExitCode) -> str:
    """What the exit record says of a classified error: its own text, or for a full volume met
    by a write nothing named (a bare OSError) the volume and the file it names."""
    from rlkube_trainer.checkpoint.volume import StorageFull, no_space_error, storage_full  # noqa: PLC0415

    found = no_space_error(exc) if code is ExitCode.STORAGE_FULL else None
    if isinstance(found, OSError) and not isinstance(exc, StorageFull) and found.filename:
        return f"{storage_full(found, str(found.filename))} ({exc})"
    return str(exc)
