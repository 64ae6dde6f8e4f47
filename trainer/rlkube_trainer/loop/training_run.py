"""The loop around PPOTrainer.step: the data order, resume, validation, checkpoints at their
steps, reporting, and a stop at a safe point on SIGTERM. Synchronous (generate, update, push
weights: one step at a time) or asynchronous (trainer.v1's one-step-off schedule, the next batch
generating on a worker thread while the actor updates on the previous one).
"""

from __future__ import annotations

import itertools
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from rlkube_api.config import TrainerConfig
from rlkube_api.names import METRICS_FILE, Env
from rlkube_trainer.batch import TrainBatch
from rlkube_trainer.checkpoint.objectstore import CheckpointPath, ObjectPath
from rlkube_trainer.checkpoint.state import capture_rng, load_torch, restore_rng
from rlkube_trainer.data.prompts import LoaderState, Prompt, PromptLoader
from rlkube_trainer.loop.async_training.partial_rollout import (
    interruptible_rollout,
    push_into_generation,
    token_version_metrics,
)
from rlkube_trainer.loop.async_training.schedule import OneStepOff
from rlkube_trainer.loop.async_training.staleness import OffPolicyBuffer, Taken
from rlkube_trainer.loop.effective_settings import report, run_settings
from rlkube_trainer.loop.ppo import PPOTrainer, Timer
from rlkube_trainer.loop.progress import NullReporter, ProgressReporter, progress_payload
from rlkube_trainer.loop.prometheus import DriverMetrics
from rlkube_trainer.loop.saves import GroupState, Saves, fetch_metrics
from rlkube_trainer.loop.termination import TERMINATION, Terminated, Termination
from rlkube_trainer.loop.tracking import Tracker
from rlkube_trainer.loop.validation import Validation, headline_score

log = logging.getLogger("rlkube.trainer")


def total_steps_of(config: TrainerConfig, loader: PromptLoader) -> int:
    return config.trainer.total_training_steps or config.trainer.total_epochs * len(loader)


def order_checksum(prompts: list[Prompt]) -> int:
    """An order-sensitive fingerprint of a batch's prompts: resumed runs must see the same data."""
    return sum((i + 1) * p.index for i, p in enumerate(prompts)) % 1_000_003


def attempt_from_env() -> int | None:
    """The gang attempt the operator started this driver for (none outside a cluster)."""
    value = os.environ.get(Env.ATTEMPT)
    return int(value) if value and value.isdigit() else None


def validates_at(config: TrainerConfig, step: int, total_steps: int) -> bool:
    """verl's schedule: every test_freq steps, and after the last."""
    freq = config.trainer.test_freq
    return freq > 0 and (step % freq == 0 or step == total_steps)


@dataclass(frozen=True)
class DataPosition:
    """Where the data resumes: the loader's state and the index (seed step) of the next batch.
    In the asynchronous modes a checkpoint keeps the position just after the last *trained*
    batch's draws, not the live loader's: batches generating or waiting in the buffer when it
    is written are generated again after a resume, with the resumed weights, so none of their
    samples is lost and none trained twice."""

    loader: LoaderState
    next_batch_index: int


@dataclass
class Sampled:
    """One batch generated (and scored) by the asynchronous schedule's worker thread."""

    index: int  # the batch's own index, its sampling seed step
    prompts: list[Prompt]
    batch: TrainBatch
    metrics: dict[str, float]
    timer: Timer
    after: DataPosition  # the data position once this batch (and any extra DAPO draws) was drawn


@dataclass
class RunResult:
    steps: int
    history: list[dict[str, float]]
    output_dir: Path
    curves: Path | None
    last_checkpoint: CheckpointPath | None


