"""How many checkpoints to keep (``Retention``) and the pruning after each commit, which deletes
only once the new checkpoint checks complete: the only complete checkpoint is never deleted."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from rlkube_trainer.checkpoint.folder import (
    STAGING_DIR,
    CheckpointError,
    check_complete,
    complete_checkpoints,
    entries,
    remove_tree,
)
from rlkube_trainer.checkpoint.objectstore import CheckpointPath

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Retention:
    """How many complete checkpoints to keep: `max_to_keep`, or per part (verl's
    max_actor_ckpt_to_keep / max_critic_ckpt_to_keep) where set. One checkpoint holds every
    part and is resumed whole, so the number kept is the largest limit of the parts it holds:
    no part loses a checkpoint its own limit keeps."""

    max_to_keep: int
    per_part: Mapping[str, int | None] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name, limit in {"max_to_keep": self.max_to_keep, **self.per_part}.items():
            if limit is not None and limit < 1:
                raise ValueError(f"checkpoints to keep ({name}) must be at least 1, got {limit}")

    def kept(self, parts: Iterable[str]) -> int:
        limits = [self.per_part.get(part) or self.max_to_keep for part in parts if part in self.per_part]
        return max(limits, default=self.max_to_keep)


def prune(root: CheckpointPath, retention: Retention, keep: CheckpointPath, step: int) -> None:
    """Delete complete checkpoints beyond the retention and stale staging/trash dirs.

    The one just written always stays, and nothing is deleted unless it checks complete (a
    part lost since the rename): older checkpoints are then all there is to resume from.
    Dirs of newer steps (left by a run that was resumed from an older checkpoint) are not
    "oldest" and are left alone.
    """
    try:
        manifest = check_complete(keep).manifest()
    except CheckpointError as error:
        log.error("not deleting older checkpoints: the new one is not complete: %s", error)
        return
    parts = {relative.split("/")[0] for relative in manifest.get("files", {})}
    kept = retention.kept(parts)
    complete = [c for c in complete_checkpoints(root) if c.step <= step and c.path != keep]
    complete.sort(key=lambda c: c.step, reverse=True)
    for old in complete[kept - 1 :]:
        log.info("deleting checkpoint %s (keeping %d)", old.path, kept)
        remove_tree(old.path)
    for entry in entries(root):
        match = STAGING_DIR.match(entry.name)
        if (match and int(match.group(1)) < step) or entry.name.startswith(".trash-"):
            log.info("deleting stale %s", entry)
            remove_tree(entry)
