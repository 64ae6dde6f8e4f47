"""The actor: the policy's log-probs of sampled responses, and its PPO update. The loss
of a micro-batch is assembled in `actor_loss`: policy loss − entropy bonus + KL loss."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn

from rlkube_api.config import ActorConfig, ModelConfig, RolloutConfig, RolloutCorrectionConfig
from rlkube_trainer.algos import (
    FIXED_LOSS_AGG_MODES,
    PolicyLossFn,
    agg_loss,
    call_with,
    compute_entropy_loss,
    get_policy_loss_fn,
    kl_penalty,
)
from rlkube_trainer.algos.rollout_correction import bypass_policy_loss
from rlkube_trainer.batch import TrainBatch
from rlkube_trainer.model.checkpoint_names import CheckpointNames, meta_like
from rlkube_trainer.model.fsdp import DTYPES
from rlkube_trainer.model.loading import apply_liger, causal_lm_skeleton, compile_decoder_layers, load_causal_lm
from rlkube_trainer.model.lora import LoraSettings, apply_lora, merged_names, merged_weights
from rlkube_trainer.model.lora.merge import BASE
from rlkube_trainer.model.packing import LossScale, enable_packed_attention
from rlkube_trainer.model.stage_heads import ResponseScoresHead
from rlkube_trainer.model.token_scores import (
    SCORES,
    LogitsRecompute,
    ResponseScores,
    logits_budget_bytes,
    response_scores,
)
from rlkube_trainer.workers import pipelined
from rlkube_trainer.workers.model_parallel import mesh_for
from rlkube_trainer.workers.pipelined import check_pipelined, pipeline_of
from rlkube_trainer.workers.resharding import gather_full_tensors
from rlkube_trainer.workers.training import (
    Metrics,
    MicroBatching,
    Placement,
    Trainable,
    autocast,
    load_distributed,
    uses_fsdp2,
)


def actor_loss(
    config: ActorConfig,
    policy_loss: PolicyLossFn,
    micro: TrainBatch,
    log_prob: torch.Tensor,
    entropy: torch.Tensor | None,
    scale: LossScale | None = None,
    correction: RolloutCorrectionConfig | None = None,
) -> tuple[torch.Tensor, Metrics]:
    """verl's actor objective on one micro-batch: the policy loss, minus `entropy_coeff` ×
    the entropy (when computed), plus `kl_loss_coef` × KL(actor || reference) when
    `use_kl_loss`; with verl's actor/* metrics. Without old log-probs (an on-policy update,
    see ppo.on_policy) the policy's own, detached, are the old ones. With `scale`, each term is
    weighed by the micro-batch's share of its mini-batch under the term's aggregation (the
    policy loss's may be its own, as SAPO's). With `correction` in bypass mode, verl's bypass loss
    replaces the policy loss (rollout_correction.bypass_policy_loss)."""
    assert micro.advantages is not None
    old_log_probs = micro.old_log_probs if micro.old_log_probs is not None else log_prob.detach()
    mask = micro.response_mask

    def weight(mode: str) -> float:
        return 1.0 if scale is None else scale.weight(mode, mask)

    metrics: Metrics = {}
    if correction is not None and correction.bypass_mode:
        # The engine's log-probs are the old ones; weights and rejection follow the current policy.
        assert micro.rollout_log_probs is not None
        pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower, metrics = bypass_policy_loss(
            correction,
            micro.rollout_log_probs,
            log_prob,
            micro.advantages,
            mask,
            config.clip_ratio,
            config.clip_ratio_low,
            config.clip_ratio_high,
            config.clip_ratio_c,
            config.loss_agg_mode,
            config.loss_scale_factor,
        )
    else:
        # Each loss takes the settings it declares (sapo its taus, dro its beta, ...).
        pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower = call_with(
            policy_loss,
            old_log_prob=old_log_probs,
            log_prob=log_prob,
            advantages=micro.advantages,
            response_mask=mask,
            cliprange=config.clip_ratio,
            cliprange_low=config.clip_ratio_low,
            cliprange_high=config.clip_ratio_high,
            clip_ratio_c=config.clip_ratio_c,
            loss_agg_mode=config.loss_agg_mode,
            loss_scale_factor=config.loss_scale_factor,
            rollout_is_weights=micro.rollout_is_weights,
            tau_pos=config.tau_pos,
            tau_neg=config.tau_neg,
            clip_cov_ratio=config.clip_cov_ratio,
            clip_cov_lb=config.clip_cov_lb,
            clip_cov_ub=config.clip_cov_ub,
            kl_cov_ratio=config.kl_cov_ratio,
            ppo_kl_coef=config.ppo_kl_coef,
            dro_beta=config.dro_beta,
        )
    metrics |= {
        "actor/pg_loss": pg_loss.item(),
        "actor/pg_clipfrac": pg_clipfrac.item(),
        "actor/ppo_kl": ppo_kl.item(),
        "actor/pg_clipfrac_lower": pg_clipfrac_lower.item(),
    }
    loss = pg_loss * weight(FIXED_LOSS_AGG_MODES.get(config.policy_loss, config.loss_agg_mode))
    if entropy is not None:
        entropy_loss = compute_entropy_loss(entropy, mask, config.loss_agg_mode, config.loss_scale_factor)
        loss = loss - config.entropy_coeff * weight(config.loss_agg_mode) * entropy_loss
        metrics["actor/entropy"] = entropy_loss.item()
    if config.use_kl_loss:
        assert micro.ref_log_probs is not None
        kl_loss = agg_loss(
            kl_penalty(log_prob, micro.ref_log_probs, config.kl_loss_type),
            mask,
            config.loss_agg_mode,
            config.loss_scale_factor,
        )
        loss = loss + config.kl_loss_coef * weight(config.loss_agg_mode) * kl_loss
        metrics["actor/kl_loss"] = kl_loss.item()
        metrics["actor/kl_coef"] = config.kl_loss_coef
    return loss, metrics


def actor_batching(actor: ActorConfig) -> tuple[MicroBatching, MicroBatching]:
    """The actor's micro-batches: of its update, and of its forward-only log-prob pass."""
    size = actor.ppo_micro_batch_size_per_gpu
    if not actor.use_dynamic_bsz:
        return MicroBatching(size), MicroBatching(size)
    log_prob = actor.log_prob_max_token_len_per_gpu
    return (
        MicroBatching(size, actor.ppo_max_token_len_per_gpu, "actor.ppo_max_token_len_per_gpu"),
        MicroBatching(size, log_prob, "actor.log_prob_max_token_len_per_gpu")
        if log_prob is not None
        else MicroBatching(size, actor.ppo_max_token_len_per_gpu, "actor.ppo_max_token_len_per_gpu"),
    )


