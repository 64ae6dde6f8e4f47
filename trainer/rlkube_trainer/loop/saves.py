"""A run's checkpoints from the driver's side: what the ranks of each group write
(`GroupState`), and when a checkpoint is begun, written and committed (`Saves`). The folder
protocol itself (staging dirs, the latest marker, retention) is checkpoint/manager.py's.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlkube_api.config import TrainerConfig
from rlkube_api.names import METRICS_FILE
from rlkube_api.placement import Placement, Role
from rlkube_trainer.checkpoint.integrity import Written, written
from rlkube_trainer.checkpoint.manager import CheckpointManager
from rlkube_trainer.checkpoint.objectstore import CheckpointPath, ObjectPath, locate
from rlkube_trainer.checkpoint.retention import Retention
from rlkube_trainer.checkpoint.state import WrittenInBackground, save_torch
from rlkube_trainer.checkpoint.volume import StorageFull, no_space_error, writing_to
from rlkube_trainer.loop.assembly import Groups

log = logging.getLogger("rlkube.trainer")


class GroupState:
    """Checkpoints: the ranks of every group hosting a trainable role write their own parts
    into the shared checkpoint folder; the actor's ranks export the final model."""

    def __init__(self, placement: Placement, groups: Groups) -> None:
        trainable = {Role.ACTOR, Role.CRITIC}
        self.trainable = [groups[g.name] for g in placement.groups if g.hosts & trainable]
        self.actor = groups[Role.ACTOR]
        # (group index, rank): what each rank's background write reported, as they finish.
        self.background: dict[tuple[int, int], WrittenInBackground] = {}

    def save(self, staging: CheckpointPath) -> dict[str, Written]:
        """Every rank's parts; what each rank says it wrote (the driver checks it is there)."""
        return {
            relative: record
            for group in self.trainable
            for files in group.call_all("save", str(staging))
            for relative, record in files.items()
        }

    def save_in_background(self, staging: CheckpointPath) -> None:
        """checkpoint.async_save: every rank's state copied into host memory (returns once all
        are), then written by each rank's own thread; `written_in_background` collects them."""
        self.background = {}
        for group in self.trainable:
            group.call_all("save_in_background", str(staging))

    def written_in_background(self, wait: bool) -> tuple[dict[str, Written], float] | None:
        """Every rank's files and the longest write, once all are written (None while any is
        writing); a rank whose write failed raises its error here. Ranks done at an earlier
        call are not asked again: each reports its write once."""
        for index, group in enumerate(self.trainable):
            ranks = [rank for rank in range(len(group)) if (index, rank) not in self.background]
            answers = group.wait(group.submit("finish_save", [(wait,)] * len(ranks), ranks))
            for rank, done in zip(ranks, answers, strict=True):
                if done is not None:
                    self.background[(index, rank)] = done
        if len(self.background) < sum(len(group) for group in self.trainable):
            return None
        files = {name: record for done in self.background.values() for name, record in done.files.items()}
        return files, max((done.seconds for done in self.background.values()), default=0.0)

    def load(self, checkpoint: CheckpointPath) -> None:
        for group in self.trainable:
            group.call_all("load", str(checkpoint))

    def export_hf(self, path: CheckpointPath) -> None:
        self.actor.call_all("export_hf", str(path))


def layout_of(files: Iterable[str]) -> dict[str, dict[str, Any]]:
    """Per trainable part: how many ranks wrote it and whether as shards (torch distributed
    checkpoint), for whoever resumes it on another number of ranks."""
    layout: dict[str, dict[str, Any]] = {}
    for relative in files:
        part, _, rest = relative.partition("/")
        if rest.startswith("rank_") or rest.startswith("sharded/"):
            entry = layout.setdefault(part, {"world_size": 0, "sharded": False})
            entry["world_size"] += rest.startswith("rank_")
            entry["sharded"] |= rest.startswith("sharded/")
    return layout


def checkpoint_root(config: TrainerConfig) -> CheckpointPath:
    """Where checkpoints, the HF export and (a copy of) metrics.jsonl go: checkpoint.uri (an
    object store) where set, else checkpoint.dir."""
    checkpoint = config.checkpoint
    return locate(checkpoint.uri or checkpoint.dir, checkpoint.endpoint_url)


def retention_of(config: TrainerConfig) -> Retention:
    checkpoint = config.checkpoint
    per_part = {Role.ACTOR: checkpoint.max_actor_ckpt_to_keep, Role.CRITIC: checkpoint.max_critic_ckpt_to_keep}
    return Retention(checkpoint.max_to_keep, {str(part): limit for part, limit in per_part.items()})


@dataclass
class SaveInFlight:
    """A checkpoint written but not yet committed: its files (the ranks' once `written`), and
    whether the ranks write them in the background (checkpoint.async_save)."""

    step: int
    staging: CheckpointPath
    files: dict[str, Written]
    written: bool


