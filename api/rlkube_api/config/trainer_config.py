"""TrainerConfig: every section the trainer reads, and the rules that span them."""

from __future__ import annotations

from typing import ClassVar, Self

from pydantic import Field, model_validator

from rlkube_api.base import ApiModel, CelRule
from rlkube_api.config.actor import ActorConfig
from rlkube_api.config.algorithm import GROUP_ESTIMATORS, SUM_PI_SQUARED_ESTIMATORS, AlgorithmConfig
from rlkube_api.config.asynchronous import AsyncTrainingConfig
from rlkube_api.config.checkpoint import CheckpointConfig
from rlkube_api.config.critic import AppliedCriticConfig, CriticConfig
from rlkube_api.config.data import DataConfig
from rlkube_api.config.model import ModelConfig
from rlkube_api.config.reference import ReferenceConfig
from rlkube_api.config.reward import RewardConfig
from rlkube_api.config.rollout import RolloutConfig
from rlkube_api.config.rollout_correction import RolloutCorrectionConfig
from rlkube_api.config.rules import ASYNC_RULES, BATCH_SPLIT_RULES, HARNESS_RULES, ROLE_USE_RULES, TOKEN_BUDGET_RULES
from rlkube_api.config.trainer_section import TrainerSection
from rlkube_api.roles import Roles