class Actor(Trainable):
    prefix = "actor"

    def __init__(
        self,
        config: ActorConfig,
        model: ModelConfig,
        rollout: RolloutConfig,
        correction: RolloutCorrectionConfig,
        placement: Placement,
        total_steps: int,
    ) -> None:
        """`rollout`: the section of the engines this actor samples for and syncs weights into
        (its temperature, samples per prompt, weight buckets); `correction`: the rollout
        correction as it applies in the job's trainer mode."""
        device = placement.device
        self.config = config
        self.temperature = rollout.temperature
        self.ppo_epochs = config.ppo_epochs
        self.samples_per_mini_batch = config.ppo_mini_batch_size * rollout.n
        self.micro_batching, self.log_prob_batching = actor_batching(config)
        self.packed = model.use_remove_padding
        self.shuffle = config.shuffle
        dtype = DTYPES[config.fsdp_config.model_dtype] if uses_fsdp2(device, config.strategy) else torch.float32
        path, remote = model.path, model.trust_remote_code
        self.lora = LoraSettings.of(model)
        lora, seed = self.lora, placement.seed

        def prepare(module: nn.Module) -> None:
            if model.enable_gradient_checkpointing:
                module.gradient_checkpointing_enable()  # type: ignore[operator]
                if lora.enabled:
                    # The frozen embeddings' output needs a gradient for the checkpointed
                    # layers to recompute into one (verl does the same).
                    module.enable_input_require_grads()  # type: ignore[operator]
            if model.use_liger:
                apply_liger(module)
            if self.packed:
                enable_packed_attention(module)

        self.mesh = mesh_for(device, placement.layout, placement.fsdp_size)
        if self.mesh is not None and self.mesh.layout.pipeline > 1:
            check_pipelined(
                self.mesh, self.packed, config.use_dynamic_bsz, "model.use_remove_padding", "actor.use_dynamic_bsz"
            )
        self.model = load_distributed(
            # The adapters go in before sharding, on rank 0's full model and on the skeleton alike.
            lambda: apply_lora(load_causal_lm(path, "cpu", dtype, trust_remote_code=remote), lora, seed),
            lambda: apply_lora(causal_lm_skeleton(path, dtype, trust_remote_code=remote), lora, seed),
            device,
            config.strategy,
            placement.fsdp_size,
            config.fsdp_config,
            prepare=prepare,
            mesh=self.mesh,
        )
        self.recompute = LogitsRecompute(config.recompute_logits, logits_budget_bytes(device))
        # The last pipeline stage's head (None without a pipeline, and on the other stages).
        self.stage_head: ResponseScoresHead | None = None
        if self.mesh is not None and self.mesh.layout.pipeline > 1:
            self.pipeline = pipeline_of(
                self.model, self.mesh, self._stage_head, ("lm_head",), device, config.fsdp_config
            )
        if config.compile_decoder_layers:
            # After sharding, so that FSDP2's hooks run eagerly around each compiled layer.
            compile_decoder_layers(self.model)
        super().__init__(
            config.optim,
            total_steps,
            config.grad_clip,
            device,
            seed,
            offload_optimizer=config.fsdp_config.optimizer_offload,
        )
        self.policy_loss = get_policy_loss_fn(config.policy_loss)
        self.correction = correction
        # The entropy is computed only when it is part of the loss, as in verl's actor: as a
        # metric alone it would cost a softmax over the vocabulary at every response position
        # and its backward. `actor/entropy` is then not reported.
        self.with_entropy = config.entropy_coeff != 0
        # Full weights for the engines are gathered from the shards in buckets of this size.
        self.sync_bucket_bytes = rollout.update_weights_bucket_megabytes * 2**20
        if rollout.layered_summon:
            self.sync_bucket_bytes = min(self.sync_bucket_bytes, decoder_layer_bytes(self.model))
        # The engine loads the checkpoint's tensors, which some architectures (experts) fuse on load.
        self.checkpoint = CheckpointNames(self.model, self._model_specs())

    def _scores(self, batch: TrainBatch, with_entropy: bool, with_sum_pi_squared: bool = False) -> ResponseScores:
        with autocast(self.device):
            return response_scores(
                self.model,
                batch.input_ids,
                batch.attention_mask,
                batch.response_length,
                self.temperature,
                with_entropy,
                packed=self.packed,
                with_sum_pi_squared=with_sum_pi_squared,
                recompute=self.recompute,
            )

    def _log_probs(self, batch: TrainBatch, with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        scores = self._scores(batch, with_entropy)
        return scores.log_probs, scores.entropy

    def _stage_head(self) -> ResponseScoresHead:
        self.stage_head = ResponseScoresHead(self.model.lm_head, self.temperature, self.recompute)  # type: ignore[arg-type]
        return self.stage_head

    def _pipelined_scores(self, batch: TrainBatch, with_sum_pi_squared: bool) -> torch.Tensor:
        """[batch, response_length, SCORES] from the pipeline's last stage, on every stage."""
        assert self.pipeline is not None
        if self.stage_head is not None:
            self.stage_head.with_entropy, self.stage_head.with_sum_pi_squared = False, with_sum_pi_squared
        with autocast(self.device):
            return pipelined.forward(self.pipeline, batch, self.log_prob_batching.size, self.device, SCORES)

    @torch.no_grad()
    def compute_log_prob(self, batch: TrainBatch) -> torch.Tensor:
        """Log-probs of the sampled responses under the current policy (old_log_prob)."""
        self.model.eval()
        if self.pipeline is not None:
            return self.forward_only(batch, lambda whole: self._pipelined_scores(whole, False)[..., 0])
        return self.forward_only(
            batch,
            lambda whole: self.log_prob_batching.map(
                whole, lambda m: self._log_probs(m.to(self.device), False)[0].cpu()
            ),
        )

    @torch.no_grad()
    def compute_log_prob_and_sum_pi_squared(self, batch: TrainBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """The old log-probs and, from the same forward, each response position's sum over the
        vocabulary of pi^2 (verl's actor.calculate_sum_pi_squared; the optimal token baseline's
        path variance reads both)."""
        self.model.eval()
        if self.pipeline is not None:
            scores = self.forward_only(batch, lambda whole: self._pipelined_scores(whole, True))
            return scores[..., 0].contiguous(), scores[..., 2].contiguous()

        def both(micro: TrainBatch) -> torch.Tensor:
            scores = self._scores(micro.to(self.device), False, with_sum_pi_squared=True)
            assert scores.sum_pi_squared is not None
            return torch.stack([scores.log_probs, scores.sum_pi_squared], dim=-1).cpu()

        log_probs, sum_pi_squared = self.forward_only(
            batch, lambda whole: self.log_prob_batching.map(whole, both)
        ).unbind(dim=-1)
        return log_probs.contiguous(), sum_pi_squared.contiguous()

    def update(self, batch: TrainBatch) -> Metrics:
        """The PPO update; on GPU also verl's perf/max_memory_*_gb, the peaks during it."""
        on_gpu = self.device.type == "cuda"
        if on_gpu:
            torch.cuda.reset_peak_memory_stats(self.device)
        if self.stage_head is not None:
            self.stage_head.with_entropy, self.stage_head.with_sum_pi_squared = self.with_entropy, False
        metrics = super().update(batch)
        if on_gpu:
            metrics["perf/max_memory_allocated_gb"] = torch.cuda.max_memory_allocated(self.device) / 2**30
            metrics["perf/max_memory_reserved_gb"] = torch.cuda.max_memory_reserved(self.device) / 2**30
        return metrics

    def micro_batch_loss(self, micro: TrainBatch, scale: LossScale) -> tuple[torch.Tensor, Metrics]:
        log_prob, entropy = self._log_probs(micro, self.with_entropy)
        return actor_loss(self.config, self.policy_loss, micro, log_prob, entropy, scale, self.correction)

    def output_loss(self, micro: TrainBatch, output: torch.Tensor, scale: LossScale) -> tuple[torch.Tensor, Metrics]:
        entropy = output[..., 1] if self.with_entropy else None
        return actor_loss(self.config, self.policy_loss, micro, output[..., 0], entropy, scale, self.correction)

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The policy's full weights for the rollout engine (HF names; shards gathered a bucket
        of tensors at a time, rollout.updateWeightsBucketMegabytes: a collective over the
        actor's group when sharded)."""
        gathered = gather_full_tensors(self.model.state_dict().items(), self.sync_bucket_bytes, self.device)
        if self.pipeline is not None:  # each stage's rank holds its layers only
            gathered = pipelined.every_stage(self.pipeline, gathered, self.device)
        # With LoRA the engine gets the merged weights: W + (alpha / r) * B @ A, under W's name.
        merged = merged_weights(gathered, self.lora.scaling) if self.lora.enabled else gathered
        yield from self.checkpoint.tensors(merged)

    @property
    def whole_weights_only(self) -> bool:
        """Whether the rollout takes this policy's weights only whole, from `named_weights`: a
        LoRA weight is merged from the whole of B and A, and under a pipeline each rank holds
        only its stages' tensors, so no rank's shards tile the model's boxes alone; and a
        checkpoint tensor converted from the model's (an expert's projection cut from the fused
        ones) is no box of any rank's shard."""
        return self.lora.enabled or self.pipeline is not None or self.checkpoint.converts

    def _weight_items(self) -> list[tuple[str, torch.Tensor]]:
        """The state dict's tensors: every stage's (on the meta device) under a pipeline."""
        items = list(self.model.state_dict().items())
        return items if self.pipeline is None else pipelined.stage_specs(self.pipeline, items)

    def weight_names(self) -> list[str]:
        """The names `named_weights` yields, without gathering anything."""
        if self.checkpoint.converts:
            return self.checkpoint.names(self._model_specs())
        names = [name for name, _ in self._weight_items()]
        return merged_names(names) if self.lora.enabled else names

    def weight_specs(self) -> list[tuple[str, torch.Tensor]]:
        """(name, sharded tensor) of what `named_weights` yields, for their full shapes and
        dtypes (a merged weight has its base weight's; a converted one is a meta tensor of its
        checkpoint shape): nothing is gathered."""
        specs = self._model_specs()
        if not self.checkpoint.converts:
            return specs
        return list(self.checkpoint.tensors((name, meta_like(t)) for name, t in specs))

    def _model_specs(self) -> list[tuple[str, torch.Tensor]]:
        """(name, sharded tensor) of the model's own tensors as the engine takes them before any
        checkpoint conversion: LoRA's merged under their base weights' names."""
        items = self._weight_items()
        if not self.lora.enabled:
            return items
        names = set(merged_names(name for name, _ in items))
        return [(renamed, t) for name, t in items if (renamed := name.replace(BASE, ".")) in names]


def decoder_layer_bytes(model: nn.Module) -> int:
    """The bytes of the largest decoder layer's full tensors (rollout.layered_summon's bucket)."""
    sizes = [
        sum(p.numel() * p.element_size() for p in module.parameters())
        for module in model.modules()
        if type(module).__name__.endswith("DecoderLayer")
    ]
    return max(sizes, default=1)
