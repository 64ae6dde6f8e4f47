"""The driver: owns the data, the loop, checkpoints and reporting, and steers the roles
through their groups' ranks. One path, whatever runs the ranks:

    placement (rlkube_api.placement) → a RankGroup per group (Ray actors, or ranks in this
    process) → the roles the loop sees (dispatch.py) → PPOTrainer.step in TrainingRun.fit

`run_distributed` launches the ranks as Ray actors (`rlkube-trainer run`, and `driver` in
the controller pod); `run_in_process` runs every role on one rank in this process
(`--in-process`, tests, benchmarks).
"""

from __future__ import annotations

import functools
import itertools
import logging
import os
import random
import socket
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from rlkube_api.config import TrainerConfig
from rlkube_api.names import Env
from rlkube_api.placement import Group, Placement, Role, placement_of
from rlkube_trainer.batch import TrainBatch
from rlkube_trainer.checkpoint.objectstore import CheckpointPath, ObjectPath, locate
from rlkube_trainer.checkpoint.owner import JobIdentity, claim, identity_from_env
from rlkube_trainer.checkpoint.state import WrittenInBackground, capture_rng, load_torch, restore_rng, save_torch
from rlkube_trainer.checkpoint.store import CheckpointManager, Retention, Written, written
from rlkube_trainer.cluster.dispatch import (
    ColocatedRollout,
    DataParallelActor,
    DataParallelCritic,
    DataParallelReference,
    DataParallelRewardModel,
    SeparateRollout,
)
from rlkube_trainer.cluster.elastic_rollout import ElasticRollout, Fleet
from rlkube_trainer.cluster.rank_group import LocalRankGroup, RankGroup
from rlkube_trainer.data.prompts import LoaderState, Prompt, PromptDataset, PromptLoader
from rlkube_trainer.loop.async_training.partial_rollout import (
    interruptible_rollout,
    push_into_generation,
    token_version_metrics,
)
from rlkube_trainer.loop.async_training.schedule import OneStepOff
from rlkube_trainer.loop.async_training.staleness import OffPolicyBuffer, Taken
from rlkube_trainer.loop.ppo import PPOTrainer, Roles, Rollout, Timer
from rlkube_trainer.loop.progress import NullReporter, ProgressReporter, progress_payload
from rlkube_trainer.loop.prometheus import DriverMetrics, metrics_port_from_env
from rlkube_trainer.loop.termination import TERMINATION, Terminated, Termination
from rlkube_trainer.loop.tracking import Tracker
from rlkube_trainer.loop.validation import Validation, headline_score, validation_prompts
from rlkube_trainer.model.fsdp import Rendezvous
from rlkube_trainer.model.loading import load_tokenizer
from rlkube_trainer.reward.scoring import RewardScorer, build_reward_scorer
from rlkube_trainer.rollout.agent.sampler import episode_sampler
from rlkube_trainer.workers.rank import Rank, RankSpec

log = logging.getLogger("rlkube.trainer")

# Starts a group's ranks (already described by their specs) and returns its handle.
Launch = Callable[[Group, list[RankSpec], dict[str, Any]], RankGroup]
# Where elastic rollout engines come from: the rollout group, a rank's spec, the config.
FleetOf = Callable[[Group, Callable[[int], RankSpec], dict[str, Any]], Fleet]
Groups = dict[Role, RankGroup]


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def total_steps_of(config: TrainerConfig, loader: PromptLoader) -> int:
    return config.trainer.total_training_steps or config.trainer.total_epochs * len(loader)


def order_checksum(prompts: list[Prompt]) -> int:
    """An order-sensitive fingerprint of a batch's prompts: resumed runs must see the same data."""
    return sum((i + 1) * p.index for i, p in enumerate(prompts)) % 1_000_003


def attempt_from_env() -> int | None:
    """The gang attempt the operator started this driver for (none outside a cluster)."""
    value = os.environ.get(Env.ATTEMPT)
    return int(value) if value and value.isdigit() else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- the groups and the roles over them --------------------------------------------------------


