"""What each role does with its model: the actor scores and updates the policy,
the reference scores, the critic estimates and updates values. One instance per
process; the distributed trainer runs one per rank of a role's worker group.

An update is PPO's: `ppo_epochs` passes over the batch in mini-batches (one
optimizer step each), every mini-batch in micro-batches whose gradients
accumulate.
"""

from __future__ import annotations

import contextlib
import math
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from rlkube_api.config import ActorConfig, CriticConfig, OptimConfig, Strategy, TrainerConfig
from rlkube_trainer.algos import (
    agg_loss,
    compute_entropy_loss,
    compute_value_loss,
    get_policy_loss_fn,
    kl_penalty,
    masked_mean,
)
from rlkube_trainer.batch import TrainBatch
from rlkube_trainer.models import CriticModel, load_causal_lm, response_log_probs, response_values
from rlkube_trainer.parallel import average_gradients, full_tensors, is_sharded, shard_with_fsdp2, world_size

Metrics = dict[str, float]


def _distribute(model: nn.Module, device: torch.device, strategy: Strategy) -> nn.Module:
    """FSDP2 or full replicas across the role group (parallel.py); one rank keeps the model as is."""
    # World size, not just an initialised group: FSDP over one rank only costs time.
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return model
    if strategy == "fsdp2" or (strategy == "auto" and device.type == "cuda"):
        return shard_with_fsdp2(model)
    return model


def autocast(device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """bf16 autocast on GPU; plain fp32 on CPU."""
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def build_optimizer(params: Iterator[nn.Parameter], optim: OptimConfig) -> torch.optim.Optimizer:
    return torch.optim.AdamW(
        list(params), lr=optim.lr, betas=(optim.betas[0], optim.betas[1]), weight_decay=optim.weight_decay
    )


def lr_factor(optim: OptimConfig, total_steps: int) -> Callable[[int], float]:
    """Linear warmup from 0, then constant or cosine down to min_lr_ratio (verl's schedules)."""
    warmup = optim.lr_warmup_steps or int(optim.lr_warmup_steps_ratio * total_steps)

    def factor(step: int) -> float:
        if step < warmup:
            return step / max(1, warmup)
        if optim.warmup_style == "constant":
            return 1.0
        progress = (step - warmup) / max(1, total_steps - warmup)
        return optim.min_lr_ratio + (1 - optim.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))

    return factor


def _mini_batches(batch: TrainBatch, size: int, shuffle: bool, generator: torch.Generator) -> list[TrainBatch]:
    """Mini-batches of this rank's shard: the configured size is global, split across the group."""
    size = max(1, size // world_size())
    order = torch.randperm(len(batch), generator=generator) if shuffle else torch.arange(len(batch))
    return [batch.select(order[i : i + size]) for i in range(0, len(batch), size)]


class _Trainable:
    """Optimizer, schedule and the mini/micro-batch loop shared by actor and critic."""

    model: nn.Module

    def __init__(self, optim: OptimConfig, total_steps: int, grad_clip: float, device: torch.device, seed: int) -> None:
        self.device = device
        self.grad_clip = grad_clip
        self.optimizer = build_optimizer(self.model.parameters(), optim)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_factor(optim, total_steps))
        self.generator = torch.Generator().manual_seed(seed)

    def _optimizer_step(self) -> float:
        average_gradients(self.model)
        norm = nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
        grad_norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
        if math.isfinite(grad_norm):
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return grad_norm

    def state_dict(self) -> dict[str, Any]:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "generator": self.generator.get_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.generator.set_state(state["generator"])

    # A sharded model's parameters and optimizer state are DTensors: they go through
    # torch.distributed.checkpoint (checkpoint.save_sharded), the rest stays per rank.
    @property
    def sharded(self) -> bool:
        return is_sharded(self.model)

    def sharded_state_dict(self) -> dict[str, Any]:
        model, optimizer = get_state_dict(self.model, self.optimizer)
        return {"model": model, "optimizer": optimizer}

    def load_sharded_state_dict(self, state: dict[str, Any]) -> None:
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])

    def local_state_dict(self) -> dict[str, Any]:
        return {"scheduler": self.scheduler.state_dict(), "generator": self.generator.get_state()}

    def load_local_state_dict(self, state: dict[str, Any]) -> None:
        self.scheduler.load_state_dict(state["scheduler"])
        self.generator.set_state(state["generator"])


