"""The critic: values of the sampled responses, and its clipped value-loss update."""

from __future__ import annotations

import torch

from rlkube_api.config import AppliedCriticConfig, CriticConfig, ModelConfig
from rlkube_trainer.algos import compute_value_loss, masked_mean
from rlkube_trainer.batch import TrainBatch
from rlkube_trainer.model.fsdp import DTYPES
from rlkube_trainer.model.loading import compile_decoder_layers
from rlkube_trainer.model.lora import LoraSettings, apply_lora
from rlkube_trainer.model.packing import LossScale, enable_packed_attention
from rlkube_trainer.model.value_head import CriticModel, response_values
from rlkube_trainer.workers.model_parallel import mesh_for
from rlkube_trainer.workers.training import (
    Metrics,
    MicroBatching,
    Placement,
    Trainable,
    autocast,
    load_distributed,
    uses_fsdp2,
)


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

    def __init__(
        self,
        config: AppliedCriticConfig,
        model: ModelConfig,
        responses_per_prompt: int,
        placement: Placement,
        total_steps: int,
    ) -> None:
        """`config`: the critic section as it applies (TrainerConfig.critic_applied); `model`:
        the policy's section, whose remote-code trust the critic's backbone shares;
        `responses_per_prompt`: rollout.n, the samples of a mini-batch's prompts."""
        device, seed = placement.device, placement.seed
        self.config = config
        path, remote = config.model_path, model.trust_remote_code
        dtype = DTYPES[config.fsdp_config.model_dtype] if uses_fsdp2(device, config.strategy) else None
        master = dtype or torch.float32
        self.packed = config.use_remove_padding
        lora = LoraSettings.of(config)

        def adapted(critic: CriticModel) -> CriticModel:
            # Adapters on the backbone only: the value head, new and small, trains in full.
            apply_lora(critic.backbone, lora, seed)
            return critic

        self.mesh = mesh_for(device, placement.layout, placement.fsdp_size)
        self.model = load_distributed(  # type: ignore[assignment]
            lambda: adapted(CriticModel.from_pretrained(path, master, trust_remote_code=remote)),
            lambda: adapted(CriticModel.skeleton(path, master, trust_remote_code=remote)),
            device,
            config.strategy,
            placement.fsdp_size,
            config.fsdp_config,
            prepare=enable_packed_attention if self.packed else None,
            mesh=self.mesh,
            packed=self.packed,
        )
        if config.compile_decoder_layers:
            compile_decoder_layers(self.model)  # after sharding: FSDP2's hooks stay eager
        self.ppo_epochs = config.ppo_epochs
        self.samples_per_mini_batch = config.ppo_mini_batch_size * responses_per_prompt
        self.micro_batching, self.forward_batching = critic_batching(config)
        self.shuffle = False
        super().__init__(
            config.optim,
            total_steps,
            config.grad_clip,
            device,
            seed,
            offload_optimizer=config.fsdp_config.optimizer_offload,
        )

    def _values(self, micro: TrainBatch) -> torch.Tensor:
        with autocast(self.device):
            return response_values(
                self.model, micro.input_ids, micro.attention_mask, micro.response_length, packed=self.packed
            )

    @torch.no_grad()
    def compute_values(self, batch: TrainBatch) -> torch.Tensor:
        self.model.eval()
        values = self.forward_only(
            batch,
            lambda whole: self.forward_batching.map(whole, lambda chunk: self._values(chunk.to(self.device)).cpu()),
        )
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