def rank_specs(placement: Placement, group: Group, total_steps: int) -> list[RankSpec]:
    """What each rank of `group` is told. The rendezvous given here is the local fallback;
    in pods the operator's env (from the same placement) names the real address."""
    port = free_port()
    sync = placement.weight_sync
    return [
        RankSpec(
            group=group.name,
            rank=rank,
            rendezvous=Rendezvous("127.0.0.1", port, group.world_size, rank),
            hosts=group.hosts,
            total_steps=total_steps,
            weight_sync_rank=sync.rank_of(group.name, rank) if sync else None,
            weight_sync_world_size=sync.world_size if sync else 0,
            tensor_parallel_size=placement.engines.tensor_parallel_size if Role.ROLLOUT in group.hosts else 1,
        )
        for rank in range(group.world_size)
    ]


def engine_spec(placement: Placement, total_steps: int, rank: int) -> RankSpec:
    """A rollout engine that joins while the job runs (elastic rollout): a rank of its own,
    numbered in the weight-sync group by the driver when it joins."""
    group = placement.group(Role.ROLLOUT)
    return RankSpec(
        group=group.name,
        rank=rank,
        rendezvous=Rendezvous("127.0.0.1", 0, 1, 0),
        hosts=group.hosts,
        total_steps=total_steps,
        tensor_parallel_size=placement.engines.tensor_parallel_size,
    )


def launch_local(group: Group, specs: list[RankSpec], config: dict[str, Any]) -> RankGroup:
    """The group's ranks as objects in this process."""
    return LocalRankGroup(group.name, [Rank(config, spec) for spec in specs])


def start_groups(config: TrainerConfig, placement: Placement, launch: Launch, total_steps: int) -> Groups:
    config_dict = config.model_dump(mode="json")
    groups = {g.name: launch(g, rank_specs(placement, g, total_steps), config_dict) for g in placement.groups}
    # Ranks of a group must start together: their process group forms across them.
    pending = {role: group.submit("setup", [()] * len(group)) for role, group in groups.items()}
    for role, started in pending.items():
        for where in groups[role].wait(started):
            log.info("ready: %s", where)
    return groups


def build_roles(
    config: TrainerConfig,
    placement: Placement,
    groups: Groups,
    function_reward: Any,
    fleet: Callable[[], Fleet] | None = None,
) -> Roles:
    """The roles the loop calls, each over the group placement puts it on. With `fleet`, a
    separate rollout of one-process engines is elastic (elastic_rollout.py)."""

    def host(role: Role) -> RankGroup | None:
        group = placement.host_of(role)
        return groups[group.name] if group is not None else None

    actor = groups[Role.ACTOR]
    rollout: Rollout
    if placement.weight_sync is not None:
        rollout_group = groups[Role.ROLLOUT]
        # All ranks: gathering a sharded policy's full shapes is a collective.
        manifest = actor.call_all("weight_manifest")[0]
        port = free_port()
        joins = [g.submit("join_weight_sync", [("127.0.0.1", port)] * len(g)) for g in (actor, rollout_group)]
        for group, joined in zip((actor, rollout_group), joins, strict=True):
            group.wait(joined)
        bucket = config.rollout.update_weights_bucket_megabytes * 2**20
        if fleet is not None and placement.engines.tensor_parallel_size == 1:
            rollout = ElasticRollout(actor, rollout_group, fleet(), manifest, bucket, ("127.0.0.1", port))
        else:
            rollout = SeparateRollout(actor, rollout_group, manifest, bucket, placement.engines)
    else:
        rollout = ColocatedRollout(actor, placement.engines)
    reference, critic, reward_model = host(Role.REFERENCE), host(Role.CRITIC), host(Role.REWARD)
    return Roles(
        actor=DataParallelActor(actor),
        rollout=rollout,
        # Function rewards run in the driver; a reward model on the ranks that host it.
        reward=DataParallelRewardModel(reward_model) if reward_model is not None else function_reward,
        reference=DataParallelReference(reference) if reference is not None else None,
        critic=DataParallelCritic(critic) if critic is not None else None,
    )


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


METRICS_FILE = "metrics.jsonl"


def checkpoint_root(config: TrainerConfig) -> CheckpointPath:
    """Where checkpoints, the HF export and (a copy of) metrics.jsonl go: checkpoint.uri (an
    object store) where set, else checkpoint.dir."""
    checkpoint = config.checkpoint
    return locate(checkpoint.uri or checkpoint.dir, checkpoint.endpoint_url)


def retention_of(config: TrainerConfig) -> Retention:
    checkpoint = config.checkpoint
    per_part = {Role.ACTOR: checkpoint.max_actor_ckpt_to_keep, Role.CRITIC: checkpoint.max_critic_ckpt_to_keep}
    return Retention(checkpoint.max_to_keep, {str(part): limit for part, limit in per_part.items()})


