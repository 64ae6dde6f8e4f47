"""CEL rules across sections, on the trainer configuration as a whole: batch arithmetic over
the roles' ranks, token budgets, roles nothing uses, what the asynchronous modes need and what an
agent harness cannot run with."""

from __future__ import annotations

from rlkube_api.base import CelRule

# --- batch arithmetic across ranks, as verl normalises it ---------------------------------------
# A step has trainBatchSize × samplesPerPrompt samples; a mini-batch (one optimizer step) has
# ppoMiniBatchSize × samplesPerPrompt. Each of a role's data-parallel ranks (one per process: one
# per GPU, or one per pod without GPUs, whatever fsdpSize is) takes an equal share of every
# mini-batch and runs it in micro-batches of ppoMicroBatchSizePerGpu. A share that does not
# divide leaves ranks doing different numbers of collectives, and they hang until a timeout.
_N = "self.rollout.samplesPerPrompt"


def _world(role: str) -> str:
    return (
        f"(self.roles.{role}.replicas * (has(self.roles.{role}.gpusPerReplica) && "
        f"self.roles.{role}.gpusPerReplica > 0 ? self.roles.{role}.gpusPerReplica : 1))"
    )


_ACTOR_WORLD = _world("actor")
_ACTOR_MINI = f"(self.actor.ppoMiniBatchSize * {_N})"
# A critic colocated with the actor runs on the actor's ranks.
_CRITIC_WORLD = f"(has(self.roles.critic.colocateWith) ? {_ACTOR_WORLD} : {_world('critic')})"
_CRITIC_PROMPTS = "(has(self.critic.ppoMiniBatchSize) ? self.critic.ppoMiniBatchSize : self.actor.ppoMiniBatchSize)"
_CRITIC_MINI = f"({_CRITIC_PROMPTS} * {_N})"
_RANKS = "data-parallel ranks (replicas × gpusPerReplica, or replicas without GPUs)"

BATCH_SPLIT_RULES = (
    CelRule(
        f"{_ACTOR_MINI} % {_ACTOR_WORLD} == 0",
        f"the actor's mini-batch (ppoMiniBatchSize × rollout.samplesPerPrompt samples) must split evenly "
        f"over roles.actor's {_RANKS}",
        ".actor.ppoMiniBatchSize",
    ),
    CelRule(
        f"{_ACTOR_MINI} % {_ACTOR_WORLD} != 0 || ({_ACTOR_MINI} / {_ACTOR_WORLD}) % self.actor.ppoMicroBatchSizePerGpu == 0",
        "each actor rank's share of a mini-batch (ppoMiniBatchSize × rollout.samplesPerPrompt / data-parallel "
        "ranks) must be a multiple of ppoMicroBatchSizePerGpu",
        ".actor.ppoMicroBatchSizePerGpu",
    ),
    CelRule(
        f"!has(self.roles.critic) || self.data.trainBatchSize % {_CRITIC_PROMPTS} == 0",
        "critic.ppoMiniBatchSize (default: the actor's) must divide data.trainBatchSize",
        ".critic.ppoMiniBatchSize",
    ),
    CelRule(
        f"!has(self.roles.critic) || {_CRITIC_MINI} % {_CRITIC_WORLD} == 0",
        "the critic's mini-batch (critic.ppoMiniBatchSize, default the actor's, × rollout.samplesPerPrompt "
        f"samples) must split evenly over roles.critic's {_RANKS}; the actor's when colocated",
        ".critic.ppoMiniBatchSize",
    ),
    CelRule(
        f"!has(self.roles.critic) || {_CRITIC_MINI} % {_CRITIC_WORLD} != 0"
        f" || ({_CRITIC_MINI} / {_CRITIC_WORLD}) % self.critic.ppoMicroBatchSizePerGpu == 0",
        "each critic rank's share of a mini-batch must be a multiple of critic.ppoMicroBatchSizePerGpu",
        ".critic.ppoMicroBatchSizePerGpu",
    ),
)

# A dynamic micro-batch holds at least one sequence: every budget must fit the longest.
_LONGEST = "(self.data.maxPromptLength + self.data.maxResponseLength)"
_LONGEST_TEXT = "the longest sequence (data.maxPromptLength + data.maxResponseLength)"


def _budget_rule(use: str, budget: str, optional: bool = False) -> CelRule:
    present = f"!has({budget}) || " if optional else ""
    field = budget.removeprefix("self")
    return CelRule(
        f"!{use} || {present}{budget} >= {_LONGEST}",
        f"{field.lstrip('.')} must hold {_LONGEST_TEXT} when {use.removeprefix('self.')} is set",
        field,
    )


TOKEN_BUDGET_RULES = (
    _budget_rule("self.actor.useDynamicBsz", "self.actor.ppoMaxTokenLenPerGpu"),
    _budget_rule("self.actor.useDynamicBsz", "self.actor.logProbMaxTokenLenPerGpu", optional=True),
    _budget_rule("self.actor.useDynamicBsz", "self.ref.logProbMaxTokenLenPerGpu", optional=True),
    _budget_rule("self.critic.useDynamicBsz", "self.critic.ppoMaxTokenLenPerGpu"),
    _budget_rule("self.critic.useDynamicBsz", "self.critic.forwardMaxTokenLenPerGpu", optional=True),
)