def _mean(values: dict[str, list[float]]) -> Metrics:
    return {k: sum(v) / len(v) for k, v in values.items() if v}


class ActorWorker(_Trainable):
    def __init__(self, config: TrainerConfig, device: torch.device, total_steps: int) -> None:
        self.config: ActorConfig = config.actor
        self.temperature = config.rollout.temperature
        self.samples_per_mini_batch = config.actor.ppo_mini_batch_size * config.rollout.n
        model = load_causal_lm(config.model.path, device, trust_remote_code=config.model.trust_remote_code)
        if config.model.enable_gradient_checkpointing:
            model.gradient_checkpointing_enable()
        self.model = _distribute(model, device, config.actor.strategy)
        super().__init__(config.actor.optim, total_steps, config.actor.grad_clip, device, config.trainer.seed)
        self.policy_loss = get_policy_loss_fn(config.actor.policy_loss)

    def _log_probs(self, batch: TrainBatch, with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        with autocast(self.device):
            return response_log_probs(
                self.model, batch.input_ids, batch.attention_mask, batch.response_length, self.temperature, with_entropy
            )

    @torch.no_grad()
    def compute_log_prob(self, batch: TrainBatch) -> torch.Tensor:
        """Log-probs of the sampled responses under the current policy (old_log_prob)."""
        self.model.eval()
        parts = [
            self._log_probs(m.to(self.device), False)[0].cpu()
            for m in batch.split(self.config.ppo_micro_batch_size_per_gpu)
        ]
        return torch.cat(parts)

    def update(self, batch: TrainBatch) -> Metrics:
        """PPO epochs over mini-batches; returns verl's actor/* metrics.

        The entropy is computed only when it is part of the loss (`entropy_coeff` != 0), as in
        verl's actor: otherwise it would be only a metric, yet cost a softmax over the vocabulary
        at every response position and its backward. `actor/entropy` is then not reported.
        """
        assert batch.old_log_probs is not None and batch.advantages is not None
        cfg = self.config
        with_entropy = cfg.entropy_coeff != 0
        self.model.train()
        stats: dict[str, list[float]] = defaultdict(list)
        for _ in range(cfg.ppo_epochs):
            for mini in _mini_batches(batch, self.samples_per_mini_batch, cfg.shuffle, self.generator):
                for chunk in mini.split(cfg.ppo_micro_batch_size_per_gpu):
                    micro = chunk.to(self.device)
                    mask = micro.response_mask
                    log_prob, entropy = self._log_probs(micro, with_entropy)
                    assert micro.old_log_probs is not None and micro.advantages is not None
                    pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower = self.policy_loss(
                        micro.old_log_probs,
                        log_prob,
                        micro.advantages,
                        mask,
                        cliprange=cfg.clip_ratio,
                        cliprange_low=cfg.clip_ratio_low,
                        cliprange_high=cfg.clip_ratio_high,
                        clip_ratio_c=cfg.clip_ratio_c,
                        loss_agg_mode=cfg.loss_agg_mode,
                    )
                    loss = pg_loss
                    if entropy is not None:
                        entropy_loss = compute_entropy_loss(entropy, mask, cfg.loss_agg_mode)
                        loss = loss - cfg.entropy_coeff * entropy_loss
                        stats["actor/entropy"].append(entropy_loss.item())
                    if cfg.use_kl_loss:
                        assert micro.ref_log_probs is not None
                        kl = kl_penalty(log_prob, micro.ref_log_probs, cfg.kl_loss_type)
                        kl_loss = agg_loss(kl, mask, cfg.loss_agg_mode)
                        loss = loss + cfg.kl_loss_coef * kl_loss
                        stats["actor/kl_loss"].append(kl_loss.item())
                        stats["actor/kl_coef"].append(cfg.kl_loss_coef)
                    # Gradient accumulation: each micro-batch weighs by its share of the mini-batch.
                    torch.autograd.backward(loss * (len(micro) / len(mini)))
                    stats["actor/pg_loss"].append(pg_loss.item())
                    stats["actor/pg_clipfrac"].append(pg_clipfrac.item())
                    stats["actor/ppo_kl"].append(ppo_kl.item())
                    stats["actor/pg_clipfrac_lower"].append(pg_clipfrac_lower.item())
                stats["actor/grad_norm"].append(self._optimizer_step())
        stats["actor/lr"].append(float(self.scheduler.get_last_lr()[0]))
        self.scheduler.step()
        return _mean(stats)

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The policy's full weights for the rollout engine (HF names; shards gathered)."""
        yield from full_tensors(self.model)


class ReferenceWorker:
    def __init__(self, config: TrainerConfig, device: torch.device) -> None:
        self.device = device
        self.temperature = config.rollout.temperature
        self.micro_batch = config.actor.ppo_micro_batch_size_per_gpu
        model = load_causal_lm(config.model.path, device, trust_remote_code=config.model.trust_remote_code)
        model.eval().requires_grad_(False)  # type: ignore[no-untyped-call]
        self.model = _distribute(model, device, config.actor.strategy)

    @torch.no_grad()
    def compute_ref_log_prob(self, batch: TrainBatch) -> torch.Tensor:
        parts = []
        for chunk in batch.split(self.micro_batch):
            micro = chunk.to(self.device)
            with autocast(self.device):
                lp, _ = response_log_probs(
                    self.model, micro.input_ids, micro.attention_mask, micro.response_length, self.temperature
                )
            parts.append(lp.cpu())
        return torch.cat(parts)


class CriticWorker(_Trainable):
    model: CriticModel

    def __init__(self, config: TrainerConfig, device: torch.device, total_steps: int) -> None:
        self.config: CriticConfig = config.critic
        path = config.critic.model_path or config.model.path
        critic = CriticModel.from_pretrained(path, trust_remote_code=config.model.trust_remote_code).to(device)
        self.model = _distribute(critic, device, config.critic.strategy)  # type: ignore[assignment]
        self.ppo_epochs = config.critic.ppo_epochs or config.actor.ppo_epochs
        mini = config.critic.ppo_mini_batch_size or config.actor.ppo_mini_batch_size
        self.samples_per_mini_batch = mini * config.rollout.n
        super().__init__(config.critic.optim, total_steps, config.critic.grad_clip, device, config.trainer.seed + 1)

    @torch.no_grad()
    def compute_values(self, batch: TrainBatch) -> torch.Tensor:
        self.model.eval()
        parts = []
        for chunk in batch.split(self.config.ppo_micro_batch_size_per_gpu):
            micro = chunk.to(self.device)
            with autocast(self.device):
                parts.append(
                    response_values(self.model, micro.input_ids, micro.attention_mask, micro.response_length).cpu()
                )
        return torch.cat(parts) * batch.response_mask

    def update(self, batch: TrainBatch) -> Metrics:
        assert batch.values is not None and batch.returns is not None
        cfg = self.config
        self.model.train()
        stats: dict[str, list[float]] = defaultdict(list)
        for _ in range(self.ppo_epochs):
            for mini in _mini_batches(batch, self.samples_per_mini_batch, False, self.generator):
                for chunk in mini.split(cfg.ppo_micro_batch_size_per_gpu):
                    micro = chunk.to(self.device)
                    assert micro.values is not None and micro.returns is not None
                    with autocast(self.device):
                        vpreds = response_values(
                            self.model, micro.input_ids, micro.attention_mask, micro.response_length
                        )
                    vf_loss, vf_clipfrac = compute_value_loss(
                        vpreds, micro.returns, micro.values, micro.response_mask, cfg.cliprange_value, cfg.loss_agg_mode
                    )
                    torch.autograd.backward(vf_loss * (len(micro) / len(mini)))
                    stats["critic/vf_loss"].append(vf_loss.item())
                    stats["critic/vf_clipfrac"].append(vf_clipfrac.item())
                    stats["critic/vpred_mean"].append(masked_mean(vpreds.detach(), micro.response_mask).item())
                stats["critic/grad_norm"].append(self._optimizer_step())
        stats["critic/lr"].append(float(self.scheduler.get_last_lr()[0]))
        self.scheduler.step()
        return _mean(stats)
