"""The driver: owns the data, the loop, checkpoints and reporting, and steers the roles
through their groups' ranks. One path, whatever runs the ranks:

    placement (rlkube_api.placement) → a RankGroup per group (Ray actors, or ranks in this
    process) → the roles the loop sees (assembly.py) → PPOTrainer.step in TrainingRun.fit
    (training_run.py), its checkpoints in saves.py

`run_distributed` launches the ranks as Ray actors (`rlkube-trainer run`, and `driver` in
the controller pod); `run_in_process` runs every role on one rank in this process
(`--in-process`, tests, benchmarks).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlkube_api.config import TrainerConfig
from rlkube_api.names import Env
from rlkube_api.placement import Group, Placement, Role, placement_of
from rlkube_trainer.checkpoint.owner import JobIdentity, claim, identity_from_env
from rlkube_trainer.cluster.elastic_rollout import ElasticRollout, Fleet
from rlkube_trainer.data.prompts import PromptDataset, PromptLoader
from rlkube_trainer.loop.assembly import (
    FleetOf,
    Launch,
    build_roles,
    close,
    engine_spec,
    launch_local,
    start_groups,
    training_sample_multiple,
)
from rlkube_trainer.loop.ppo import PPOTrainer
from rlkube_trainer.loop.progress import ProgressReporter
from rlkube_trainer.loop.prometheus import DriverMetrics, metrics_port_from_env
from rlkube_trainer.loop.saves import GroupState, checkpoint_root
from rlkube_trainer.loop.training_run import RunResult, TrainingRun, total_steps_of
from rlkube_trainer.loop.validation import Validation, validation_prompts
from rlkube_trainer.model.loading import load_tokenizer
from rlkube_trainer.reward.scoring import FunctionRewardScorer, RewardScorer, build_reward_scorer
from rlkube_trainer.rollout.agent.sampler import episode_sampler
from rlkube_trainer.rollout.endpoint.sampler import harness_sampler
from rlkube_trainer.workers.rank import RankSpec

log = logging.getLogger("rlkube.trainer")


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


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
    with assembled(config, placement, launch, reporter, metrics_port, job, fleet_of) as run:
        return run.fit(max_steps, progress)


@contextlib.contextmanager
def assembled(
    config: TrainerConfig,
    placement: Placement,
    launch: Launch,
    reporter: ProgressReporter | None = None,
    metrics_port: int = 0,
    job: JobIdentity | None = None,
    fleet_of: FleetOf | None = None,
) -> Iterator[TrainingRun]:
    """The run, built: its groups started, its roles, data, reward, validation and loop ready
    to fit; closed (engines, reward workers, ranks) when the block ends."""
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
    function_reward: RewardScorer | None = None
    try:
        if config.reward.model is None:  # a function, or the built-in scorers by data_source
            function_reward = build_reward_scorer(config.reward)
        roles = build_roles(config, placement, groups, function_reward, fleet)
        elastic = roles.rollout if isinstance(roles.rollout, ElasticRollout) else None
        episodes = episode_sampler(roles.rollout, tokenizer, config) or harness_sampler(
            roles.rollout, tokenizer, config, training_sample_multiple(placement, groups)
        )
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
            # What each group's ranks run with, for the report at start (effective_settings.py).
            ranks = {str(role): group.call_all("settings")[0] for role, group in groups.items()}
            state = GroupState(placement, groups)
            yield TrainingRun(config, ppo, loader, state, reporter, metrics, validation, ranks=ranks)
        finally:
            metrics.close()
    finally:
        if elastic is not None:
            elastic.close()
        if isinstance(function_reward, FunctionRewardScorer):
            function_reward.close()  # its worker processes
        close(groups)


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
    config: TrainerConfig,
    max_steps: int | None = None,
    progress: bool = True,
    job: JobIdentity | None = None,
    reporter: ProgressReporter | None = None,
) -> RunResult:
    """Every role on one rank in this process (CPU or one GPU)."""
    placement = placement_of(config).in_one_process()
    return train(config, placement, launch_local, reporter, max_steps, progress, job=job)