class TrainingRun:
    """The loop around PPOTrainer.step: data order, resume, checkpoints, reporting."""

    def __init__(
        self,
        config: TrainerConfig,
        ppo: PPOTrainer,
        loader: PromptLoader,
        state: GroupState,
        reporter: ProgressReporter | None = None,
        metrics: DriverMetrics | None = None,
        validation: Validation | None = None,
        termination: Termination = TERMINATION,
        ranks: dict[str, Any] | None = None,
    ) -> None:
        """`ranks`: the settings rank 0 of each group runs with (Rank.settings), for the report
        at start (effective_settings.py)."""
        self.config = config
        self.ranks = ranks or {}
        self.termination = termination
        self.ppo = ppo
        self.loader = loader
        self.state = state
        self.reporter = reporter or NullReporter()
        self.metrics = metrics
        self.validation = validation
        self.saves = Saves(config, state)
        self.total_steps = total_steps_of(config, loader)
        self.step = 0
        # When this attempt's steps began, and from which step: its pace gives the ETA.
        self.pace_from: tuple[float, int] | None = None
        # (step, score) of the latest validation: kept in checkpoints for the RLJob status.
        self.last_validation: tuple[int, float] | None = None
        # Set by the asynchronous modes after each update (DataPosition says why); the
        # synchronous loop draws only inside a step, so there the live loader is the position.
        self.trained_position: DataPosition | None = None
        self.next_batch_index = 1
        # The asynchronous modes' schedule while it runs (validation quiesces it).
        self.schedule: OneStepOff[Sampled] | None = None

    # --- checkpoints -------------------------------------------------------------------------------
    def resume(self) -> None:
        found = self.saves.checkpoints.resolve(self.config.checkpoint.resume, self.config.checkpoint.resume_from)
        if found is None:
            return
        self.state.load(found.path)
        driver = load_torch(found.path / "driver.pt")
        self.step = int(driver["step"])
        self.loader.load_state_dict(driver["loader"])
        # Checkpoints before the asynchronous modes kept it have their next batch at step + 1.
        self.next_batch_index = int(driver.get("next_batch_index", self.step + 1))
        self.ppo.kl_ctrl.load_state_dict(driver["kl_ctrl"])
        restore_rng(driver["rng"])
        self.saves.last_step = self.step
        validation = driver.get("validation")
        self.last_validation = (int(validation[0]), float(validation[1])) if validation else None
        # The rollout engines started from the initial weights: give them the resumed ones, and
        # with partial rollouts their version too (the tokens they generate are tagged with it).
        interruptible = interruptible_rollout(self.config, self.ppo.roles.rollout)
        if interruptible is None:
            self.ppo.roles.rollout.sync_weights()
        else:
            push_into_generation(interruptible, self.ppo.roles.rollout.sync_weights, 0, self.step)
        log.info("resumed from %s (step %d)", found.path, self.step)

    def save(self) -> CheckpointPath:
        """This step's checkpoint, written and committed (the step's row logged already)."""
        self.begin_save()
        committed = self.saves.commit_when_written()
        assert committed is not None
        return committed

    def begin_save(self) -> dict[str, float]:
        """This step's checkpoint begun (Saves.begin), with the driver's own state: the data
        position, the KL controller, the RNG and the latest validation."""
        position = self.trained_position or DataPosition(self.loader.state_dict(), self.step + 1)
        driver = {
            "step": self.step,
            "loader": position.loader,
            "next_batch_index": position.next_batch_index,
            "kl_ctrl": self.ppo.kl_ctrl.state_dict(),
            "rng": capture_rng(),
            "validation": self.last_validation,
        }
        return self.saves.begin(self.step, driver)

    def stop(self, last_path: CheckpointPath | None, metrics: dict[str, float]) -> None:
        """SIGTERM (termination.py): this step's checkpoint unless it has one, then the exit."""
        # A save in flight is written already (the loop waits for it on SIGTERM).
        last_path = self.saves.commit_when_written() or last_path
        if self.saves.last_step != self.step:
            last_path = self.save()
            # The status names the checkpoint a resume starts from: this one, not the last
            # periodic save the step's report named.
            self.publish(metrics, final=True)
        assert self.termination.signum is not None
        log.warning("stopping at step %d on signal %d, checkpoint %s", self.step, self.termination.signum, last_path)
        raise Terminated(self.termination.signum, self.step, str(last_path) if last_path else None)

    def _batches(self) -> Iterator[list[Prompt]]:
        while True:
            yield from self.loader

    def validate(self) -> dict[str, float]:
        assert self.validation is not None
        start = time.perf_counter()
        if self.schedule is not None:  # the engine to itself, with the newest weights
            self.schedule.quiesce()
        metrics = self.validation.run(self.step)
        metrics["timing_s/testing"] = time.perf_counter() - start  # verl's name for it
        score = headline_score(metrics)
        if score is not None:
            self.last_validation = (self.step, score)
        return metrics

    def publish(self, metrics: dict[str, float], final: bool = False) -> None:
        """The step's metrics to Prometheus, and the progress annotation."""
        val_step, val_score = self.last_validation or (None, None)
        if self.metrics is not None:
            self.metrics.update(self.step, metrics, self.total_steps, val_score)
        seconds_per_step = None
        if self.pace_from is not None and self.step > self.pace_from[1]:
            seconds_per_step = (time.perf_counter() - self.pace_from[0]) / (self.step - self.pace_from[1])
        payload = progress_payload(
            self.step,
            self.total_steps,
            metrics,
            self.saves.last_step,
            val_score=val_score,
            val_step=val_step,
            seconds_per_step=seconds_per_step,
            attempt=attempt_from_env(),
        )
        self.reporter.report(payload, force=final)

    def _sync_steps(self, batches: Iterator[list[Prompt]]) -> Iterator[dict[str, float]]:
        """Generate, update, push weights: one step at a time."""
        while self.step < self.total_steps:
            self.step += 1
            prompts = next(batches)
            metrics = self.ppo.step(prompts, self.step, more_prompts=lambda: next(batches))
            metrics["data/order_checksum"] = float(order_checksum(prompts))
            yield metrics

    def _async_steps(self, batches: Iterator[list[Prompt]]) -> Iterator[dict[str, float]]:
        """trainer.v1's asynchronous modes: the one-step-off schedule, the next batch generating
        on a worker thread while the actor updates on the previous one. `self.step` counts
        updates (the actor's weight version); each batch samples with its own index as the
        seed step (drawn batches, dropped ones included), so the data order and seeds do not
        depend on the interleaving."""
        v1, ppo = self.config.trainer.v1, self.ppo
        drawn = itertools.count(self.next_batch_index)
        # Read before the worker thread starts: from then on it is the loader's only reader.
        self.trained_position = DataPosition(self.loader.state_dict(), self.next_batch_index)

        def generate() -> list[Sampled]:  # the worker thread: the only reader of `batches` now
            index, prompts, timer = next(drawn), next(batches), Timer()
            batch, metrics = ppo.sample(prompts, index, lambda: next(batches), timer)
            after = DataPosition(self.loader.state_dict(), index + 1)
            return [Sampled(index, prompts, batch, metrics, timer, after)]

        pushes: list[tuple[float, int]] = []  # (seconds, bytes) since the last update's row
        interruptible = interruptible_rollout(self.config, ppo.roles.rollout)

        def push() -> None:
            start = time.perf_counter()
            if interruptible is None:
                synced = ppo.roles.rollout.sync_weights()
            else:
                versions = schedule.versions  # the schedule sets engine = actor after this push
                synced = push_into_generation(
                    interruptible, ppo.roles.rollout.sync_weights, versions.engine, versions.actor
                )
            pushes.append((time.perf_counter() - start, synced))

        last_row = time.perf_counter()

        def train(taken: Taken[Sampled], version: int) -> dict[str, float]:
            nonlocal last_row
            (sampled,) = (group.item for group in taken.groups)
            timer = Timer()
            timer.seconds = dict(sampled.timer.seconds)  # gen and reward, timed on the worker thread
            metrics = ppo.update(sampled.batch, timer) | sampled.metrics
            timer.seconds["timing_s/update_weights"] = sum(seconds for seconds, _ in pushes)
            synced = sum(size for _, size in pushes)
            pushes.clear()
            # A step is the time between updates' rows: in the pipeline, the trainer's pace.
            now = time.perf_counter()
            timer.seconds["timing_s/step"], last_row = now - last_row, now
            metrics = ppo.step_metrics(sampled.batch, metrics, timer, synced)
            if sampled.batch.token_versions is not None:
                (begun,) = (group.version for group in taken.groups)
                metrics |= token_version_metrics(sampled.batch, version, begun)
            metrics["data/order_checksum"] = float(order_checksum(sampled.prompts))
            metrics["training/batch_index"] = float(sampled.index)
            self.trained_position = sampled.after
            return metrics

        sampler = v1.sampler
        # colocate_async pushes after every update (the engine is the actor's own); separate_async
        # every parameter_sync_step updates.
        sync_step = v1.separate_async.parameter_sync_step if v1.trainer_mode == "separate_async" else 1
        # One "group" of the buffer is one whole sampled batch (train_batch_size prompts).
        buffer: OffPolicyBuffer[Sampled] = OffPolicyBuffer(
            sampler.max_off_policy_threshold, sampler.max_off_policy_strategy
        )
        schedule = OneStepOff(
            buffer, 1, sync_step, generate, push, partial_rollout=interruptible is not None, version=self.step
        )
        self.schedule = schedule
        try:
            for metrics in self.schedule.run(self.total_steps - self.step, train):
                self.step += 1
                yield metrics
        finally:
            self.schedule = None

    def open_tracker(self, resumed_at: int) -> Tracker:
        """The run's metrics writers in checkpoint.dir; `resumed_at` as Tracker's (-1: a fresh run)."""
        trainer = self.config.trainer
        return Tracker(
            Path(self.config.checkpoint.dir),
            list(trainer.logger),
            trainer.experiment_name,
            project=trainer.project_name,
            resumed_at=resumed_at,
        )

    def fit(self, max_steps: int | None = None, progress: bool = True) -> RunResult:
        config = self.config
        if max_steps is not None:
            self.total_steps = min(self.total_steps, max_steps)
        self.resume()
        self.pace_from = (time.perf_counter(), self.step)
        output_dir = Path(config.checkpoint.dir)
        if isinstance(self.saves.root, ObjectPath):
            fetch_metrics(self.saves.root / METRICS_FILE, output_dir / METRICS_FILE)
        # Rows past the checkpoint resumed from are redone by this run: logged once, validated once.
        resumed_at = self.step if self.saves.last_step is not None else -1
        tracker = self.open_tracker(resumed_at)
        tracker.rewind(resumed_at)
        report(run_settings(self, tracker), output_dir)
        if self.validation is not None:
            self.validation.rewind(resumed_at)
        bar = tqdm(total=self.total_steps, initial=self.step, disable=not progress, desc="steps", unit="step")
        last_path: CheckpointPath | None = None
        save_freq = config.trainer.save_freq
        try:
            # Before training: a fresh run's initial model (a resumed run was validated on its
            # schedule before its checkpoint), or the loaded model when only validating.
            if self.validation is not None and (
                config.trainer.val_only or (config.trainer.val_before_train and self.step == 0)
            ):
                metrics = self.validate()
                tracker.log(self.step, metrics)
                self.publish(metrics, final=config.trainer.val_only)
            if config.trainer.val_only:
                return RunResult(self.step, tracker.history(), output_dir, tracker.plot(), None)
            batches = self._batches()
            sync = config.trainer.v1.trainer_mode == "sync"
            # From here a SIGTERM stops the loop after the step in progress, with a checkpoint.
            with self.termination.arm():
                for metrics in self._sync_steps(batches) if sync else self._async_steps(batches):
                    if self.validation is not None and validates_at(config, self.step, self.total_steps):
                        metrics.update(self.validate())
                    if (save_freq > 0 and self.step % save_freq == 0) or self.step == self.total_steps:
                        metrics.update(self.begin_save())
                    # A background write is waited for at the run's end and on SIGTERM; its
                    # time is in the row of the step that found it done (a later step's).
                    finish = self.step == self.total_steps or self.termination.requested
                    background = self.saves.written(wait=finish)
                    if background is not None:  # added: the previous save's may be here too
                        key = "timing_s/save_checkpoint_background"
                        metrics[key] = metrics.get(key, 0.0) + background
                    # Logged before the commit: a checkpoint's step always has its row.
                    tracker.log(self.step, metrics)
                    if self.saves.in_flight is not None and self.saves.in_flight.written:
                        last_path = self.saves.commit()
                    self.publish(metrics, final=self.step == self.total_steps)
                    bar.update(1)
                    bar.set_postfix(score=f"{metrics.get('critic/score/mean', 0.0):.3f}")
                    if self.termination.requested:
                        self.stop(last_path, metrics)
            # Not left behind, should a loop end without its last save.
            last_path = self.saves.commit_when_written() or last_path
            if config.checkpoint.export_hf != "never":
                self.state.export_hf(self.saves.root / "hf")
            curves = tracker.plot()
        except Exception:
            self.saves.settle(self.step)
            raise
        finally:
            bar.close()
            tracker.close()
            self.reporter.flush()
        return RunResult(self.step, tracker.history(), Path(config.checkpoint.dir), curves, last_path)
