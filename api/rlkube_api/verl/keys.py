"""What the tables say of a verl key, and what they share: a key becomes an rlkube key (`To`,
with a conversion of its value) or has no counterpart (`Ignored`, refused where its value
would change the run); the reasons and value conversions several keys use; and the rule
families verl repeats per role (optimizer, FSDP, micro-batches)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class To:
    """The verl key becomes `target` (a dotted key of rlkube's trainer YAML)."""

    target: str
    convert: Callable[[Any], Any] | None = None


@dataclass(frozen=True)
class Ignored:
    """No counterpart. `accepts(value)` False: refused with `refusal` (it would change
    what the run does). A rule on a key whose value is a mapping judges it whole."""

    why: str
    accepts: Callable[[Any], bool] = field(default=lambda _: True)
    refusal: str = ""


Rule = To | Ignored


def one_of(*values: Any) -> Callable[[Any], bool]:
    return lambda value: value in values


def falsy(value: Any) -> bool:
    return value in (None, False, 0, "", [], {})


def as_list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list | tuple) else [value]


def none_if_negative(value: Any) -> Any:
    return None if value is None or value < 0 else value


def to_strategy(value: Any) -> str:
    # verl's fsdp/fsdp2 shard over the role's ranks; rlkube's auto does that on GPU. verl's megatron
    # engine's tensor and pipeline sizes become the role's own (megatron_rules), trained by FSDP2 on
    # one device mesh with them.
    if value not in STRATEGIES:
        raise ValueError("only fsdp, fsdp2 and megatron (its parallel sizes) are supported")
    return "auto"


PERF = "a performance setting of verl's engines; rlkube sizes its own"
# verl 0.9.1's FSDP engine: use_torch_compile compiles its entropy_from_logits helper, nothing else.
ENTROPY_COMPILE = (
    "compiles verl's entropy-from-logits helper only; rlkube's chunked LM head is not compiled, and its "
    "decoder-layer compile is actor/ref/critic.compile_decoder_layers"
)


def to_recompute_logits(use_fused_kernels: Any) -> str:
    """verl's fused kernels compute the log-probs and entropy chunk by chunk from the hidden states and
    recompute each chunk in the backward (FusedLinearForPPO): rlkube's `always`. Without them verl keeps
    the whole micro-batch's logits for the backward; `auto` keeps them when they fit, as they must."""
    return "always" if use_fused_kernels else "auto"


DERIVED = "derived from other keys in rlkube"
NO_OFFLOAD = "rlkube offloads with param_offload and optimizer_offload"
FSDP = "FSDP wrapping is per decoder layer in rlkube"
STRATEGIES = ("fsdp", "fsdp2", "megatron")
ACTOR_DECIDES = "actor.use_dynamic_bsz decides for the actor's and the reference's forward passes too"


def to_dtype(value: Any) -> str:
    names = {"bf16": "bf16", "bfloat16": "bf16", "fp32": "fp32", "float32": "fp32"}
    if value not in names:
        raise ValueError("only bf16 and fp32 are supported")
    return names[value]


def fsdp_rules(role: str, target: str, optimizer: bool = True, section: str = "fsdp_config") -> dict[str, Rule]:
    """A role's FSDP settings (`role.section`), mapped to the rlkube section `target`
    (`optimizer`: the role has one)."""
    fsdp = f"{target}.fsdp_config"
    verl = f"{role}.{section}"
    return {
        f"{verl}.param_offload": To(f"{fsdp}.param_offload"),
        f"{verl}.optimizer_offload": To(f"{fsdp}.optimizer_offload")
        if optimizer
        else Ignored("the reference has no optimizer"),
        f"{verl}.offload_policy": Ignored(NO_OFFLOAD, falsy, "offload_policy is not supported"),
        f"{verl}.wrap_policy": Ignored(FSDP),
        f"{verl}.reshard_after_forward": To(f"{fsdp}.reshard_after_forward"),
        f"{verl}.forward_prefetch": Ignored(FSDP),
        f"{verl}.model_dtype": To(f"{fsdp}.model_dtype", to_dtype),
        f"{verl}.mixed_precision.param_dtype": To(f"{fsdp}.mixed_precision.param_dtype", to_dtype),
        f"{verl}.mixed_precision.reduce_dtype": To(f"{fsdp}.mixed_precision.reduce_dtype", to_dtype),
        f"{verl}.mixed_precision.buffer_dtype": Ignored("buffers keep the model's dtype"),
    }


