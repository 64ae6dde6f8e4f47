"""The reference: the frozen initial policy's log-probs, for the KL loss or KL-in-reward."""

from __future__ import annotations

import torch
from torch import nn

from rlkube_api.config import TrainerConfig
from rlkube_trainer.batch import TrainBatch
from rlkube_trainer.models import apply_liger, causal_lm_skeleton, load_causal_lm, response_log_probs
from rlkube_trainer.packing import enable_packed_attention
from rlkube_trainer.roles.actor import actor_batching
from rlkube_trainer.roles.training import MicroBatching, autocast, load_distributed


class Reference:
    def __init__(self, config: TrainerConfig, device: torch.device) -> None:
        self.device = device
        self.temperature = config.rollout.temperature
        # The actor's forward-only micro-batches, unless the reference has a token budget of its own.
        self.batching = actor_batching(config)[1]
        budget = config.ref.log_prob_max_token_len_per_gpu
        if config.actor.use_dynamic_bsz and budget is not None:
            self.batching = MicroBatching(self.batching.size, budget, "ref.log_prob_max_token_len_per_gpu")
        self.packed = config.model.use_remove_padding
        self.liger = config.model.use_liger
        # Frozen and without an optimizer: bf16 weights on GPU, no fp32 master copy to keep.
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        path, remote = config.model.path, config.model.trust_remote_code
        fsdp_size = config.roles.reference.fsdp_size if config.roles.reference is not None else None
        self.model = load_distributed(
            lambda: load_causal_lm(path, "cpu", dtype, trust_remote_code=remote),
            lambda: causal_lm_skeleton(path, dtype, trust_remote_code=remote),
            device,
            config.actor.strategy,
            fsdp_size,
            config.ref.fsdp_config,
            mixed_precision=False,
            prepare=self._prepare,
        )

    def _prepare(self, model: nn.Module) -> None:
        model.eval().requires_grad_(False)
        if self.liger:
            apply_liger(model)
        if self.packed:
            enable_packed_attention(model)

    @torch.no_grad()
    def compute_ref_log_prob(self, batch: TrainBatch) -> torch.Tensor:
        def log_probs(chunk: TrainBatch) -> torch.Tensor:
            micro = chunk.to(self.device)
            with autocast(self.device):
                lp, _ = response_log_probs(
                    self.model,
                    micro.input_ids,
                    micro.attention_mask,
                    micro.response_length,
                    self.temperature,
                    packed=self.packed,
                )
            return lp.cpu()

        return self.batching.map(batch, log_probs)
