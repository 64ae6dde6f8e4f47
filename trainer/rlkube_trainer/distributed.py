"""Ray as the control channel: the driver places one worker per GPU (one per pod on
CPU) for every role with pods of its own, forms the worker groups and runs the
loop. The same code runs on a laptop (`rlkube-trainer run`: a local Ray with
every role's resources) and in the pods the operator creates (`rlkube-trainer
driver` in the controller pod as the Ray head; `rlkube-trainer node --role R` in
each role pod, joining it and advertising `rlkube_<role>_<pod index>`).
"""

from __future__ import annotations

import logging
import os
import shlex
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import ray

from rlkube_api.config import TrainerConfig
from rlkube_api.names import RAY_START_ARGS_ENV, Env
from rlkube_api.roles import RolePods, roles_with_pods
from rlkube_trainer.data import PromptDataset, PromptLoader
from rlkube_trainer.driver import RunResult, TrainingRun, seed_everything, total_steps_of, uses_reference
from rlkube_trainer.models import load_tokenizer
from rlkube_trainer.parallel import Rendezvous
from rlkube_trainer.ppo import PPOTrainer, Roles
from rlkube_trainer.reporting import DriverMetrics, ProgressReporter, metrics_port_from_env
from rlkube_trainer.reward import build_reward_scorer
from rlkube_trainer.role_worker import RoleWorker, WorkerSpec
from rlkube_trainer.worker_group import (
    ColocatedGroupRollout,
    GroupActor,
    GroupCritic,
    GroupReference,
    GroupRewardModel,
    SeparateGroupRollout,
    WorkerGroup,
)

log = logging.getLogger("rlkube.trainer")
# How long the driver waits for a rank's answer before declaring it lost.
CALL_TIMEOUT = 1800.0
# How long a role pod keeps trying to reach the Ray head.
JOIN_TIMEOUT = 600.0


def resource_name(role: str, pod_index: int) -> str:
    """The Ray resource a role pod advertises; workers of that pod ask for it."""
    return f"rlkube_{role}_{pod_index}"


def placements(config: TrainerConfig) -> list[RolePods]:
    """The roles with pods (Ray nodes) of their own: the same list the operator builds pods for."""
    return roles_with_pods(config.roles)


def colocated_with_actor(config: TrainerConfig, role: str) -> bool:
    spec = getattr(config.roles, role)
    return spec is None or spec.colocate_with == "actor"


def local_resources(config: TrainerConfig) -> dict[str, float]:
    return {resource_name(p.name, i): float(p.procs_per_pod) for p in placements(config) for i in range(p.replicas)}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Cluster:
    """The worker groups of a run, created on the connected Ray cluster."""

    def __init__(self, config: TrainerConfig, total_steps: int) -> None:
        self.config = config
        self.groups: dict[str, WorkerGroup] = {}
        remote = ray.remote(RoleWorker)
        config_dict = config.model_dump(mode="json")
        for placement in placements(config):
            fallback_port = free_port()
            handles = []
            for rank in range(placement.world_size):
                spec = WorkerSpec(
                    role=placement.name,
                    rank=rank,
                    rendezvous=Rendezvous("127.0.0.1", fallback_port, placement.world_size, rank),
                    total_steps=total_steps,
                    with_engine=placement.name == "actor" and config.roles.rollout.placement == "colocated",
                    with_reference=placement.name == "actor"
                    and uses_reference(config)
                    and colocated_with_actor(config, "reference"),
                    with_critic=placement.name == "actor"
                    and config.roles.critic is not None
                    and config.roles.critic.colocate_with == "actor",
                )
                pod = rank // placement.procs_per_pod
                handles.append(
                    remote.options(
                        name=f"{placement.name}-{rank}",
                        resources={resource_name(placement.name, pod): 1},
                        num_cpus=0,
                        num_gpus=1 if placement.gpus_per_replica else 0,
                        max_restarts=0,
                    ).remote(config_dict, spec)
                )
            self.groups[placement.name] = WorkerGroup(placement.name, handles, CALL_TIMEOUT)
        # Ranks of a group must start together: their process group forms across them.
        setups = {role: [h.setup.remote() for h in g.handles] for role, g in self.groups.items()}
        for role, refs in setups.items():
            for where in self.groups[role].gather(refs):
                log.info("ready: %s", where)

    def roles(self, reward: Any) -> Roles:
        config, groups = self.config, self.groups
        actor = groups["actor"]
        rollout: Any
        if "rollout" in groups:
            # All ranks: gathering a sharded policy's full shapes is a collective.
            manifest = actor.call_all("weight_manifest")[0]
            world = 1 + len(groups["rollout"])
            port = free_port()
            joins = [actor.handles[0].join_weight_sync.remote("127.0.0.1", port, world, 0)]
            joins += [
                h.join_weight_sync.remote("127.0.0.1", port, world, 1 + i)
                for i, h in enumerate(groups["rollout"].handles)
            ]
            actor.gather(joins[:1], [0])
            groups["rollout"].gather(joins[1:])
            bucket = config.rollout.update_weights_bucket_megabytes * 2**20
            rollout = SeparateGroupRollout(actor, groups["rollout"], manifest, bucket)
        else:
            rollout = ColocatedGroupRollout(actor)
        reference = None
        if uses_reference(config):
            reference = GroupReference(groups.get("reference", actor))
        critic = None
        if config.roles.critic is not None:
            critic = GroupCritic(groups.get("critic", actor))
        if config.reward.model is not None:
            reward = GroupRewardModel(groups["reward"]) if "reward" in groups else reward
        return Roles(actor=GroupActor(actor), rollout=rollout, reward=reward, reference=reference, critic=critic)

    def num_gpus(self) -> int:
        return sum(p.world_size for p in placements(self.config) if p.gpus_per_replica)


