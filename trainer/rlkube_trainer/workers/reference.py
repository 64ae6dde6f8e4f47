"""The reference: the frozen initial policy's log-probs, for the KL loss or KL-in-reward.

With LoRA the reference is the actor's own model with its adapters turned off: the base is
frozen, so it is the initial policy, and no second copy of the weights is loaded."""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from rlkube_api.config import ActorConfig, ModelConfig, ReferenceConfig
from rlkube_trainer.batch import TrainBatch
from rlkube_trainer.model.loading import apply_liger, causal_lm_skeleton, compile_decoder_layers, load_causal_lm
from rlkube_trainer.model.lora import adapters_disabled
from rlkube_trainer.model.packing import enable_packed_attention
from rlkube_trainer.model.token_scores import response_log_probs
from rlkube_trainer.parallel.mesh import RoleMesh
from rlkube_trainer.workers.actor import actor_batching
from rlkube_trainer.workers.model_parallel import mesh_for, pooled
from rlkube_trainer.workers.training import MicroBatching, Placement, autocast, load_distributed


class Reference:
    def __init__(
        self,
        config: ReferenceConfig,
        model: ModelConfig,
        actor: ActorConfig,
        temperature: float,
        placement: Placement,
        policy: nn.Module | None = None,
        policy_mesh: RoleMesh | None = None,
    ) -> None:
        """`actor`: the section of the policy this reference is the frozen start of: its strategy,
        micro-batches and compilation are the reference's where `config` leaves them unset (as
        verl's ref section interpolates them). `temperature`: rollout.temperature, the one the
        log-probs are taken at. `policy`: the actor's adapted model (LoRA), whose base is the
        reference, split as `policy_mesh` says."""
        device = placement.device
        self.device = device
        self.temperature = temperature
        # The actor's forward-only micro-batches, unless the reference has a token budget of its own.
        self.batching = actor_batching(actor)[1]
        budget = config.log_prob_max_token_len_per_gpu
        if actor.use_dynamic_bsz and budget is not None:
            self.batching = MicroBatching(self.batching.size, budget, "ref.log_prob_max_token_len_per_gpu")
        self.packed = model.use_remove_padding
        self.liger = model.use_liger
        self.base_of_policy = policy is not None
        if policy is not None:
            # LoRA: the actor's model, compiled or not as actor.compile_decoder_layers says (the API
            # refuses another ref.compile_decoder_layers).
            self.model = policy
            self.mesh = policy_mesh
            return
        self.mesh = mesh_for(device, placement.layout, placement.fsdp_size)
        # Frozen and without an optimizer: bf16 weights on GPU, no fp32 master copy to keep.
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        path, remote = model.path, model.trust_remote_code
        self.model = load_distributed(
            lambda: load_causal_lm(path, "cpu", dtype, trust_remote_code=remote),
            lambda: causal_lm_skeleton(path, dtype, trust_remote_code=remote),
            device,
            actor.strategy,
            placement.fsdp_size,
            config.fsdp_config,
            mixed_precision=False,
            prepare=self._prepare,
            mesh=self.mesh,
            packed=self.packed,
        )
        compiled = config.compile_decoder_layers
        if actor.compile_decoder_layers if compiled is None else compiled:
            compile_decoder_layers(self.model)  # after sharding: FSDP2's hooks stay eager

    def _prepare(self, model: nn.Module) -> None:
        model.eval().requires_grad_(False)
        if self.liger:
            apply_liger(model)
        if self.packed:
            enable_packed_attention(model)

    @torch.no_grad()
    def compute_ref_log_prob(self, batch: TrainBatch) -> torch.Tensor:
        self.model.eval()
        base = adapters_disabled(self.model) if self.base_of_policy else contextlib.nullcontext()

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

        with base:
            if self.mesh is None:
                return self.batching.map(batch, log_probs)
            # The ranks of a model-parallel group run their samples together (model_parallel.py).
            whole, own = pooled(batch, self.mesh)
            return self.batching.map(whole, log_probs)[own]
