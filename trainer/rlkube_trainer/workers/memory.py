"""Will this rank's roles fit its GPU (and its host)? Checked at start, before any weight is
loaded, so a configuration that cannot fit stops with what to change instead of running out
of memory in the middle of its first step.

Two phases are checked: generation (the rollout engine awake: the colocated weight sync, the
generation, and the log-prob passes, which run before the engine sleeps only when it does not
free its cache) and the actor update. With optimizerOffload AdamW's moments count on the GPU
in the update only, and in host memory always (their pinned host buffers stay allocated).

Only memory that follows from the configuration and the checkpoint's parameter count is
counted: master weights, gradients, AdamW's two moments and the temporaries of its step
(torch's foreach AdamW makes one parameter-sized temporary, the square root of the second
moment), the frozen roles' weights, the compute-dtype copy FSDP2 keeps gathered (the root
module's embeddings and head; every layer without resharding), and the rollout engine's
share while it is awake. Activations, the logits of a chunk and the allocator's slack come on
top, so passing the check is necessary, not sufficient; failing it means the job cannot fit.
docs/trainer.md has the table of bytes per parameter these sums come from.

With LoRA (model.loraRank, critic.loraRank) only the adapters have gradients, AdamW moments
and step temporaries; the frozen base counts as weights only, and the reference, being the
actor's base with its adapters off, holds nothing of its own.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rlkube_api.config import FSDPConfig, TrainerConfig
from rlkube_api.placement import Role
from rlkube_api.roles import roles_with_pods

GIB = 2**30
DTYPE_BYTES = {"bf16": 2, "fp32": 4}
# CUDA context, NCCL and cuBLAS workspaces: memory no tensor of ours holds.
RUNTIME_RESERVE = 2 * GIB


@dataclass(frozen=True)
class ModelShape:
    """What the check needs of a checkpoint: its parameter count, and the size of the parts
    FSDP2's root module holds gathered (embeddings and LM head)."""

    parameters: int
    root_parameters: int
    # The largest tensor's elements: a weight-sync bucket holds at least that one whole.
    largest_tensor: int = 0
    # With LoRA, the adapters' parameters (the only ones with gradients and optimizer state).
    adapter_parameters: int | None = None

    @classmethod
    def of(cls, path: str | Path) -> ModelShape | None:
        """From the safetensors headers and config.json (nothing is loaded); None when the
        checkpoint has no safetensors files."""
        files = sorted(Path(path).glob("*.safetensors"))
        if not files:
            return None
        sizes = [n for f in files for n in _safetensors_numels(f)]
        config = json.loads((Path(path) / "config.json").read_text())
        text = config.get("text_config", config)
        embedding = int(text.get("vocab_size", 0)) * int(text.get("hidden_size", 0))
        heads = 1 if text.get("tie_word_embeddings", False) else 2
        return cls(sum(sizes), embedding * heads, max(sizes, default=0))


