"""The critic: values of the sampled responses, and its clipped value-loss update."""

from __future__ import annotations

import torch

from rlkube_api.config import CriticConfig, TrainerConfig
from rlkube_trainer.algos import compute_value_loss, masked_mean
from rlkube_trainer.batch import TrainBatch
from rlkube_trainer.model.fsdp import DTYPES
from rlkube_trainer.model.loading import compile_decoder_layers
from rlkube_trainer.model.lora import LoraSettings, apply_lora
from rlkube_trainer.model.packing import LossScale, enable_packed_attention
from rlkube_trainer.model.value_head import CriticModel, response_values
from rlkube_trainer.workers.training import Metrics, MicroBatching, Trainable, autocast, load_distributed, uses_fsdp2


def critic_batching(critic: CriticConfig) -> tuple[MicroBatching, MicroBatching]:
    """The critic's micro-batches: of its update, and of its forward-only value pass."""
    size = critic.ppo_micro_batch_size_per_gpu
    if not critic.use_dynamic_bsz:
        return MicroBatching(size), MicroBatching(size)
    update = MicroBatching(size, critic.ppo_max_token_len_per_gpu, "critic.ppo_max_token_len_per_gpu")
    budget = critic.forward_max_token_len_per_gpu
    forward = update if budget is None else MicroBatching(size, budget, "critic.forward_max_token_len_per_gpu")
    return update, forward


class Critic(Trainable):
    prefix = "critic"
    model: CriticModel

    def __init__(self, config: TrainerConfig, device: torch.device, total_steps: int) -> None:
        self.config: CriticConfig = config.critic
        path = config.critic.model_path or config.model.path
        dtype = DTYPES[config.critic.fsdp_config.model_dtype] if uses_fsdp2(device, config.critic.strategy) else None
        remote, master = config.model.trust_remote_code, dtype or torch.float32
        use = config.critic.use_remove_padding
        self.packed = config.model.use_remove_padding if use is None else use
        fsdp_size = config.roles.critic.fsdp_size if config.roles.critic is not None else None
        lora, seed = LoraSettings.of(config.critic), config.trainer.seed + 1

        def adapted(critic: CriticModel) -> CriticModel:
            # Adapters on the backbone only: the value head, new and small, trains in full.
            apply_lora(critic.backbone, lora, seed)
            return critic

        self.model = load_distributed(  # type: ignore[assignment]
            lambda: adapted(CriticModel.from_pretrained(path, master, trust_remote_code=remote)),
            lambda: adapted(CriticModel.skeleton(path, master, trust_remote_code=remote)),
            device,
            config.critic.strategy,
            fsdp_size,
            config.critic.fsdp_config,
            prepare=enable_packed_attention if self.packed else None,
        )
        if config.critic.compile_decoder_layers:
            compile_decoder_layers(self.model)  # after sharding: FSDP2's hooks stay eager
        self.ppo_epochs = config.critic.ppo_epochs or config.actor.ppo_epochs
        mini = config.critic.ppo_mini_batch_size or config.actor.ppo_mini_batch_size
        self.samples_per_mini_batch = mini * config.rollout.n
        self.micro_batching, self.forward_batching = critic_batching(config.critic)
        self.shuffle = False
        super().__init__(
            config.critic.optim,
            total_steps,
            config.critic.grad_clip,
            device,
            config.trainer.seed + 1,
            offload_optimizer=config.critic.fsdp_config.optimizer_offload,
        )

    def _values(self, micro: TrainBatch) -> torch.Tensor:
        with autocast(self.device):
            return response_values(
                self.model, micro.input_ids, micro.attention_mask, micro.response_length, packed=self.packed
            )

    @torch.no_grad()
    def compute_values(self, batch: TrainBatch) -> torch.Tensor:
        self.model.eval()
        values = self.forward_batching.map(batch, lambda chunk: self._values(chunk.to(self.device)).cpu())
        return values * batch.response_mask

    def micro_batch_loss(self, micro: TrainBatch, scale: LossScale) -> tuple[torch.Tensor, Metrics]:
        assert micro.values is not None and micro.returns is not None
        vpreds = self._values(micro)
        vf_loss, vf_clipfrac = compute_value_loss(
            vpreds,
            micro.returns,
            micro.values,
            micro.response_mask,
            self.config.cliprange_value,
            self.config.loss_agg_mode,
            self.config.loss_scale_factor,
        )
        metrics = {
            "critic/vf_loss": vf_loss.item(),
            "critic/vf_clipfrac": vf_clipfrac.item(),
            "critic/vpred_mean": masked_mean(vpreds.detach(), micro.response_mask).item(),
        }
        return vf_loss * scale.weight(self.config.loss_agg_mode, micro.response_mask), metrics
