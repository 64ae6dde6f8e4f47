"""One rank of a role's worker group: the body of a Ray actor. It joins its role's
torch.distributed group and holds what the role does — the actor's policy (and,
colocated, the rollout engine, reference and critic), a separate rollout
engine, the critic or the reference. Methods are called by the driver through
worker_group.WorkerGroup; they only wire to workers.py and rollout/.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rlkube_api.config import TrainerConfig
from rlkube_api.names import Env
from rlkube_trainer.batch import TrainBatch
from rlkube_trainer.checkpoint import (
    CheckpointError,
    capture_rng,
    load_sharded,
    load_torch,
    restore_rng,
    save_sharded,
    save_torch,
)
from rlkube_trainer.parallel import Rendezvous, init_role_group
from rlkube_trainer.reward import RewardInput, build_reward_scorer
from rlkube_trainer.rollout import RolloutBatch, RolloutEngine, SamplingConfig
from rlkube_trainer.weight_sync import Manifest, WeightSyncGroup, manifest_of
from rlkube_trainer.workers import ActorWorker, CriticWorker, ReferenceWorker

log = logging.getLogger("rlkube.trainer")


@dataclass(frozen=True)
class WorkerSpec:
    """What the driver tells a rank: its role, its rank, where its group meets, and
    which colocated parts it holds."""

    role: str
    rank: int
    rendezvous: Rendezvous
    total_steps: int
    with_engine: bool = False
    with_reference: bool = False
    with_critic: bool = False


def rendezvous_from_env(fallback: Rendezvous) -> Rendezvous:
    """In a pod the operator's env says where the role group meets (MASTER_ADDR/PORT,
    WORLD_SIZE); locally the driver's fallback does. The rank is the driver's:
    pod index × processes per pod + the process's index in its pod."""
    addr = os.environ.get(Env.MASTER_ADDR)
    if not addr:
        return fallback
    world = int(os.environ.get(Env.WORLD_SIZE, fallback.world_size))
    if world != fallback.world_size:
        raise RuntimeError(
            f"{Env.WORLD_SIZE}={world} in this pod, but the driver expects {fallback.world_size} ranks: "
            "the RLJob and the trainer config disagree"
        )
    return Rendezvous(addr, int(os.environ.get(Env.MASTER_PORT, fallback.master_port)), world, fallback.rank)