class ClusterState:
    """Checkpoints written by the ranks themselves into the shared checkpoint folder."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster

    def _trainable_groups(self) -> list[WorkerGroup]:
        return [g for role, g in self.cluster.groups.items() if role in ("actor", "critic")]

    def save(self, staging: Path) -> list[str]:
        files: list[str] = []
        for group in self._trainable_groups():
            for written in group.call_all("save", str(staging)):
                files += written
        return files

    def load(self, checkpoint: Path) -> None:
        for group in self._trainable_groups():
            group.call_all("load", str(checkpoint))

    def export_hf(self, path: Path) -> None:
        self.cluster.groups["actor"].call_all("export_hf", str(path))


def run_distributed(
    config: TrainerConfig,
    reporter: ProgressReporter | None = None,
    max_steps: int | None = None,
    progress: bool = True,
) -> RunResult:
    """The driver's job on a connected Ray cluster (ray.init already called)."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    seed_everything(config.trainer.seed)
    tokenizer = load_tokenizer(config.model.tokenizer_path or config.model.path)
    dataset = PromptDataset(config.data.train_files, tokenizer, config.data)
    loader = PromptLoader.from_config(dataset, config.data)
    cluster = Cluster(config, total_steps_of(config, loader))
    # Function rewards run in the driver; a reward model runs in its worker group.
    function_reward: Any = build_reward_scorer(config.reward) if config.reward.function is not None else None
    roles = cluster.roles(function_reward)
    ppo = PPOTrainer(config, roles, tokenizer.decode, tokenizer.pad_token_id, num_gpus=max(cluster.num_gpus(), 1))
    metrics = DriverMetrics()
    metrics.serve(metrics_port_from_env())
    run = TrainingRun(config, ppo, loader, ClusterState(cluster), reporter, metrics)
    try:
        return run.fit(max_steps, progress)
    finally:
        metrics.close()


def start_local_ray(config: TrainerConfig, attempts: int = 3) -> None:
    """A Ray on this machine with every role's resources, for `rlkube-trainer run`.

    Ray gives its raylet a fixed 30 s to register; on a loaded 2-core machine that
    is sometimes not enough, so the start is retried."""
    for attempt in range(1, attempts + 1):
        try:
            ray.init(
                # A new Ray of its own even when another one runs here (ray.init would join it).
                address="local",
                resources=local_resources(config),
                include_dashboard=False,
                configure_logging=False,
                log_to_driver=True,
            )
            return
        except Exception as exc:  # Ray raises a bare Exception for this
            if "timed out during startup" not in str(exc) or attempt == attempts:
                raise
            log.warning("local Ray did not start (%s); retrying (%d/%d)", exc, attempt, attempts)
            ray.shutdown()


# --- in pods ---------------------------------------------------------------------------------------


def ray_head_port() -> int:
    address = os.environ.get(Env.RAY_ADDRESS, "")
    return int(address.rsplit(":", 1)[1]) if ":" in address else 6379


def ray_start_args() -> list[str]:
    """The user's extra `ray start` flags from the environment (shell words)."""
    return shlex.split(os.environ.get(RAY_START_ARGS_ENV, ""))


def start_ray_head() -> None:
    """The controller pod: a Ray head with no role resources of its own."""
    subprocess.run(
        [
            "ray",
            "start",
            "--head",
            f"--port={ray_head_port()}",
            "--num-cpus=1",
            "--num-gpus=0",
            "--include-dashboard=false",
            "--disable-usage-stats",
            *ray_start_args(),
        ],
        check=True,
    )
    ray.init(address="auto", configure_logging=False)


def wait_for_nodes(config: TrainerConfig, timeout: float) -> None:
    """Waits until every role pod has joined; names the ones that did not."""
    wanted = local_resources(config)
    deadline = time.monotonic() + timeout
    while True:
        have = ray.cluster_resources()  # type: ignore[no-untyped-call]
        missing = sorted(name for name, amount in wanted.items() if have.get(name, 0) < amount)
        if not missing:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"role pods did not join the Ray head within {timeout:.0f} s: {', '.join(missing)}")
        time.sleep(2)


def join_as_node(role: str, gpus: int) -> int:
    """A role pod: joins the head and advertises its role and pod index; returns when
    the head goes away (the driver ended)."""
    index = int(os.environ.get(Env.PET_NODE_RANK) or os.environ.get(Env.RANK) or "0")
    procs = max(gpus, 1)
    resources = f'{{"{resource_name(role, index)}": {procs}}}'
    address = os.environ[Env.RAY_ADDRESS]
    command = [
        "ray",
        "start",
        f"--address={address}",
        f"--resources={resources}",
        f"--num-gpus={gpus}",
        "--disable-usage-stats",
        "--block",
        *ray_start_args(),
    ]
    log.info("joining %s as %s pod %d: %s", address, role, index, " ".join(command))
    # The head may still be starting (pods start in any order): retry the join for a while.
    deadline = time.monotonic() + JOIN_TIMEOUT
    while True:
        code = subprocess.run(command, check=False).returncode
        if code == 0 or time.monotonic() > deadline:
            return code
        log.info("Ray head at %s not reachable yet (exit %d); retrying", address, code)
        time.sleep(5)
