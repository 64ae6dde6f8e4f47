"""Where step metrics go: a console line, metrics.jsonl, optional TensorBoard event
files, MLflow and Weights & Biases runs, and at the end a PNG of the reward, KL and
response-length curves.

The experiment trackers are optional extras (`pip install rlkube[trackers]`), imported
only when `trainer.logger` names them, with verl's mapping: the project is MLflow's
experiment and W&B's project, the experiment name is the run's name.

- mlflow: to $MLFLOW_TRACKING_URI (a server, a database), else a file store `mlruns/`
  in the output (checkpoint) directory, so a run on a volume keeps its metrics.
- wandb: offline into the output directory unless an API key is there
  ($WANDB_API_KEY, e.g. from a Secret through a pod template's env); $WANDB_MODE wins.

Both continue the same run after a gang restart: the run's id is kept in the output
directory (`trackers.json`) next to the checkpoints the driver resumes from.

Every tracker's writes to the output directory go through `writing_to`: a full volume (or a
spent quota) under TensorBoard's event file, MLflow's file store or W&B's offline run is the
run's STORAGE_FULL exit naming the volume and the tracker's folder, as it is for metrics.jsonl.
TensorBoard writes from a thread of its own, so each step's events are flushed inside the block
(its writer raises the thread's error there).
"""

from __future__ import annotations

import importlib
import json
import logging
import numbers
import os
import re
import secrets
import time
import urllib.parse
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal, Protocol, cast, get_args

from rlkube_api.step_rows import plot_curves, step_line
from rlkube_trainer.checkpoint.volume import append_row, writing_to

log = logging.getLogger("rlkube.trainer")

MLFLOW_URI_ENV = "MLFLOW_TRACKING_URI"
WANDB_KEY_ENV = "WANDB_API_KEY"
WANDB_MODE_ENV = "WANDB_MODE"
# Run ids of the trackers, so that a restarted driver continues the same runs.
RUN_IDS_FILE = "trackers.json"
WandbMode = Literal["online", "offline", "disabled", "shared"]


class TrackerMissing(RuntimeError):
    """trainer.logger names a tracker whose package is not installed."""


def _import(module: str, logger: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError:
        raise TrackerMissing(
            f"trainer.logger names {logger}, but {module.split('.', maxsplit=1)[0]} is not installed "
            "(pip install 'rlkube[trackers]')"
        ) from None


class ExperimentTracker(Protocol):
    def log(self, step: int, metrics: Mapping[str, float]) -> None: ...

    def close(self) -> None: ...


def _run_ids(output_dir: Path) -> dict[str, str]:
    path = output_dir / RUN_IDS_FILE
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}


def _remember_run_id(output_dir: Path, tracker: str, run_id: str) -> None:
    ids = {**_run_ids(output_dir), tracker: run_id}
    with writing_to(output_dir / RUN_IDS_FILE):
        (output_dir / RUN_IDS_FILE).write_text(json.dumps(ids, indent=1) + "\n")


# MLflow allows letters, digits and `_-. /` in metric names; verl's names fit, others are mended.
_MLFLOW_INVALID = re.compile(r"[^\w\-. /]")


def mlflow_tracking_uri(output_dir: Path, env: Mapping[str, str] | None = None) -> str:
    env = os.environ if env is None else env
    return env.get(MLFLOW_URI_ENV) or (output_dir / "mlruns").absolute().as_uri()