def optim_rules(verl: str, rlkube: str) -> dict[str, Rule]:
    return {
        f"{verl}.lr": To(f"{rlkube}.lr"),
        # verl: -1 means "use the ratio"; rlkube: 0 does.
        f"{verl}.lr_warmup_steps": To(f"{rlkube}.lr_warmup_steps", lambda v: max(int(v), 0)),
        f"{verl}.lr_warmup_steps_ratio": To(f"{rlkube}.lr_warmup_steps_ratio"),
        f"{verl}.warmup_style": To(f"{rlkube}.warmup_style"),
        f"{verl}.lr_scheduler_type": To(f"{rlkube}.warmup_style"),
        f"{verl}.min_lr_ratio": To(f"{rlkube}.min_lr_ratio", lambda v: v or 0.0),
        f"{verl}.weight_decay": To(f"{rlkube}.weight_decay"),
        f"{verl}.betas": To(f"{rlkube}.betas", list),
        f"{verl}.num_cycles": Ignored(
            "cosine decays over half a cycle", one_of(0.5), "only num_cycles 0.5 is supported"
        ),
        f"{verl}.total_training_steps": Ignored("filled in by verl at run time; rlkube counts steps itself"),
        f"{verl}.clip_grad": Ignored("see grad_clip"),
        f"{verl}.optimizer": Ignored("AdamW", one_of("AdamW", None), "only AdamW is supported"),
    }


def micro_batch_rules(prefix: str) -> dict[str, Rule]:
    role = prefix.rsplit(".", maxsplit=1)[-1]
    return {
        f"{prefix}.ppo_micro_batch_size": Ignored(
            "deprecated in verl", falsy, "set ppo_micro_batch_size_per_gpu instead of the global micro batch size"
        ),
        f"{prefix}.use_dynamic_bsz": To(f"{role}.use_dynamic_bsz"),
        f"{prefix}.ppo_max_token_len_per_gpu": To(f"{role}.ppo_max_token_len_per_gpu"),
        f"{prefix}.ulysses_sequence_parallel_size": To(f"roles.{role}.ulysses_sequence_parallel_size")
        if role == "actor"
        else Ignored(COLOCATED_LAYOUT),
        f"{prefix}.use_torch_compile": Ignored(ENTROPY_COMPILE),
        f"{prefix}.checkpoint": Ignored("rlkube checkpoints model, optimizer and loop state"),
        f"{prefix}.use_remove_padding": Ignored("rlkube reads the model's use_remove_padding"),
        f"{prefix}.use_fused_kernels": Ignored("rlkube reads the model's use_fused_kernels"),
        f"{prefix}.entropy_from_logits_with_chunking": Ignored(PERF),
        f"{prefix}.entropy_checkpointing": Ignored(PERF),
        f"{prefix}.profiler": Ignored("profiling is a benchmark concern here"),
        f"{prefix}.strategy": To(f"{role}.strategy", to_strategy),
    }


# convert places the reference and critic in the actor's workers (verl's hybrid engine), where they
# run in the actor's layout: their own sizes change no result, only how verl would split the work.
COLOCATED_LAYOUT = "a role in the actor's workers runs in the actor's parallel layout"
_NO_CONTEXT_PARALLEL = (
    "context_parallel_size above 1 is not supported: rlkube splits sequences with Ulysses "
    "(ulysses_sequence_parallel_size)"
)
_NO_EXPERT_PARALLEL = "expert parallelism is not supported: rlkube's engine has no expert-parallel dimension"


def megatron_rules(prefix: str, role: str | None) -> dict[str, Rule]:
    """verl's megatron engine sizes (`prefix`.megatron.*): tensor, pipeline and virtual pipeline
    become roles.`role`'s (None: a role in the actor's workers, which runs in the actor's layout);
    context and expert parallelism are refused by name. Its other keys have no rule: refused at
    values other than verl's defaults, as every key without one."""
    megatron = f"{prefix}.megatron"
    sizes = {
        "tensor_model_parallel_size": "tensor_parallel_size",
        "pipeline_model_parallel_size": "pipeline_parallel_size",
        "virtual_pipeline_model_parallel_size": "virtual_pipeline_parallel_size",
    }
    rules: dict[str, Rule] = {
        f"{megatron}.{verl}": To(f"roles.{role}.{ours}") if role else Ignored(COLOCATED_LAYOUT)
        for verl, ours in sizes.items()
    }
    rules[f"{megatron}.context_parallel_size"] = Ignored(
        "Megatron's context parallelism", one_of(1, None), _NO_CONTEXT_PARALLEL
    )
    rules[f"{megatron}.expert_model_parallel_size"] = Ignored(
        "Megatron's expert parallelism", one_of(1, None), _NO_EXPERT_PARALLEL
    )
    rules[f"{megatron}.expert_tensor_parallel_size"] = Ignored(
        "Megatron's expert tensor parallelism", one_of(1, None), _NO_EXPERT_PARALLEL
    )
    return rules
