"""The settings a rank's roles actually run with, read from the objects it built (the optimizer,
its schedule, the model, the micro-batching, the chosen loss, the engine's arguments), not from
the config that asked for them: what the driver reports at start (loop/effective_settings.py).
Pure functions of built objects."""

from __future__ import annotations

import dataclasses
import inspect
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from rlkube_trainer.workers.training import Trainable

if TYPE_CHECKING:
    from rlkube_trainer.workers.actor import Actor
    from rlkube_trainer.workers.critic import Critic
    from rlkube_trainer.workers.rank import Rank
    from rlkube_trainer.workers.reference import Reference

Settings = dict[str, Any]


def optimizer_settings(trainable: Trainable, total_steps: int) -> Settings:
    """The optimizer's param groups and the learning rate its schedule gives at the steps that
    tell its shape apart (warmup, decay, the floor)."""
    optimizer, factor = trainable.optimizer, trainable.scheduler.lr_lambdas[0]
    groups = [
        {
            "type": type(optimizer).__name__,
            "lr": group["initial_lr"],
            "betas": list(group["betas"]),
            "eps": group["eps"],
            "weight_decay": group["weight_decay"],
            "params": sum(p.numel() for p in group["params"]),
        }
        for group in optimizer.param_groups
    ]
    steps = sorted({0, 1, total_steps // 4, total_steps // 2, (3 * total_steps) // 4, total_steps})
    return {
        "param_groups": groups,
        "lr_factor_at_step": {step: factor(step) for step in steps},
        "grad_clip": trainable.grad_clip,
        "optimizer_offload": trainable.offload_optimizer,
    }


def fsdp_settings(model: nn.Module) -> Settings | None:
    """FSDP2 as applied to `model` (None: not sharded): the mesh, the units, resharding after
    forward (a layer's: the root keeps its weights for the backward), mixed precision and
    offload, read from the param groups fully_shard made."""
    from torch.distributed.fsdp import FSDPModule  # noqa: PLC0415

    units = [m for m in model.modules() if isinstance(m, FSDPModule)]
    if not isinstance(model, FSDPModule):
        return None
    groups = [(unit, unit._get_fsdp_state()._fsdp_param_group) for unit in units]
    layers = [group for unit, group in groups if group is not None and unit is not model]
    every = [group for _, group in groups if group is not None]
    if not every:
        return {"units": len(units)}
    first, layer = every[0], (layers or every)[0]
    return {
        "units": len(units),
        "mesh": list(first.mesh_info.mesh.shape),
        "reshard_after_forward": layer.post_forward_mesh_info is not None,
        "param_dtype": str(first.mp_policy.param_dtype),
        "reduce_dtype": str(first.mp_policy.reduce_dtype),
        "offload": type(first.offload_policy).__name__,
    }


def model_settings(model: nn.Module) -> Settings:
    params = list(model.parameters())
    hf_config = getattr(model, "config", None) or getattr(getattr(model, "backbone", None), "config", None)
    return {
        "class": type(model).__name__,
        "loaded_from": getattr(hf_config, "_name_or_path", None),
        "dtype": str(params[0].dtype) if params else None,
        "parameters": sum(p.numel() for p in params),
        "trainable_parameters": sum(p.numel() for p in params if p.requires_grad),
        "gradient_checkpointing": bool(getattr(model, "is_gradient_checkpointing", False)),
        # compile_decoder_layers replaces a layer's own forward with a compiled one.
        "compiled_modules": sum(1 for m in model.modules() if "forward" in vars(m)),
        "fsdp": fsdp_settings(model),
    }


def _batching(batching: Any) -> Settings:
    return dataclasses.asdict(batching)


def declared_arguments(function: Any, values: Settings) -> Settings:
    """The settings a registered function takes (those its signature declares), as it is called."""
    declared = inspect.signature(function).parameters
    return {name: value for name, value in values.items() if name in declared}


def trainable_settings(trainable: Trainable, total_steps: int) -> Settings:
    """What every trained role runs with: its model, optimizer and mini- and micro-batching."""
    return {
        "model": model_settings(trainable.model),
        "optimizer": optimizer_settings(trainable, total_steps),
        "ppo_epochs": trainable.ppo_epochs,
        "samples_per_mini_batch": trainable.samples_per_mini_batch,
        "micro_batching": _batching(trainable.micro_batching),
    }


def actor_settings(actor: Actor, total_steps: int) -> Settings:
    config = actor.config
    return {
        **trainable_settings(actor, total_steps),
        "log_prob_batching": _batching(actor.log_prob_batching),
        "shuffle": actor.shuffle,
        "packed": actor.packed,
        "temperature": actor.temperature,
        "lora": dataclasses.asdict(actor.lora),
        "recompute_logits": str(actor.recompute),
        "policy_loss": {
            "function": actor.policy_loss.__name__,
            **declared_arguments(
                actor.policy_loss,
                {
                    "cliprange": config.clip_ratio,
                    "cliprange_low": config.clip_ratio_low,
                    "cliprange_high": config.clip_ratio_high,
                    "clip_ratio_c": config.clip_ratio_c,
                    "loss_agg_mode": config.loss_agg_mode,
                    "loss_scale_factor": config.loss_scale_factor,
                    "tau_pos": config.tau_pos,
                    "tau_neg": config.tau_neg,
                    "clip_cov_ratio": config.clip_cov_ratio,
                    "clip_cov_lb": config.clip_cov_lb,
                    "clip_cov_ub": config.clip_cov_ub,
                    "kl_cov_ratio": config.kl_cov_ratio,
                    "ppo_kl_coef": config.ppo_kl_coef,
                    "dro_beta": config.dro_beta,
                },
            ),
        },
        "entropy_coeff": config.entropy_coeff if actor.with_entropy else None,
        "kl_loss": {"coef": config.kl_loss_coef, "type": config.kl_loss_type} if config.use_kl_loss else None,
        "rollout_correction": actor.correction.model_dump(mode="json") if actor.correction.bypass_mode else None,
        "sync_bucket_bytes": actor.sync_bucket_bytes,
    }


def critic_settings(critic: Critic, total_steps: int) -> Settings:
    config = critic.config
    return {
        **trainable_settings(critic, total_steps),
        "forward_batching": _batching(critic.forward_batching),
        "packed": critic.packed,
        "lora": dataclasses.asdict(critic.lora),
        "value_loss": {
            "cliprange_value": config.cliprange_value,
            "loss_agg_mode": config.loss_agg_mode,
            "loss_scale_factor": config.loss_scale_factor,
        },
    }


def reference_settings(reference: Reference) -> Settings:
    return {
        "model": model_settings(reference.model),
        "base_of_policy": reference.base_of_policy,
        "batching": _batching(reference.batching),
        "packed": reference.packed,
        "liger": reference.liger,
        "temperature": reference.temperature,
    }


def rank_settings(rank: Rank) -> Settings:
    """The settings of every role `rank` hosts, from the objects its setup built."""
    total = rank.spec.total_steps
    settings: Settings = {
        "device": str(rank.device),
        "model_path": rank.config.model.path,  # /dev/shm's copy with model.use_shm
        "collective_timeout_s": rank.collective_timeout.total_seconds(),
        "process_group": torch.distributed.is_initialized(),
    }
    if rank.actor is not None:
        settings["actor"] = actor_settings(rank.actor, total)
    if rank.critic is not None:
        settings["critic"] = critic_settings(rank.critic, total)
    if rank.reference is not None:
        settings["reference"] = reference_settings(rank.reference)
    if rank.engine_arguments:
        settings["rollout_engine"] = {"class": type(rank.engine).__name__, **rank.engine_arguments}
    if rank.reward_model is not None:
        settings["reward_model"] = {"class": type(rank.reward_model).__name__, **vars_of(rank.reward_model)}
    return settings


def vars_of(scorer: object) -> Settings:
    """A reward model's plain settings (numbers, strings, flags), not its model or tokenizer."""
    return {k: v for k, v in vars(scorer).items() if isinstance(v, (int, float, str, bool)) and not k.startswith("_")}