def _linear_shapes(text: Mapping[str, Any]) -> dict[str, tuple[int, int]]:
    """(in, out) features of a decoder layer's linear layers, by the names Llama-style models
    (Qwen, Mistral, Llama) give them."""
    hidden = int(text.get("hidden_size", 0))
    heads = int(text.get("num_attention_heads", 1))
    head_dim = int(text.get("head_dim") or hidden // max(heads, 1))
    kv = int(text.get("num_key_value_heads") or heads) * head_dim
    inner = int(text.get("intermediate_size", 4 * hidden))
    return {
        "q_proj": (hidden, heads * head_dim),
        "k_proj": (hidden, kv),
        "v_proj": (hidden, kv),
        "o_proj": (heads * head_dim, hidden),
        "gate_proj": (hidden, inner),
        "up_proj": (hidden, inner),
        "down_proj": (inner, hidden),
    }


def lora_parameters(text: Mapping[str, Any], rank: int, target_modules: list[str]) -> int:
    """The adapters' parameters: rank × (in + out) for each adapted linear layer of each
    decoder layer. all-linear, and names this table does not know, count every projection
    (an upper bound; excludeModules is not subtracted either)."""
    shapes = _linear_shapes(text)
    known = [name.rsplit(".", 1)[-1] for name in target_modules]
    chosen = shapes.values() if "all-linear" in known or not set(known) <= set(shapes) else [shapes[n] for n in known]
    per_layer = sum(rank * (fan_in + fan_out) for fan_in, fan_out in chosen)
    return per_layer * int(text.get("num_hidden_layers", 0))


def with_adapters(shape: ModelShape, path: str | Path, rank: int, target_modules: list[str]) -> ModelShape:
    """`shape` with its LoRA adapters counted (rank 0: unchanged)."""
    if rank <= 0:
        return shape
    config = json.loads((Path(path) / "config.json").read_text())
    adapters = lora_parameters(config.get("text_config", config), rank, target_modules)
    return replace(shape, parameters=shape.parameters + adapters, adapter_parameters=adapters)


def _safetensors_numels(path: Path) -> list[int]:
    """Each tensor's element count, from the file's header."""
    # The format: an 8-byte little-endian header length, then a JSON header of shapes.
    with path.open("rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
    sizes = []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        count = 1
        for dim in entry["shape"]:
            count *= int(dim)
        sizes.append(count)
    return sizes


@dataclass(frozen=True)
class Part:
    what: str
    bytes: int


@dataclass
class Phase:
    """What is resident on one device during one phase of a step."""

    name: str
    parts: list[Part] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(p.bytes for p in self.parts)

    def describe(self) -> str:
        return ", ".join(f"{p.what} {p.bytes / GIB:.1f}" for p in self.parts if p.bytes)


def trainable_parts(
    role: str, shape: ModelShape, fsdp: FSDPConfig, shard: int, sharded: bool
) -> tuple[list[Part], list[Part]]:
    """(resident always, resident only in the update) of an actor or critic rank, in the
    memory where the states live (the GPU, or the host with paramOffload)."""
    master = DTYPE_BYTES[fsdp.model_dtype] if sharded else 4
    per_rank = shape.parameters // shard if sharded else shape.parameters
    trains = shape.parameters if shape.adapter_parameters is None else shape.adapter_parameters
    trains_per_rank = trains // shard if sharded else trains
    always = [
        Part(f"{role} weights ({fsdp.model_dtype if sharded else 'fp32'})", per_rank * master),
        Part(f"{role} AdamW moments", 2 * trains_per_rank * master),
    ]
    update = [
        Part(f"{role} gradients", trains_per_rank * master),
        Part(f"{role} optimizer-step temporaries", trains_per_rank * master),
    ]
    return always, update


def gathered_parts(role: str, shape: ModelShape, fsdp: FSDPConfig, sharded: bool) -> list[Part]:
    """The compute-dtype copy FSDP2 holds gathered during a forward and backward."""
    if not sharded:
        return []
    compute = DTYPE_BYTES[fsdp.mixed_precision.param_dtype]
    gathered = shape.root_parameters if fsdp.reshard_after_forward else shape.parameters
    return [Part(f"{role} gathered compute weights", gathered * compute)]


@dataclass(frozen=True)
class RankMemory:
    """The check's result for one rank: each phase on the GPU, and what lives on the host."""

    gpu: list[Phase]
    host: Phase


def rank_memory(
    config: TrainerConfig,
    hosts: frozenset[Role],
    world_size: int,
    gpu_bytes: int,
    shapes: dict[str, ModelShape],
    unsharded: frozenset[str] = frozenset(),
) -> RankMemory:
    """The phases of a step on one rank hosting `hosts`, in a group of `world_size` ranks on
    GPUs of `gpu_bytes`. `shapes` holds the checkpoint of each role present ("actor",
    "critic", "reference", "reward"); `unsharded` names those that run as full replicas
    (strategy replicate) instead of under FSDP2."""
    generate, update = Phase("generation"), Phase("actor update")
    host = Phase("host")
    trainables = [(Role.ACTOR, "actor", config.actor.fsdp_config), (Role.CRITIC, "critic", config.critic.fsdp_config)]
    for role, name, fsdp in trainables:
        if role not in hosts or name not in shapes:
            continue
        group = config.roles.actor if role is Role.ACTOR else config.roles.critic
        fsdp_size = group.fsdp_size if group is not None else None
        shard = min(fsdp_size or world_size, world_size)
        sharded = name not in unsharded
        always, during = trainable_parts(name, shapes[name], fsdp, shard, sharded)
        if sharded and fsdp.param_offload:
            host.parts += always + during
        elif fsdp.optimizer_offload:
            # The moments wait in host memory outside the update (generation, weight sync, the
            # log-prob passes) and are on the GPU during it, so both memories hold room for them.
            weights, moments = always
            generate.parts.append(weights)
            host.parts.append(moments)
            update.parts += always + during
        else:
            generate.parts += always
            update.parts += always + during
        update.parts += gathered_parts(name, shapes[name], fsdp, sharded)
        if config.checkpoint.async_save:
            # The copy a background save writes from (checkpoint.asyncSave), while the next
            # steps train.
            host.parts += [Part(f"{part.what}, copy being saved", part.bytes) for part in always]
    for role, name in ((Role.REFERENCE, "reference"), (Role.REWARD, "reward")):
        if role not in hosts or name not in shapes:
            continue
        if role is Role.REFERENCE and config.model.lora_rank > 0:
            continue  # the actor's base with its adapters off: no weights of its own
        sharded = name not in unsharded
        frozen = shapes[name].parameters * 2 // (world_size if sharded else 1)
        offloaded = role is Role.REFERENCE and sharded and config.ref.fsdp_config.param_offload
        part = Part(f"{name} weights (bf16)", frozen)
        (host.parts if offloaded else generate.parts).append(part)
        if not offloaded:
            update.parts.append(part)
    if Role.ROLLOUT in hosts:
        engine = Part("rollout engine (gpuMemoryUtilization)", int(config.rollout.gpu_memory_utilization * gpu_bytes))
        generate.parts.append(engine)
        colocated = Role.ACTOR in hosts
        if colocated and "actor" in shapes and "actor" not in unsharded:
            # The colocated sync runs with the engine awake: one bucket of gathered full tensors
            # and the flat buffer it arrived in (fsdp.gather_full_tensors); a tensor larger than
            # the bucket is a bucket of its own.
            master = DTYPE_BYTES[config.actor.fsdp_config.model_dtype]
            bucket = max(
                config.rollout.update_weights_bucket_megabytes * 2**20, shapes["actor"].largest_tensor * master
            )
            generate.parts.append(Part("weight-sync bucket", 2 * bucket))
        if colocated and config.rollout.free_cache_engine and "actor" in shapes:
            # Asleep (level 1) while the actor trains: its weights wait in host memory.
            tp = config.roles.rollout.tensor_parallel_size
            host.parts.append(Part("rollout engine's weights while asleep", shapes["actor"].parameters * 2 // tp))
        else:
            update.parts.append(engine)
    for phase in (generate, update):
        phase.parts.append(Part("CUDA runtime", RUNTIME_RESERVE))
    return RankMemory([generate, update], host)


class DoesNotFit(RuntimeError):
    """The configuration cannot fit this rank's GPU or host; the message says what to change."""


ADVICE = (
    "actor.fsdpConfig.modelDtype: bf16 (halves weights, gradients and AdamW moments)",
    "actor.fsdpConfig.optimizerOffload: true (AdamW's moments in host memory outside the update)",
    "actor.fsdpConfig.paramOffload: true (states in host memory)",
    "more GPUs in the actor pool (FSDP shards the states over them; fsdpSize shards within groups)",
    "a lower rollout.gpuMemoryUtilization, or rollout.freeCacheEngine: true",
)


def check_fit(memory: RankMemory, gpu_bytes: int, host_bytes: int | None, ranks_per_host: int, where: str) -> None:
    """Raises DoesNotFit naming the phase, its parts and the options, when any phase needs
    more than the GPU has, or the host-side states of the host's ranks more than its memory."""
    problems = []
    for phase in memory.gpu:
        if phase.total > gpu_bytes:
            problems.append(
                f"the {phase.name} needs at least {phase.total / GIB:.1f} GiB of the GPU's {gpu_bytes / GIB:.1f} GiB "
                f"({phase.describe()} GiB), before activations"
            )
    if host_bytes is not None and memory.host.total * ranks_per_host > host_bytes:
        problems.append(
            f"host memory: {ranks_per_host} rank(s) × {memory.host.total / GIB:.1f} GiB "
            f"({memory.host.describe()} GiB) exceed the {host_bytes / GIB:.1f} GiB this pod may use"
        )
    if problems:
        raise DoesNotFit(
            f"{where}: this configuration cannot fit: " + "; ".join(problems) + ". Options: " + "; ".join(ADVICE) + "."
        )


def check_rank(config: TrainerConfig, hosts: frozenset[Role], group: str, rank: int, world_size: int) -> None:
    """check_fit for a rank on the current CUDA device, with the checkpoints' shapes read from
    disk (a checkpoint without safetensors files is left out of the sums)."""
    import torch  # noqa: PLC0415

    from rlkube_trainer.workers.training import uses_fsdp2  # noqa: PLC0415

    device = torch.device("cuda", torch.cuda.current_device())
    paths = {
        "actor": config.model.path,
        "critic": config.critic_applied.model_path,
        "reference": config.model.path,
        "reward": config.reward.model.path if config.reward.model is not None else None,
    }
    shapes = {name: shape for name, path in paths.items() if path and (shape := ModelShape.of(path)) is not None}
    if "actor" in shapes:
        shapes["actor"] = with_adapters(
            shapes["actor"], config.model.path, config.model.lora_rank, config.model.target_modules
        )
    if "critic" in shapes:
        critic = config.critic_applied
        shapes["critic"] = with_adapters(shapes["critic"], critic.model_path, critic.lora_rank, critic.target_modules)
    strategies = {"actor": config.actor.strategy, "reference": config.actor.strategy, "critic": config.critic.strategy}
    unsharded = frozenset(name for name, strategy in strategies.items() if not uses_fsdp2(device, strategy))
    gpu_bytes = torch.cuda.get_device_properties(device).total_memory
    memory = rank_memory(config, hosts, world_size, gpu_bytes, shapes, unsharded)
    per_host = next((p.procs_per_pod for p in roles_with_pods(config.roles) if p.name == group), 1)
    check_fit(memory, gpu_bytes, host_memory_bytes(), per_host, f"{group} rank {rank}")


def host_memory_bytes() -> int | None:
    """What this process's container may use: its cgroup limit, else the machine's memory."""
    for limit in (Path("/sys/fs/cgroup/memory.max"), Path("/sys/fs/cgroup/memory/memory.limit_in_bytes")):
        try:
            text = limit.read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 2**60:
            return int(text)
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return None
