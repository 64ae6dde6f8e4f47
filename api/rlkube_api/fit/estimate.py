"""Memory per rank of a role in its parallel layout: a pure function of the job and the model's
dimensions, used by `kubectl rlkube plan`, by the operator before it creates any pod, and for the
memory table in the docs.

What a training rank (actor, critic) holds, in its largest phases:
- its shard of the parameters: the layers of its pipeline stage (layers / pp), each split tp ways,
  then sharded by FSDP2 over fsdpSize ranks (default: the data-parallel and Ulysses ranks); the embeddings on
  the first stage and the LM head on the last, split tp ways over the vocabulary;
- master weights, gradients, AdamW's two moments and one parameter-sized temporary of its step,
  each in fsdpConfig.modelDtype (fp32: 4 + 4 + 8 + 4 bytes per parameter; bf16: half);
- the compute-dtype (bf16) copy FSDP2 gathers: the root module's embeddings and head for the whole
  forward and backward (every layer with reshardAfterForward false), and two layers in flight;
- activations of one micro-batch (ppoMicroBatchSizePerGpu × (maxPromptLength + maxResponseLength)
  tokens, or ppoMaxTokenLenPerGpu with useDynamicBsz), split over the Ulysses ranks: per token and
  layer 42·hidden + 8·intermediate bytes without gradient checkpointing (Korthikanti et al.'s 34·h
  of a bf16 layer with flash attention, the SwiGLU MLP's four intermediate-sized tensors for its
  two, and the two RMSNorms' fp32 inputs), the parts after the attention and MLP projections
  divided by tp; with checkpointing each layer keeps its bf16 input and one layer is recomputed.
  A 1F1B pipeline's first stage holds pp micro-batches of its layers/pp: all layers' worth;
- one chunk of fp32 logits (the trainer's chunked LM head, 512 MiB).
While the colocated rollout generates, the rank also holds the engine's share of the GPU
(rollout.gpuMemoryUtilization: vLLM takes exactly that, weights and KV cache), beside the
master weights and moments (gradients are freed). The KV cache the declared lengths need is
reported; an engine whose share cannot hold its weights and one whole sequence cannot start.
CUDA's context and the communication buffers are a fixed reserve on top.
LoRA is not modelled: with model.loraRank the estimate is the full fine-tune's, an upper bound.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rlkube_api.config import TrainerConfig
from rlkube_api.config.update import UpdateConfig
from rlkube_api.fit.model import ModelDimensions
from rlkube_api.layout import ParallelLayout
from rlkube_api.placement import Role, placement_of

GIB = 2**30
DTYPE_BYTES = {"bf16": 2, "fp32": 4}
# CUDA context, NCCL and cuBLAS workspaces: memory no tensor holds.
RUNTIME_RESERVE = 2 * GIB
LOGITS_CHUNK = 512 * 2**20
# Two layers' gathered weights at a time: the one computing and the one FSDP2 prefetches.
GATHERED_LAYERS = 2


@dataclass(frozen=True)
class Part:
    what: str
    bytes: int


@dataclass(frozen=True)
class Phase:
    name: str
    parts: tuple[Part, ...]

    @property
    def total(self) -> int:
        return sum(p.bytes for p in self.parts)

    def describe(self) -> str:
        return ", ".join(f"{p.what} {p.bytes / GIB:.1f}" for p in self.parts if p.bytes)


@dataclass(frozen=True)
class RoleEstimate:
    """A role's memory per rank: each phase's tensors, and the fixed reserve on top."""

    role: Role
    layout: ParallelLayout
    phases: tuple[Phase, ...]
    notes: tuple[str, ...] = field(default=())

    @property
    def peak(self) -> Phase:
        return max(self.phases, key=lambda p: p.total)

    @property
    def need(self) -> int:
        """The most GPU memory one rank needs: the largest phase plus the runtime reserve."""
        return self.peak.total + RUNTIME_RESERVE

    def refusal(self, gpu_bytes: int) -> str | None:
        """Why this role cannot fit GPUs of `gpu_bytes`, with the numbers; None when it fits."""
        if self.need <= gpu_bytes:
            return None
        return (
            f"{self.role} ({self.layout.describe()}) needs {self.need / GIB:.1f} GiB per GPU in its "
            f"{self.peak.name} ({self.peak.describe()}, runtime reserve {RUNTIME_RESERVE / GIB:.0f}) but its GPUs "
            f"have {gpu_bytes / GIB:.1f} GiB"
        )


def stage_parameters(dims: ModelDimensions, layout: ParallelLayout) -> int:
    """Parameters of the heaviest pipeline stage of one tensor-parallel rank, before FSDP2."""
    layers = -(-dims.num_hidden_layers // layout.pp) * dims.layer_parameters
    # Split in stages, the embeddings go to the first, the head (or its tied copy) to the last.
    ends = dims.embedding_parameters + (dims.head_parameters if layout.pp == 1 else 0)
    return (layers + ends) // layout.tp


def _activations(config: TrainerConfig, update: UpdateConfig, dims: ModelDimensions, layout: ParallelLayout) -> int:
    lengths = config.data.max_prompt_length + config.data.max_response_length
    tokens = (
        update.ppo_max_token_len_per_gpu if update.use_dynamic_bsz else update.ppo_micro_batch_size_per_gpu * lengths
    )
    tokens = -(-tokens // layout.sp)
    h, inner = dims.hidden_size, dims.intermediate_size
    full_layer = tokens * (10 * h + (32 * h + 8 * inner) // layout.tp)
    if config.model.enable_gradient_checkpointing:
        return tokens * 2 * h * dims.num_hidden_layers + full_layer
    return full_layer * dims.num_hidden_layers


def _training_phase(
    name: str, config: TrainerConfig, update: UpdateConfig, dims: ModelDimensions, layout: ParallelLayout, shard: int
) -> tuple[list[Part], list[Part]]:
    """(resident between updates, added in the update) of an actor or critic rank."""
    fsdp = update.fsdp_config
    master = DTYPE_BYTES[fsdp.model_dtype]
    per_rank = -(-stage_parameters(dims, layout) // shard)
    compute = DTYPE_BYTES[fsdp.mixed_precision.param_dtype]
    if fsdp.reshard_after_forward:
        gathered = (dims.embedding_parameters + dims.head_parameters) // layout.tp
        gathered += GATHERED_LAYERS * dims.layer_parameters // layout.tp
    else:
        gathered = stage_parameters(dims, layout)
    resident = [
        Part(f"{name} weights ({fsdp.model_dtype})", 0 if fsdp.param_offload else per_rank * master),
        Part(f"{name} AdamW moments", 0 if fsdp.param_offload or fsdp.optimizer_offload else 2 * per_rank * master),
    ]
    update_parts = [
        Part(f"{name} gradients", 0 if fsdp.param_offload else per_rank * master),
        Part(f"{name} AdamW moments (in the optimizer step)", 2 * per_rank * master if fsdp.optimizer_offload else 0),
        Part(f"{name} optimizer-step temporaries", 0 if fsdp.param_offload else per_rank * master),
        Part(f"{name} gathered {fsdp.mixed_precision.param_dtype} weights", gathered * compute),
        Part(f"{name} activations", _activations(config, update, dims, layout)),
        Part(f"{name} logits chunk (fp32)", LOGITS_CHUNK),
    ]
    return resident, update_parts


def _kv_per_token(dims: ModelDimensions) -> int:
    """Keys and values of every layer for one token, in bf16."""
    return 2 * dims.num_hidden_layers * dims.kv_heads * dims.head_size * 2


def kv_cache_bytes(config: TrainerConfig, dims: ModelDimensions, engines: int) -> int:
    """The KV cache one engine needs to hold its share of a step's sequences at full length,
    per rank of the engine (the heads split tensor-parallel)."""
    sequences = -(-config.data.train_batch_size * config.rollout.n // max(engines, 1))
    if config.rollout.max_num_seqs is not None:
        sequences = min(sequences, config.rollout.max_num_seqs)
    lengths = config.data.max_prompt_length + config.data.max_response_length
    return sequences * lengths * _kv_per_token(dims) // config.roles.rollout.tensor_parallel_size


def estimate(config: TrainerConfig, dims: ModelDimensions, gpu_bytes: int) -> list[RoleEstimate]:
    """Each GPU role's memory per rank (the actor with what is colocated in it, a critic, a
    separate rollout), on GPUs of `gpu_bytes` (the engine's share is a fraction of it)."""
    placement = placement_of(config)
    rollout = config.rollout
    out = []
    for group in placement.groups:
        layout = group.layout or ParallelLayout(group.world_size, group.procs_per_pod)
        if not group.uses_gpus:
            continue
        tp = config.roles.rollout.tensor_parallel_size
        engine_weights = -(-dims.parameters * 2 // tp)
        one_sequence = (config.data.max_prompt_length + config.data.max_response_length) * _kv_per_token(dims) // tp
        kv = kv_cache_bytes(config, dims, placement.engines.count)
        engine_share = int(rollout.gpu_memory_utilization * gpu_bytes)
        notes = []
        if Role.ROLLOUT in group.hosts:
            notes.append(f"KV cache for a step's sequences at full length: {kv / GIB:.1f} GiB per engine rank")
        engine_parts = (Part("rollout engine (weights and KV cache)", engine_share),)
        if Role.ROLLOUT in group.hosts and engine_share < engine_weights + one_sequence:
            notes.append(
                f"the engine's share ({engine_share / GIB:.1f} GiB) cannot hold its weights and one whole sequence "
                f"({(engine_weights + one_sequence) / GIB:.1f} GiB): raise rollout.gpuMemoryUtilization"
            )
        phases: list[Phase] = []
        if group.name == Role.ROLLOUT:
            phases.append(Phase("generation", engine_parts))
        else:
            update = config.critic if group.name == Role.CRITIC else config.actor
            # FSDP2 shards over the data-parallel and the Ulysses ranks (each holds the same replica),
            # as verl's and torchtitan's meshes do, unless fsdpSize says fewer.
            shard = getattr(config.roles, group.name.value).fsdp_size or layout.dp * layout.sp
            resident, update_parts = _training_phase(group.name.value, config, update, dims, layout, shard)
            frozen = []
            if group.name == Role.ACTOR and Role.CRITIC in group.hosts:
                critic, _ = _training_phase("critic", config, config.critic, dims, layout, shard)
                frozen += critic  # between its own updates the critic's states stay
            if Role.REFERENCE in group.hosts and config.model.lora_rank == 0:
                frozen.append(Part("reference weights (bf16)", -(-stage_parameters(dims, layout) * 2 // shard)))
            phases.append(Phase(f"{group.name.value} update", (*resident, *frozen, *update_parts)))
            if Role.ROLLOUT in group.hosts:
                phases.append(Phase("generation", (*resident, *frozen, *engine_parts)))
        out.append(RoleEstimate(group.name, layout, tuple(phases), tuple(notes)))
    return out