class MlflowTracker:
    """One MLflow run per job, through MlflowClient (no process-global active run)."""

    def __init__(self, output_dir: Path, project: str, experiment: str, env: Mapping[str, str] | None = None) -> None:
        self.uri = mlflow_tracking_uri(output_dir, env)
        # Where its writes land on a volume: the file store's folder (a server's are not ours).
        self.folder = output_dir
        if self.uri.startswith("file:"):
            self.folder = Path(urllib.parse.unquote(urllib.parse.urlparse(self.uri).path))
            # MLflow 3 keeps the file store in maintenance mode and refuses it unless asked;
            # a file store is what needs no server and no database on a laptop or a volume.
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        with writing_to(self.folder):
            self._start(output_dir, project, experiment)
        log.info("mlflow: run %s in experiment %r at %s", self.run_id, project, self.uri)

    def _start(self, output_dir: Path, project: str, experiment: str) -> None:
        # The optional extra, imported only when asked for (about two seconds).
        self._metric = _import("mlflow.entities", "mlflow").Metric
        self.client = _import("mlflow.tracking", "mlflow").MlflowClient(tracking_uri=self.uri)
        known = _run_ids(output_dir).get("mlflow")
        if known is not None:
            self.run_id = known
            self.client.update_run(known, status="RUNNING")
        else:
            found = self.client.get_experiment_by_name(project)
            experiment_id = found.experiment_id if found else self.client.create_experiment(project)
            self.run_id = self.client.create_run(experiment_id, run_name=experiment).info.run_id
            _remember_run_id(output_dir, "mlflow", self.run_id)

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        now = int(time.time() * 1000)
        batch = [
            self._metric(_MLFLOW_INVALID.sub("_", k), float(v), now, step)
            for k, v in metrics.items()
            if isinstance(v, numbers.Real)
        ]
        with writing_to(self.folder):
            self.client.log_batch(self.run_id, metrics=batch)

    def close(self) -> None:
        with writing_to(self.folder):
            self.client.set_terminated(self.run_id)


class WandbTracker:
    """A W&B run: online with an API key, else offline files a later `wandb sync` uploads."""

    def __init__(self, output_dir: Path, project: str, experiment: str, env: Mapping[str, str] | None = None) -> None:
        self.mode = self.mode_for(os.environ if env is None else env)
        self._wandb = wandb = _import("wandb", "wandb")
        run_id = _run_ids(output_dir).get("wandb") or secrets.token_hex(4)
        _remember_run_id(output_dir, "wandb", run_id)
        self.folder = output_dir / "wandb"
        with writing_to(self.folder):
            self.run = wandb.init(
                project=project,
                name=experiment,
                id=run_id,
                resume="allow",
                mode=self.mode,
                dir=str(output_dir),
            )
        log.info("wandb: run %s of project %r (%s) in %s", run_id, project, self.mode, output_dir / "wandb")

    @staticmethod
    def mode_for(env: Mapping[str, str]) -> WandbMode:
        mode = env.get(WANDB_MODE_ENV) or ("online" if env.get(WANDB_KEY_ENV) else "offline")
        if mode not in get_args(WandbMode):
            raise ValueError(f"{WANDB_MODE_ENV}={mode!r}: expected one of {', '.join(get_args(WandbMode))}")
        return cast(WandbMode, mode)

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        # W&B's service process writes the run file; an error it meets there comes back here
        # only where the SDK raises it.
        with writing_to(self.folder):
            self.run.log(dict(metrics), step=step)

    def close(self) -> None:
        with writing_to(self.folder):
            self.run.finish()
            # finish() can return before W&B's service has written the run file; the driver
            # exits right after this, so wait for the service to shut down (and flush).
            self._wandb.teardown()


class TensorBoardWriter:
    """TensorBoard event files in `folder`; `purge_step` as SummaryWriter's."""

    def __init__(self, folder: Path, purge_step: int | None = None) -> None:
        from torch.utils.tensorboard import SummaryWriter  # noqa: PLC0415  (heavy; only when asked)

        self.folder = folder
        with writing_to(folder):
            self.writer = SummaryWriter(str(folder), purge_step=purge_step)

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        # Written by the writer's thread: the flush raises what it met, inside the block.
        with writing_to(self.folder):
            for key, value in metrics.items():
                self.writer.add_scalar(key, value, step)
            self.writer.flush()

    def close(self) -> None:
        with writing_to(self.folder):
            self.writer.close()