def validates_at(config: TrainerConfig, step: int, total_steps: int) -> bool:
    """verl's schedule: every test_freq steps, and after the last."""
    freq = config.trainer.test_freq
    return freq > 0 and (step % freq == 0 or step == total_steps)


# --- the loop -----------------------------------------------------------------------------------


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
class SaveInFlight:
    """A checkpoint written but not yet committed: its files (the ranks' once `written`), and
    whether the ranks write them in the background (checkpoint.async_save)."""

    step: int
    staging: CheckpointPath
    files: dict[str, Written]
    written: bool


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
    ) -> None:
        self.config = config
        self.termination = termination
        self.ppo = ppo
        self.loader = loader
        self.state = state
        self.reporter = reporter or NullReporter()
        self.metrics = metrics
        self.validation = validation
        self.root = checkpoint_root(config)
        self.checkpoints = CheckpointManager(self.root, retention_of(config))
        self.total_steps = total_steps_of(config, loader)
        self.step = 0
        # When this attempt's steps began, and from which step: its pace gives the ETA.
        self.pace_from: tuple[float, int] | None = None
        self.last_checkpoint_step: int | None = None
        # (step, score) of the latest validation: kept in checkpoints for the RLJob status.
        self.last_validation: tuple[int, float] | None = None
        # Set by the asynchronous modes after each update (DataPosition says why); the
        # synchronous loop draws only inside a step, so there the live loader is the position.
        self.trained_position: DataPosition | None = None
        self.next_batch_index = 1
        # The asynchronous modes' schedule while it runs (validation quiesces it).
        self.schedule: OneStepOff[Sampled] | None = None
        # The checkpoint being written: committed once written and its step's row is logged.
        self.in_flight: SaveInFlight | None = None

    # --- checkpoints -------------------------------------------------------------------------------
    def resume(self) -> None:
        found = self.checkpoints.resolve(self.config.checkpoint.resume, self.config.checkpoint.resume_from)
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
        self.last_checkpoint_step = self.step
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
        self.save_written(wait=True)
        return self.commit_save()

    def begin_save(self) -> dict[str, float]:
        """Writes this step's checkpoint into its staging dir, or with checkpoint.async_save
        starts the ranks writing it in the background; returns its timings.
        A save still in flight is finished and committed first: at most one at a time, so a
        rank holds at most one extra copy of its state in host memory, and checkpoints commit
        in step order (the latest marker never goes back, retention counts complete ones)."""
        start = time.perf_counter()
        metrics: dict[str, float] = {}
        if self.in_flight is not None:
            previous = self.save_written(wait=True)
            if previous is not None:
                metrics["timing_s/save_checkpoint_background"] = previous
            self.commit_save()
        staging = self.checkpoints.staging(self.step)
        background = self.config.checkpoint.async_save
        files: dict[str, Written] = {}
        if background:
            self.state.save_in_background(staging)
        else:
            files = self.state.save(staging)
        position = self.trained_position or DataPosition(self.loader.state_dict(), self.step + 1)
        save_torch(
            staging / "driver.pt",
            {
                "step": self.step,
                "loader": position.loader,
                "next_batch_index": position.next_batch_index,
                "kl_ctrl": self.ppo.kl_ctrl.state_dict(),
                "rng": capture_rng(),
                "validation": self.last_validation,
            },
        )
        files |= written(staging, ["driver.pt"], "the driver")
        if self.config.checkpoint.export_hf == "every_save":
            self.state.export_hf(staging / "hf")
        self.in_flight = SaveInFlight(self.step, staging, files, written=not background)
        # The part of the save the step waited for (all of it, unless async_save).
        return metrics | {"timing_s/save_checkpoint": time.perf_counter() - start}

    def save_written(self, wait: bool) -> float | None:
        """Whether the ranks' background write of the save in flight is done (waiting for it
        with `wait`): the seconds it took, once, when it is; None otherwise. A failed write
        raises here as the run's error, and the save is abandoned (never committed)."""
        flight = self.in_flight
        if flight is None or flight.written:
            return None
        try:
            done = self.state.written_in_background(wait)
        except BaseException:
            self.in_flight = None
            raise
        if done is None:
            return None
        files, seconds = done
        flight.files |= files
        flight.written = True
        return seconds

    def commit_save(self) -> CheckpointPath:
        """The written checkpoint in flight becomes the latest (store.py's commit)."""
        flight = self.in_flight
        assert flight is not None and flight.written
        self.in_flight = None
        files = flight.files
        path = self.checkpoints.commit(
            flight.step, {"parts": sorted({f.split("/")[0] for f in files}), "layout": layout_of(files)}, files
        )
        self.last_checkpoint_step = flight.step
        log.info("checkpoint %s", path)
        local_metrics = Path(self.config.checkpoint.dir) / METRICS_FILE
        if isinstance(self.root, ObjectPath) and local_metrics.is_file():
            # Its rows through this checkpoint's step (logged before the commit), one PUT.
            (self.root / METRICS_FILE).upload(local_metrics)
        return path

    def settle_in_flight(self) -> None:
        """On an error: the save in flight is committed if its ranks finish writing it and its
        row is logged (an earlier step's: the state was copied before the failing step began),
        else abandoned; either way never half committed, and the run's own error is raised."""
        flight = self.in_flight
        if flight is None:
            return
        if flight.step >= self.step:
            self.in_flight = None
            log.warning(
                "checkpoint of step %d abandoned in %s: the run failed before its row was logged",
                flight.step,
                flight.staging,
            )
            return
        try:
            self.save_written(wait=True)
            self.commit_save()
        except Exception as error:
            self.in_flight = None
            log.error("checkpoint of step %d abandoned in %s: %s", flight.step, flight.staging, error)

    def stop(self, last_path: CheckpointPath | None) -> None:
        """SIGTERM (termination.py): this step's checkpoint unless it has one, then the exit."""
        if self.in_flight is not None:  # written already (the loop waits for it on SIGTERM)
            self.save_written(wait=True)
            last_path = self.commit_save()
        if self.last_checkpoint_step != self.step:
            last_path = self.save()
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
            self.last_checkpoint_step,
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

    def fit(self, max_steps: int | None = None, progress: bool = True) -> RunResult:
        config = self.config
        if max_steps is not None:
            self.total_steps = min(self.total_steps, max_steps)
        self.resume()
        self.pace_from = (time.perf_counter(), self.step)
        output_dir = Path(config.checkpoint.dir)
        if isinstance(self.root, ObjectPath):
            fetch_metrics(self.root / METRICS_FILE, output_dir / METRICS_FILE)
        # Rows past the checkpoint resumed from are redone by this run: logged once, validated once.
        resumed_at = self.step if self.last_checkpoint_step is not None else -1
        tracker = Tracker(
            output_dir,
            list(config.trainer.logger),
            config.trainer.experiment_name,
            project=config.trainer.project_name,
            resumed_at=resumed_at,
        )
        tracker.rewind(resumed_at)
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
                    background = self.save_written(wait=finish)
                    if background is not None:  # added: the previous save's may be here too
                        key = "timing_s/save_checkpoint_background"
                        metrics[key] = metrics.get(key, 0.0) + background
                    # Logged before the commit: a checkpoint's step always has its row.
                    tracker.log(self.step, metrics)
                    if self.in_flight is not None and self.in_flight.written:
                        last_path = self.commit_save()
                    self.publish(metrics, final=self.step == self.total_steps)
                    bar.update(1)
                    bar.set_postfix(score=f"{metrics.get('critic/score/mean', 0.0):.3f}")
                    if self.termination.requested:
                        self.stop(last_path)
            if self.in_flight is not None:  # not left behind, should a loop end without its last save
                self.save_written(wait=True)
                last_path = self.commit_save()
            if config.checkpoint.export_hf != "never":
                self.state.export_hf(self.root / "hf")
            curves = tracker.plot()
        except Exception:
            self.settle_in_flight()
            raise
        finally:
            bar.close()
            tracker.close()
            self.reporter.flush()
        return RunResult(self.step, tracker.history(), Path(config.checkpoint.dir), curves, last_path)


