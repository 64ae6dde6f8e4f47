"""Which RLJob a checkpoint folder belongs to, so that `resume: auto` never continues another
job's run.

A job's driver writes `rljob.json` (namespace, name, UID) into its checkpoint root
(`checkpoint.dir`, or `checkpoint.uri` where set) before the first step. A gang restart of the same job finds its own UID there and resumes. A different job (a
second job on the same volume path, or the same name deleted and created again: a new UID)
finds someone else's run and is refused, naming that job, unless `checkpoint.adopt` says to
take the folder over. A folder holding a run but no `rljob.json` (written by
`rlkube-trainer run`, or by a version before this file existed) counts as someone else's.

Outside a cluster (`rlkube-trainer run`) there is no job identity and nothing is checked: the
same config run twice resumes, as verl's `resume_mode: auto` does.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass

from rlkube_api.names import Env
from rlkube_trainer.checkpoint.durable import write_atomic
from rlkube_trainer.checkpoint.folder import LATEST
from rlkube_trainer.checkpoint.objectstore import CheckpointPath

OWNER_FILE = "rljob.json"
# What a run leaves in the folder (besides checkpoints): any of these means it is not fresh.
RUN_FILES = (LATEST, "metrics.jsonl")


class CheckpointDirTaken(RuntimeError):
    """checkpoint.dir holds another job's run."""


@dataclass(frozen=True)
class JobIdentity:
    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        return f"RLJob {self.namespace}/{self.name} (uid {self.uid})"


def identity_from_env(env: Mapping[str, str] = os.environ) -> JobIdentity | None:
    """The job this driver runs for, as the operator's environment says; None outside a cluster."""
    uid = env.get(Env.JOB_UID)
    if not uid:
        return None
    return JobIdentity(env.get(Env.NAMESPACE, ""), env.get(Env.JOB_NAME, ""), uid)


def owner_of(root: CheckpointPath) -> JobIdentity | None:
    path = root / OWNER_FILE
    if not path.exists():
        return None
    raw = json.loads(path.read_text())
    return JobIdentity(str(raw.get("namespace", "")), str(raw.get("name", "")), str(raw.get("uid", "")))


def holds_a_run(root: CheckpointPath) -> bool:
    if not root.is_dir():  # an object-store prefix is a "dir" once any object is under it
        return False
    return any((root / name).exists() for name in RUN_FILES) or any(root.glob("step_*"))


def claim(root: CheckpointPath, job: JobIdentity, adopt: bool) -> None:
    """Makes `root` this job's checkpoint folder, or raises CheckpointDirTaken."""
    owner = owner_of(root)
    if owner is not None and owner.uid == job.uid:
        return
    if not adopt and (owner is not None or holds_a_run(root)):
        by = str(owner) if owner is not None else f"a run with no {OWNER_FILE} (rlkube-trainer run, or an older rlkube)"
        raise CheckpointDirTaken(
            f"the checkpoint root {root} (checkpoint.dir, or checkpoint.uri) holds the run of {by}, not of this {job}: "
            "choose another checkpoint.dir for a new run, or set checkpoint.adopt: true to continue "
            "that run in this job (resume: auto then picks up its checkpoints and metrics)"
        )
    root.mkdir(parents=True, exist_ok=True)
    write_atomic(root / OWNER_FILE, (json.dumps(asdict(job)) + "\n").encode())