class TrainerConfig(ApiModel):
    """Everything the trainer reads; loaded from YAML by `rlkube-trainer run`."""

    cel_rules: ClassVar[tuple[CelRule, ...]] = (
        CelRule(
            f"!(self.algorithm.advEstimator in {list(GROUP_ESTIMATORS)}) || self.rollout.samplesPerPrompt > 1",
            "rollout.samplesPerPrompt (verl: rollout.n) must be at least 2 for group estimators "
            f"({', '.join(GROUP_ESTIMATORS)})",
            ".rollout.samplesPerPrompt",
        ),
        CelRule(
            "!has(self.algorithm.rolloutCorrection) || !has(self.algorithm.rolloutCorrection.bypassMode) || "
            "!self.algorithm.rolloutCorrection.bypassMode || !has(self.actor) || !has(self.actor.policyLoss) || "
            "self.actor.policyLoss == 'vanilla'",
            "algorithm.rolloutCorrection.bypassMode replaces the policy loss with its own (ppo_clip or "
            "reinforce, rolloutCorrection.lossType): actor.policyLoss must be vanilla",
            ".actor.policyLoss",
        ),
        # verl's bypass mode takes the engine's log-probs as the old ones and skips the actor's pass,
        # the one that computes sum_pi_squared.
        CelRule(
            f"!(self.algorithm.advEstimator in {list(SUM_PI_SQUARED_ESTIMATORS)}) || "
            "!has(self.algorithm.rolloutCorrection) || !has(self.algorithm.rolloutCorrection.bypassMode) || "
            "!self.algorithm.rolloutCorrection.bypassMode",
            "algorithm.rolloutCorrection.bypassMode skips the actor's old log-prob pass, which computes the "
            f"sum of pi^2 that advEstimator {' and '.join(SUM_PI_SQUARED_ESTIMATORS)} need",
            ".algorithm.rolloutCorrection.bypassMode",
        ),
        CelRule(
            "self.algorithm.advEstimator != 'gae' || has(self.roles.critic)",
            "roles.critic is required when algorithm.advEstimator is gae",
            ".roles",
        ),
        CelRule(
            "self.data.trainBatchSize % self.actor.ppoMiniBatchSize == 0",
            "actor.ppoMiniBatchSize must divide data.trainBatchSize",
            ".actor.ppoMiniBatchSize",
        ),
        CelRule(
            "self.rollout.name != 'hf' || self.roles.rollout.tensorParallelSize == 1",
            "rollout.name hf runs one engine per process: roles.rollout.tensorParallelSize must be 1",
            ".roles.rollout.tensorParallelSize",
        ),
        *ASYNC_RULES,
        *HARNESS_RULES,
        CelRule(
            # Refused at admission: accepted, the job's pod would exit 1 at its first validation.
            "self.trainer.testFreq == -1 || (has(self.data.valFiles) && size(self.data.valFiles) > 0)",
            "trainer.testFreq needs data.valFiles (set testFreq to -1 to never validate)",
            ".trainer.testFreq",
        ),
        *BATCH_SPLIT_RULES,
        *TOKEN_BUDGET_RULES,
        *ROLE_USE_RULES,
        CelRule(
            "!has(self.model.loraRank) || self.model.loraRank == 0 || !has(self.roles.reference)"
            " || has(self.roles.reference.colocateWith)",
            "model.loraRank: with LoRA the reference is the actor's base model (adapters off), so "
            "roles.reference cannot have pods of its own",
            ".roles.reference",
        ),
        CelRule(
            "!has(self.model.loraRank) || self.model.loraRank == 0 || !has(self.ref) "
            "|| !has(self.ref.compileDecoderLayers) || self.ref.compileDecoderLayers == "
            "(has(self.actor) && has(self.actor.compileDecoderLayers) && self.actor.compileDecoderLayers)",
            "ref.compileDecoderLayers: with model.loraRank the reference is the actor's model, compiled as "
            "actor.compileDecoderLayers says",
            ".ref.compileDecoderLayers",
        ),
    )

    model: ModelConfig = Field(description="The policy model.")
    data: DataConfig = Field(description="Training data.")
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig, description="Advantage and KL.")
    actor: ActorConfig = Field(default_factory=ActorConfig, description="Policy update.")
    critic: CriticConfig = Field(default_factory=CriticConfig, description="Value update (gae).")
    ref: ReferenceConfig = Field(default_factory=ReferenceConfig, description="The reference policy (KL).")
    rollout: RolloutConfig = Field(default_factory=RolloutConfig, description="Generation.")
    reward: RewardConfig = Field(
        default_factory=RewardConfig, description="Scores (default: built-in scorers by data_source)."
    )
    trainer: TrainerSection = Field(default_factory=TrainerSection, description="Loop and logging.")
    async_training: AsyncTrainingConfig = Field(
        default_factory=AsyncTrainingConfig, description="Partial rollouts (asynchronous modes)."
    )
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig, description="Checkpoints.")
    roles: Roles = Field(description="Workers per role: replicas, GPUs, parallelism, placement.")

    @model_validator(mode="after")
    def _mode_defaults(self) -> Self:
        """Defaults that depend on the trainer mode, for the fields left unset: a colocated engine
        frees its memory while the actor trains (rollout.freeCacheEngine), except in
        colocate_async, where it generates meanwhile. An explicit value stays, and the mode's
        rules (rules.ASYNC_RULES) judge it."""
        if self.rollout.free_cache_engine is None:
            self.rollout.free_cache_engine = self.trainer.v1.trainer_mode != "colocate_async"
        return self

    @property
    def rollout_correction(self) -> RolloutCorrectionConfig:
        """algorithm.rollout_correction as it applies. In the asynchronous trainer modes every
        batch comes from older weights than the actor's, so an unset rollout_is means token-level
        TIS there (at rollout_is_threshold, 2.0 by default); in sync, unset means none."""
        correction = self.algorithm.rollout_correction
        if self.trainer.v1.trainer_mode == "sync" or correction.rollout_is is not None or correction.bypass_mode:
            return correction
        return correction.model_copy(update={"rollout_is": "token"})

    @property
    def critic_applied(self) -> AppliedCriticConfig:
        """The critic section as it applies: its backbone, mini-batch, epochs and packing default
        to the model's and the actor's where the job leaves them unset."""
        critic = self.critic
        return AppliedCriticConfig.model_validate(
            critic.model_dump()
            | {
                "model_path": critic.model_path or self.model.path,
                "ppo_mini_batch_size": critic.ppo_mini_batch_size or self.actor.ppo_mini_batch_size,
                "ppo_epochs": critic.ppo_epochs or self.actor.ppo_epochs,
                "use_remove_padding": self.model.use_remove_padding
                if critic.use_remove_padding is None
                else critic.use_remove_padding,
            }
        )