EXPERIMENT_TRACKERS: dict[str, Callable[[Path, str, str], ExperimentTracker]] = {
    "mlflow": MlflowTracker,
    "wandb": WandbTracker,
}


def _whole_rows(jsonl: Path) -> list[tuple[str, dict[str, Any]]]:
    """Each line of a JSON-lines file the trainer appends to, with its row. A last line that is
    not a whole row (a write cut by a full volume or a killed pod) is left out with a warning;
    a bad row anywhere else is an error."""
    if not jsonl.exists():
        return []
    lines = [line for line in jsonl.read_text().splitlines() if line.strip()]
    rows = []
    for index, line in enumerate(lines):
        try:
            rows.append((line, json.loads(line)))
        except ValueError:
            if index < len(lines) - 1:
                raise
            log.warning("%s: its last line is a torn row (%d bytes), dropped: %.80r", jsonl, len(line), line)
    return rows


def read_rows(jsonl: Path) -> list[dict[str, Any]]:
    """The whole rows of a JSON-lines file (`_whole_rows`)."""
    return [row for _line, row in _whole_rows(jsonl)]


def keep_rows_through(jsonl: Path, step: int) -> None:
    """Drops the rows of a metrics-style JSON-lines file logged after `step` (all of them for a
    negative step): a resumed run redoes those steps and would log them twice. A torn last row
    is dropped too, so that the next append starts on a line of its own."""
    if not jsonl.exists():
        return
    text = jsonl.read_text()
    kept = [line for line, row in _whole_rows(jsonl) if row.get("step", 0) <= step]
    repaired = "".join(line + "\n" for line in kept)
    if repaired != text:
        with writing_to(jsonl):
            jsonl.write_text(repaired)


class Tracker:
    def __init__(
        self,
        output_dir: Path,
        loggers: list[str],
        experiment: str,
        *,
        project: str = "rlkube",
        resumed_at: int | None = None,
    ) -> None:
        """`resumed_at`: the step of the checkpoint a resumed run continues from; what was logged
        after it is dropped (metrics.jsonl) or purged (TensorBoard), as those steps are redone."""
        self.output_dir = output_dir
        output_dir.mkdir(parents=True, exist_ok=True)
        self.jsonl = output_dir / "metrics.jsonl"
        self.console = "console" in loggers
        self.tensorboard: TensorBoardWriter | None = None
        if "tensorboard" in loggers:
            # purge_step: TensorBoard hides the older events at or after it, so a retrained step
            # shows once, with this run's values.
            purge = None if resumed_at is None else resumed_at + 1
            self.tensorboard = TensorBoardWriter(output_dir / "tensorboard" / experiment, purge)
        self.trackers: list[ExperimentTracker] = [
            make(output_dir, project, experiment) for name, make in EXPERIMENT_TRACKERS.items() if name in loggers
        ]

    def log(self, step: int, metrics: dict[str, float]) -> None:
        append_row(self.jsonl, json.dumps({"step": step, **metrics}))
        if self.console:
            log.info("%s", step_line(step, metrics))
        if self.tensorboard is not None:
            self.tensorboard.log(step, metrics)
        for tracker in self.trackers:
            tracker.log(step, metrics)

    def rewind(self, step: int) -> None:
        keep_rows_through(self.jsonl, step)

    def history(self) -> list[dict[str, float]]:
        return read_rows(self.jsonl)

    def plot(self) -> Path | None:
        """Writes curves.png from metrics.jsonl; returns its path, or None without matplotlib."""
        path = self.output_dir / "curves.png"
        if not plot_curves(self.history(), path):
            log.warning("matplotlib is not installed: no curves.png (the numbers are in %s)", self.jsonl)
            return None
        return path

    def close(self) -> None:
        if self.tensorboard is not None:
            self.tensorboard.close()
        for tracker in self.trackers:
            tracker.close()