# A role with pods of its own that the algorithm never calls would hold its nodes (GPUs) idle
# for the whole run.
ROLE_USE_RULES = (
    CelRule(
        "!has(self.roles.critic) || has(self.roles.critic.colocateWith) || self.algorithm.advEstimator == 'gae'",
        "roles.critic has pods of its own, but only algorithm.advEstimator gae uses a critic: they would sit idle",
        ".roles.critic",
    ),
    CelRule(
        "!has(self.roles.reference) || has(self.roles.reference.colocateWith)"
        " || self.actor.useKlLoss || self.algorithm.useKlInReward",
        "roles.reference has pods of its own, but only actor.useKlLoss or algorithm.useKlInReward use a "
        "reference policy: they would sit idle",
        ".roles.reference",
    ),
    CelRule(
        "!has(self.roles.reward) || has(self.roles.reward.colocateWith) || has(self.reward.model)",
        "roles.reward has pods of its own, but only reward.model runs there: they would sit idle",
        ".roles.reward",
    ),
)


_MODE = "self.trainer.v1.trainerMode"
# What the one-step-off schedule cannot honour yet is refused by name, never ignored.
ASYNC_RULES: tuple[CelRule, ...] = (
    CelRule(
        f"{_MODE} != 'separate_async' || self.roles.rollout.placement == 'separate'",
        "trainer.v1.trainerMode separate_async needs separate rollout pods (roles.rollout.placement: separate)",
        ".trainer.v1.trainerMode",
    ),
    CelRule(
        f"{_MODE} != 'colocate_async' || self.roles.rollout.placement == 'colocated'",
        "trainer.v1.trainerMode colocate_async needs roles.rollout.placement colocated (separate pods: separate_async)",
        ".trainer.v1.trainerMode",
    ),
    # Partial rollouts interrupt a generation for a weight push: only the asynchronous modes push
    # while one runs, and only the vLLM engine can be interrupted and resumed.
    CelRule(
        f"!self.asyncTraining.partialRollout || {_MODE} != 'sync'",
        "asyncTraining.partialRollout needs an asynchronous trainer.v1.trainerMode (colocate_async or "
        "separate_async): in sync no weight push happens during a generation",
        ".asyncTraining.partialRollout",
    ),
    CelRule(
        "!self.asyncTraining.partialRollout || self.rollout.name == 'vllm'",
        "asyncTraining.partialRollout needs rollout.name vllm (the hf engine cannot be interrupted)",
        ".asyncTraining.partialRollout",
    ),
    # A tensor-parallel engine's generation is a chain of collectives across its ranks: a rank
    # that also trains keeps it in call order with its other collectives (ray_group.py), where a
    # push cannot reach it until it ends.
    CelRule(
        "!self.asyncTraining.partialRollout || self.roles.rollout.placement == 'separate' || "
        "self.roles.rollout.tensorParallelSize == 1",
        "asyncTraining.partialRollout with roles.rollout.placement colocated needs roles.rollout.tensorParallelSize 1 "
        "(a colocated tensor-parallel generation cannot be paused for a weight push)",
        ".asyncTraining.partialRollout",
    ),
    CelRule(
        "!self.asyncTraining.partialRollout || !self.rollout.multiTurn.enable",
        "asyncTraining.partialRollout is not supported with rollout.multiTurn (an episode's turns would "
        "need resuming between tool calls)",
        ".asyncTraining.partialRollout",
    ),
    # A colocated engine put to sleep after each generation is woken by reloading the actor's
    # weights, which would then happen on the rollout thread while the actor updates them.
    CelRule(
        f"{_MODE} != 'colocate_async' || !has(self.rollout.freeCacheEngine) || !self.rollout.freeCacheEngine",
        "trainer.v1.trainerMode colocate_async needs rollout.freeCacheEngine false (the engine generates "
        "while the actor trains; unset, it is false in that mode)",
        ".rollout.freeCacheEngine",
    ),
)


_HARNESS = "!has(self.rollout.harness)"
# What a harness-driven rollout (rollout.harness) cannot honour, refused by name.
HARNESS_RULES: tuple[CelRule, ...] = (
    CelRule(
        f"{_HARNESS} || !self.rollout.multiTurn.enable",
        "rollout.harness and rollout.multiTurn are two ways of running episodes (a program of your own, or "
        "the trainer's tools): set one",
        ".rollout.harness",
    ),
    CelRule(
        f"{_HARNESS} || !self.asyncTraining.partialRollout",
        "asyncTraining.partialRollout is not supported with rollout.harness (a harness's calls cannot be "
        "paused and resumed across a weight push)",
        ".asyncTraining.partialRollout",
    ),
    # ReMax's baseline is one greedy episode per prompt; a lost one would leave its prompt's
    # samples without a baseline.
    CelRule(
        f"{_HARNESS} || self.algorithm.advEstimator != 'remax'",
        "algorithm.advEstimator remax is not supported with rollout.harness (its greedy baseline episode can be lost)",
        ".algorithm.advEstimator",
    ),
    CelRule(
        f"{_HARNESS} || self.rollout.harness.requireReward || has(self.reward.function) || "
        "has(self.reward.model) || has(self.reward.remote)",
        "rollout.harness.requireReward false needs reward.function, reward.model or reward.remote: without "
        "one, the score is the reward the harness reports",
        ".rollout.harness.requireReward",
    ),
)
