"""The trainer's configuration: model, data, algorithm, actor, critic, rollout,
reward, trainer and checkpoint sections, with verl's key names.

The same models are the sections of an RLJob's spec (camelCase there, e.g.
`advEstimator`) and of the trainer's YAML (verl's snake_case, e.g.
`adv_estimator`), so a recipe moves between `rlkube-trainer run` and a cluster
unchanged.

One module per section (the actor and the critic share `update.UpdateConfig`);
`trainer_config` joins them into `TrainerConfig`, with the rules that span sections in
`rules`. This face re-exports their public names.
"""

from rlkube_api.config.actor import ActorConfig, PolicyLoss, RecomputeLogits
from rlkube_api.config.algorithm import (
    ADV_ESTIMATORS,
    GROUP_ESTIMATORS,
    SUM_PI_SQUARED_ESTIMATORS,
    AdvEstimator,
    AlgorithmConfig,
    FilterGroupsConfig,
    KLControlConfig,
)
from rlkube_api.config.asynchronous import (
    AsyncTrainingConfig,
    ColocateAsyncConfig,
    SamplerConfig,
    SeparateAsyncConfig,
    TrainerV1Config,
)
from rlkube_api.config.checkpoint import OBJECT_STORE_SCHEMES, OBJECT_STORE_URL, CheckpointConfig
from rlkube_api.config.common import MAX_BATCH, MAX_TOKEN_BUDGET, FilePath, KLPenalty, LossAggMode, TokenBudget
from rlkube_api.config.critic import AppliedCriticConfig, CriticConfig, CriticOptimConfig
from rlkube_api.config.data import DataConfig
from rlkube_api.config.fsdp import COMPILE_DECODER_LAYERS, FSDPConfig, FSDPDtype, MixedPrecisionConfig, Strategy
from rlkube_api.config.harness import HarnessConfig
from rlkube_api.config.model import MAX_LORA_RANK, LoraModules, ModelConfig
from rlkube_api.config.multi_turn import AgentFilesConfigMap, MultiTurnConfig, SandboxConfig
from rlkube_api.config.optim import OptimConfig
from rlkube_api.config.reference import ReferenceConfig
from rlkube_api.config.reward import (
    ConfigMapKeyRef,
    OverlongBufferConfig,
    RemoteVerifierConfig,
    RewardConfig,
    RewardFunctionConfig,
    RewardModelConfig,
    SecretHeader,
)
from rlkube_api.config.rollout import RolloutConfig, ValidationSampling
from rlkube_api.config.rollout_correction import (
    ROLLOUT_RS_OPTIONS,
    THRESHOLD_PATTERN,
    RolloutCorrectionConfig,
    parse_rollout_is_threshold,
    parse_rollout_rs_options,
    parse_rollout_rs_thresholds,
)
from rlkube_api.config.rules import ASYNC_RULES, BATCH_SPLIT_RULES, HARNESS_RULES, ROLE_USE_RULES, TOKEN_BUDGET_RULES
from rlkube_api.config.trainer_config import TrainerConfig
from rlkube_api.config.trainer_section import Logger, TrainerSection
from rlkube_api.config.update import UpdateConfig

__all__ = [
    "ADV_ESTIMATORS",
    "ASYNC_RULES",
    "BATCH_SPLIT_RULES",
    "COMPILE_DECODER_LAYERS",
    "GROUP_ESTIMATORS",
    "HARNESS_RULES",
    "MAX_BATCH",
    "MAX_LORA_RANK",
    "MAX_TOKEN_BUDGET",
    "OBJECT_STORE_SCHEMES",
    "OBJECT_STORE_URL",
    "ROLE_USE_RULES",
    "ROLLOUT_RS_OPTIONS",
    "SUM_PI_SQUARED_ESTIMATORS",
    "THRESHOLD_PATTERN",
    "TOKEN_BUDGET_RULES",
    "ActorConfig",
    "AdvEstimator",
    "AgentFilesConfigMap",
    "AlgorithmConfig",
    "AppliedCriticConfig",
    "AsyncTrainingConfig",
    "CheckpointConfig",
    "ColocateAsyncConfig",
    "ConfigMapKeyRef",
    "CriticConfig",
    "CriticOptimConfig",
    "DataConfig",
    "FSDPConfig",
    "FSDPDtype",
    "FilePath",
    "FilterGroupsConfig",
    "HarnessConfig",
    "KLControlConfig",
    "KLPenalty",
    "Logger",
    "LoraModules",
    "LossAggMode",
    "MixedPrecisionConfig",
    "ModelConfig",
    "MultiTurnConfig",
    "OptimConfig",
    "OverlongBufferConfig",
    "PolicyLoss",
    "RecomputeLogits",
    "ReferenceConfig",
    "RemoteVerifierConfig",
    "RewardConfig",
    "RewardFunctionConfig",
    "RewardModelConfig",
    "RolloutConfig",
    "RolloutCorrectionConfig",
    "SamplerConfig",
    "SandboxConfig",
    "SecretHeader",
    "SeparateAsyncConfig",
    "Strategy",
    "TokenBudget",
    "TrainerConfig",
    "TrainerSection",
    "TrainerV1Config",
    "UpdateConfig",
    "ValidationSampling",
    "parse_rollout_is_threshold",
    "parse_rollout_rs_options",
    "parse_rollout_rs_thresholds",
]