def fetch_metrics(remote: ObjectPath, local: Path) -> None:
    """The object store's metrics.jsonl into the local dir where this run finds none (a new pod
    without a volume): the rows before the checkpoint resumed from are kept, as on a volume."""
    if local.exists() or not remote.is_file():
        return
    local.parent.mkdir(parents=True, exist_ok=True)
    remote.download(local)


def train(
    config: TrainerConfig,
    placement: Placement,
    launch: Launch,
    reporter: ProgressReporter | None = None,
    max_steps: int | None = None,
    progress: bool = True,
    metrics_port: int = 0,
    job: JobIdentity | None = None,
    fleet_of: FleetOf | None = None,
) -> RunResult:
    """Set-up, then the loop: the same for every way of running the ranks. `job`: the RLJob this
    runs for, which must own checkpoint.dir (None outside a cluster). `fleet_of`: where rollout
    engines that join later come from (None: the rollout keeps the engines it started with)."""
    if job is not None:
        claim(checkpoint_root(config), job, config.checkpoint.adopt)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    seed_everything(config.trainer.seed)
    tokenizer = load_tokenizer(config.model.tokenizer_path or config.model.path)
    loader = PromptLoader.from_config(PromptDataset(config.data.train_files, tokenizer, config.data), config.data)
    val_prompts = validation_prompts(config, tokenizer)
    total_steps = total_steps_of(config, loader)
    groups = start_groups(config, placement, launch, total_steps)
    fleet: Callable[[], Fleet] | None = None
    if fleet_of is not None and placement.weight_sync is not None:
        of = fleet_of

        def fleet() -> Fleet:
            spec_of = functools.partial(engine_spec, placement, total_steps)
            return of(placement.group(Role.ROLLOUT), spec_of, config.model_dump(mode="json"))

    elastic: ElasticRollout | None = None
    try:
        function_reward: RewardScorer | None = None
        if config.reward.model is None:  # a function, or the built-in scorers by data_source
            function_reward = build_reward_scorer(config.reward)
        roles = build_roles(config, placement, groups, function_reward, fleet)
        elastic = roles.rollout if isinstance(roles.rollout, ElasticRollout) else None
        episodes = episode_sampler(roles.rollout, tokenizer, config)
        ppo = PPOTrainer(
            config,
            roles,
            tokenizer.decode,
            tokenizer.pad_token_id,
            num_gpus=max(placement.num_gpus, 1),
            episodes=episodes,
        )
        validation = None
        if val_prompts is not None:
            validation = Validation(config, val_prompts, ppo, Path(config.checkpoint.dir))
        metrics = DriverMetrics()
        metrics.serve(metrics_port)
        try:
            run = TrainingRun(config, ppo, loader, GroupState(placement, groups), reporter, metrics, validation)
            return run.fit(max_steps, progress)
        finally:
            metrics.close()
    finally:
        if elastic is not None:
            elastic.close()
        close(groups)