class RoleWorker:
    def __init__(self, config: dict[str, Any], spec: WorkerSpec) -> None:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        self.config = TrainerConfig.model_validate(config)
        self.spec = spec
        self.device = _device(self.config)
        self.actor: ActorWorker | None = None
        self.critic: CriticWorker | None = None
        self.reference: ReferenceWorker | None = None
        self.engine: RolloutEngine | None = None
        self.sync_group: WeightSyncGroup | None = None
        self.reward: Any = None

    def setup(self) -> str:
        """Joins the role group and loads the models; returns where this rank runs."""
        spec, config = self.spec, self.config
        if self.device.type == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        rendezvous = rendezvous_from_env(spec.rendezvous)
        if rendezvous.world_size > 1 or self.device.type == "cuda":
            init_role_group(rendezvous, self.device)
        torch.manual_seed(config.trainer.seed + spec.rank)
        if spec.role == "actor":
            self.actor = ActorWorker(config, self.device, spec.total_steps)
        if spec.role == "critic" or spec.with_critic:
            self.critic = CriticWorker(config, self.device, spec.total_steps)
        if spec.role == "reference" or spec.with_reference:
            self.reference = ReferenceWorker(config, self.device)
        if spec.role == "reward":
            self.reward = build_reward_scorer(config.reward, str(self.device))
        if spec.role == "rollout" or spec.with_engine:
            from rlkube_trainer.rollout import build_engine  # noqa: PLC0415  (vLLM only where needed)

            self.engine = build_engine(config, self.device)
        return f"{spec.role} rank {spec.rank} on {os.uname().nodename} ({self.device}), pid {os.getpid()}"

    # --- actor ---------------------------------------------------------------------------------
    def compute_log_prob(self, batch: TrainBatch) -> torch.Tensor:
        assert self.actor is not None
        return self.actor.compute_log_prob(batch)

    def update_actor(self, batch: TrainBatch) -> dict[str, float]:
        assert self.actor is not None
        return self.actor.update(batch)

    # --- reference / critic / reward model -------------------------------------------------------
    def compute_ref_log_prob(self, batch: TrainBatch) -> torch.Tensor:
        assert self.reference is not None
        return self.reference.compute_ref_log_prob(batch)

    def compute_values(self, batch: TrainBatch) -> torch.Tensor:
        assert self.critic is not None
        return self.critic.compute_values(batch)

    def update_critic(self, batch: TrainBatch) -> dict[str, float]:
        assert self.critic is not None
        return self.critic.update(batch)

    def score(self, rows: list[RewardInput]) -> tuple[list[float], dict[str, list[float]]]:
        scores, extra = self.reward.score(rows)
        return list(scores), dict(extra)

    # --- rollout ---------------------------------------------------------------------------------
    def generate(self, prompt_token_ids: list[list[int]], sampling: SamplingConfig) -> RolloutBatch:
        assert self.engine is not None
        batch = self.engine.generate(prompt_token_ids, sampling)
        if self.spec.with_engine and self.config.rollout.free_cache_engine:
            self.engine.sleep()  # colocated: free the KV cache while the actor trains
        return batch

    def sync_colocated(self) -> int:
        """Hybrid engine: this rank's policy weights into its own engine, in memory."""
        assert self.actor is not None and self.engine is not None
        if self.config.rollout.free_cache_engine:
            self.engine.wake_up()
        weights = list(self.actor.named_weights())
        self.engine.update_weights(weights)
        return sum(t.numel() * t.element_size() for _, t in weights)

    def weight_manifest(self) -> Manifest:
        assert self.actor is not None
        return manifest_of(self.actor.named_weights())

    def join_weight_sync(self, addr: str, port: int, world_size: int, rank: int) -> None:
        addr = os.environ.get(Env.WEIGHT_SYNC_ADDR, addr)
        port = int(os.environ.get(Env.WEIGHT_SYNC_PORT, port))
        self.sync_group = WeightSyncGroup(addr, port, world_size, rank, self.device)

    def send_weights(self, manifest: Manifest, bucket_bytes: int) -> int:
        """Every actor rank: rank 0 (the only one in the weight-sync group) broadcasts; with a
        sharded policy the others must still take part in gathering each full tensor."""
        assert self.actor is not None
        if self.sync_group is None:
            for _ in self.actor.named_weights():
                pass
            return 0
        return self.sync_group.send(self.actor.named_weights(), manifest, bucket_bytes)

    def receive_weights(self, manifest: Manifest, bucket_bytes: int) -> int:
        """Rollout ranks: the broadcast into the running engine, then a fresh prefix cache."""
        assert self.engine is not None and self.sync_group is not None
        weights = [(name, t.clone()) for name, t in self.sync_group.receive(manifest, bucket_bytes)]
        self.engine.update_weights(weights)
        self.engine.reset_prefix_cache()
        return sum(t.numel() * t.element_size() for _, t in weights)

    # --- checkpoints -------------------------------------------------------------------------------
    def save(self, directory: str) -> list[str]:
        """Writes this rank's state into the checkpoint's staging folder; returns the files."""
        out = Path(directory)
        written = []
        for part, trainable in (("actor", self.actor), ("critic", self.critic)):
            if trainable is None:
                continue
            path = out / part / f"rank_{self.spec.rank}.pt"
            path.parent.mkdir(parents=True, exist_ok=True)
            if trainable.sharded:
                save_sharded(out / part / "sharded", trainable.sharded_state_dict())
                save_torch(path, {"local": trainable.local_state_dict(), "rng": capture_rng()})
            else:
                save_torch(path, {"state": trainable.state_dict(), "rng": capture_rng()})
            written.append(str(path.relative_to(out)))
        return written

    def load(self, directory: str) -> None:
        for part, trainable in (("actor", self.actor), ("critic", self.critic)):
            if trainable is None:
                continue
            path = Path(directory) / part / f"rank_{self.spec.rank}.pt"
            state = load_torch(path)
            if trainable.sharded:
                if "local" not in state:
                    raise CheckpointError(f"{path}: written by unsharded ranks; this run shards {part} (strategy)")
                sharded = trainable.sharded_state_dict()
                load_sharded(Path(directory) / part / "sharded", sharded)
                trainable.load_sharded_state_dict(sharded)
                trainable.load_local_state_dict(state["local"])
            else:
                if "state" not in state:
                    raise CheckpointError(f"{path}: written by sharded ranks; this run does not shard {part}")
                trainable.load_state_dict(state["state"])
            restore_rng(state["rng"])

    def export_hf(self, directory: str) -> None:
        """Every actor rank (gathering a sharded policy is a collective); rank 0 writes the
        policy as a Hugging Face model."""
        from rlkube_trainer.checkpoint import export_hf  # noqa: PLC0415
        from rlkube_trainer.models import load_tokenizer  # noqa: PLC0415

        assert self.actor is not None
        # Gathered tensor by tensor and moved off the GPU as they come.
        state = {k: v.cpu() for k, v in self.actor.named_weights()} if self.actor.sharded else None
        if self.spec.rank != 0:
            return
        export_hf(
            self.actor.model,
            load_tokenizer(self.config.model.tokenizer_path or self.config.model.path),
            Path(directory),
            state_dict=state,
        )

    def ping(self) -> bool:
        return True

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()


def _device(config: TrainerConfig) -> torch.device:
    wanted = config.trainer.device
    if wanted == "auto":
        wanted = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(wanted)