class Saves:
    """The run's checkpoints, one at a time: written into a staging dir (by the ranks, in the
    background with checkpoint.async_save), then committed as the latest once written and once
    its step's row is logged, so a checkpoint's step always has its row. A save still in flight
    is finished and committed before the next begins: a rank holds at most one extra copy of its
    state in host memory, and checkpoints commit in step order (the latest marker never goes
    back, retention counts complete ones)."""

    def __init__(self, config: TrainerConfig, state: GroupState) -> None:
        self.config = config.checkpoint
        self.state = state
        self.root = checkpoint_root(config)
        self.checkpoints = CheckpointManager(self.root, retention_of(config))
        # The checkpoint being written: committed once written and its step's row is logged.
        self.in_flight: SaveInFlight | None = None
        self.last_step: int | None = None

    def begin(self, step: int, driver: dict[str, Any]) -> dict[str, float]:
        """Writes step's checkpoint (the ranks' parts and the driver's `driver.pt`) into its
        staging dir, or with checkpoint.async_save starts the ranks writing theirs in the
        background; returns its timings."""
        start = time.perf_counter()
        metrics: dict[str, float] = {}
        if self.in_flight is not None:
            previous = self.written(wait=True)
            if previous is not None:
                metrics["timing_s/save_checkpoint_background"] = previous
            self.commit()
        with writing_to(self.root):
            staging = self.checkpoints.staging(step)
        background = self.config.async_save
        files: dict[str, Written] = {}
        try:
            if background:
                self.state.save_in_background(staging)
            else:
                files = self.state.save(staging)
            save_torch(staging / "driver.pt", driver)
            files |= written(staging, ["driver.pt"], "the driver")
            if self.config.export_hf == "every_save":
                self.state.export_hf(staging / "hf")
        except BaseException as error:
            if no_space_error(error) is not None:
                self._abandon(staging)
            raise
        self.in_flight = SaveInFlight(step, staging, files, written=not background)
        # The part of the save the step waited for (all of it, unless async_save).
        return metrics | {"timing_s/save_checkpoint": time.perf_counter() - start}

    def written(self, wait: bool) -> float | None:
        """Whether the ranks' background write of the save in flight is done (waiting for it
        with `wait`): the seconds it took, once, when it is; None otherwise. A failed write
        raises here as the run's error, and the save is abandoned (never committed)."""
        flight = self.in_flight
        if flight is None or flight.written:
            return None
        try:
            done = self.state.written_in_background(wait)
        except BaseException as error:
            self.in_flight = None
            if no_space_error(error) is not None:
                self._abandon(flight.staging)
            raise
        if done is None:
            return None
        files, seconds = done
        flight.files |= files
        flight.written = True
        return seconds

    def commit(self) -> CheckpointPath:
        """The written checkpoint in flight becomes the latest (CheckpointManager.commit)."""
        flight = self.in_flight
        assert flight is not None and flight.written
        self.in_flight = None
        files = flight.files
        try:
            with writing_to(flight.staging):
                path = self.checkpoints.commit(
                    flight.step, {"parts": sorted({f.split("/")[0] for f in files}), "layout": layout_of(files)}, files
                )
        except StorageFull:
            self._abandon(flight.staging)
            raise
        self.last_step = flight.step
        log.info("checkpoint %s", path)
        local_metrics = Path(self.config.dir) / METRICS_FILE
        if isinstance(self.root, ObjectPath) and local_metrics.is_file():
            # Its rows through this checkpoint's step (logged before the commit), one PUT.
            (self.root / METRICS_FILE).upload(local_metrics)
        return path

    def _abandon(self, staging: CheckpointPath) -> None:
        """A save the volume had no room for: its staging dir goes, giving back the space its
        parts took (the resumed run needs it for its metrics and its next save). The latest
        complete checkpoint is untouched: the run resumes from it."""
        if isinstance(staging, Path) and staging.name.startswith(".tmp-"):
            shutil.rmtree(staging, ignore_errors=True)
            log.warning("checkpoint staging dir %s removed: its volume is full", staging)

    def commit_when_written(self) -> CheckpointPath | None:
        """The save in flight, waited for and committed (None when there is none)."""
        if self.in_flight is None:
            return None
        self.written(wait=True)
        return self.commit()

    def settle(self, step: int) -> None:
        """On an error at `step`: the save in flight is committed if its ranks finish writing it
        and its row is logged (an earlier step's: the state was copied before the failing step
        began), else abandoned; either way never half committed, and the run's own error is
        raised."""
        flight = self.in_flight
        if flight is None:
            return
        if flight.step >= step:
            self.in_flight = None
            log.warning(
                "checkpoint of step %d abandoned in %s: the run failed before its row was logged",
                flight.step,
                flight.staging,
            )
            return
        try:
            self.commit_when_written()
        except Exception as error:
            self.in_flight = None
            log.error("checkpoint of step %d abandoned in %s: %s", flight.step, flight.staging, error)


def fetch_metrics(remote: ObjectPath, local: Path) -> None:
    """The object store's metrics.jsonl into the local dir where this run finds none (a new pod
    without a volume): the rows before the checkpoint resumed from are kept, as on a volume."""
    if local.exists() or not remote.is_file():
        return
    local.parent.mkdir(parents=True, exist_ok=True)
    remote.download(local)