def close(groups: Groups) -> None:
    """Engines closed where the ranks still answer; a lost rank was reported already."""
    for group in groups.values():
        try:
            group.call_all("close")
        except Exception as error:  # the run's own error (if any) is the one to raise
            log.debug("closing %s: %s", group.role, error)


def run_distributed(
    config: TrainerConfig,
    reporter: ProgressReporter | None = None,
    max_steps: int | None = None,
    progress: bool = True,
) -> RunResult:
    """The ranks as Ray actors on the connected Ray cluster (ray.init already called)."""
    from rlkube_trainer.cluster.ray_group import RayRolloutFleet, launch_ray_group  # noqa: PLC0415  (Ray only where it runs)

    config_path = Path(os.environ[Env.CONFIG]) if os.environ.get(Env.CONFIG) else None

    def fleet_of(group: Group, spec_of: Callable[[int], RankSpec], config_dict: dict[str, Any]) -> Fleet:
        return RayRolloutFleet(group, spec_of, config_dict, config_path)

    log.info(
        "job %s/%s, attempt %s",
        os.environ.get(Env.NAMESPACE, "-"),
        os.environ.get(Env.JOB_NAME, "local"),
        os.environ.get(Env.ATTEMPT, "0"),
    )
    return train(
        config,
        placement_of(config),
        launch_ray_group,
        reporter,
        max_steps,
        progress,
        metrics_port_from_env(),
        identity_from_env(),
        fleet_of,
    )


def run_in_process(
    config: TrainerConfig, max_steps: int | None = None, progress: bool = True, job: JobIdentity | None = None
) -> RunResult:
    """Every role on one rank in this process (CPU or one GPU)."""
    return train(config, placement_of(config).in_one_process(), launch_local, None, max_steps, progress, job=job)
