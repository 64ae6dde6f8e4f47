"""The trainer's exit codes, one per failure class, and what the operator does with each by
default. Defined once here: the trainer exits with them (cli.py classifies its errors), the
operator's default failure rules are built from `EXIT_CLASSES`, and the table in
docs/reliability.md is generated from it (`make crd`; a test checks it).

A permanent class is one that running the job again cannot fix (the same configuration, data
and hardware give the same error): the operator fails the job at once with the trainer's
message instead of restarting the gang. The codes avoid those Python (1 for an uncaught
error), argparse (2) and signals (128+n) use; the permanent ones follow sysexits.h where it
has a match (65 EX_DATAERR, 69 EX_UNAVAILABLE, 73 EX_CANTCREAT, 74 EX_IOERR, 78 EX_CONFIG).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    # An error nothing classified (Python's own code for an uncaught exception).
    UNEXPECTED = 1
    # A rank's process died: the gang restarts from its last checkpoint.
    RANK_LOST = 3
    # Role pods did not join the driver's Ray head in time.
    NODES_MISSING = 4
    # A data file or row that cannot be used.
    DATA = 65
    # trainer.logger names a tracker whose package is not installed.
    TRACKER_MISSING = 69
    # A write (metrics, checkpoint, export) failed for lack of space or quota on its volume.
    STORAGE_FULL = 73
    # A checkpoint that cannot be used or a checkpoint folder another job owns.
    CHECKPOINT = 74
    # The configuration cannot work.
    CONFIG = 78
    # A GPU (or the host) ran out of memory in the trainer.
    OUT_OF_MEMORY = 80
    # Dynamic sampling (algorithm.filterGroups) ran out of generation rounds.
    GENERATION_BUDGET = 81


@dataclass(frozen=True)
class ExitClass:
    code: ExitCode
    # The reason of the job's Failed condition (permanent); a restart's is always PodFailed.
    reason: str
    permanent: bool
    # What it means and what to do, for the table and the condition's message.
    meaning: str


EXIT_CLASSES: tuple[ExitClass, ...] = (
    ExitClass(
        ExitCode.UNEXPECTED,
        "PodFailed",
        False,
        "an error nothing classified (the traceback's end is in the message)",
    ),
    ExitClass(ExitCode.RANK_LOST, "PodFailed", False, "a rank's process died (the message names role and rank)"),
    ExitClass(ExitCode.NODES_MISSING, "PodFailed", False, "role pods did not join the driver's Ray head in time"),
    ExitClass(
        ExitCode.DATA,
        "TrainerDataError",
        True,
        "a data file or row that cannot be used (missing file or column, a prompt too long for the model)",
    ),
    ExitClass(
        ExitCode.TRACKER_MISSING,
        "TrackerMissing",
        True,
        "`trainer.logger` names a tracker whose package is not in the image",
    ),
    ExitClass(
        ExitCode.STORAGE_FULL,
        "StorageFull",
        True,
        "a write (metrics, checkpoint, export) found its volume full or its quota spent (the message names the "
        "mount point and the file): free space or grow the volume, then change the spec (e.g. suspend and "
        "resume): the job resumes from its last complete checkpoint",
    ),
    ExitClass(
        ExitCode.CHECKPOINT,
        "TrainerCheckpointError",
        True,
        "a checkpoint that cannot be used (incomplete, unreadable) or a checkpoint folder another job owns",
    ),
    ExitClass(
        ExitCode.CONFIG,
        "TrainerConfigError",
        True,
        "a configuration error (a model path with no model, a reward function that does not import, "
        "a model that does not fit)",
    ),
    ExitClass(
        ExitCode.OUT_OF_MEMORY,
        "TrainerOutOfMemory",
        True,
        "the trainer ran out of GPU memory: lower the micro batch sizes or `rollout.gpuMemoryUtilization`, or add GPUs",
    ),
    ExitClass(
        ExitCode.GENERATION_BUDGET,
        "GenerationBudgetExhausted",
        True,
        "`algorithm.filterGroups.maxNumGenBatches` rounds left too few informative groups",
    ),
)

_BY_CODE = {c.code: c for c in EXIT_CLASSES}
PERMANENT_CODES: tuple[int, ...] = tuple(int(c.code) for c in EXIT_CLASSES if c.permanent)


def exit_class(code: int) -> ExitClass | None:
    """The class of a trainer exit code; None for a code the trainer does not use (a kill)."""
    try:
        return _BY_CODE.get(ExitCode(code))
    except ValueError:
        return None


def render_table() -> str:
    """The Markdown table of docs/reliability.md (generated: `make crd`)."""
    rows = [
        "| code | name | meaning | the operator, by default |",
        "|---|---|---|---|",
        f"| {int(ExitCode.OK)} | `OK` | the driver finished | `Succeeded` |",
    ]
    for c in EXIT_CLASSES:
        then = (
            f"**`Failed` at once**, reason `{c.reason}`, no restart"
            if c.permanent
            else f"gang restart, counted against `backoffLimit`, reason `{c.reason}`"
        )
        rows.append(f"| {int(c.code)} | `{c.code.name}` | {c.meaning} | {then} |")
    rows.append("| anything else (137: killed) | | | gang restart, counted; `OOMKilled` named as the reason |")
    return "\n".join(rows) + "\n"


# Where a container writes its termination message (Kubernetes' default
# terminationMessagePath): the kubelet puts it into the container's terminated state, which
# the operator copies into the Failed condition and the Event.
TERMINATION_MESSAGE_PATH = "/dev/termination-log"
# The kubelet keeps at most this many bytes of it.
TERMINATION_MESSAGE_LIMIT = 4096
