"""RLJob specs that must be refused, shared by the pydantic tests and the API-server
tests so both are held to the same verdict. Each case mutates a valid job and
names the field the error message must mention."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
Job = dict[str, Any]


def example(name: str) -> Job:
    data: Job = yaml.safe_load((EXAMPLES / name).read_text())
    return data


def base_job() -> Job:
    return example("gpu-multipool.yaml")


@dataclass(frozen=True)
class Case:
    id: str
    mutate: Callable[[Job], None]
    # Substrings the error must contain: the field's path as the server reports it.
    fields: tuple[str, ...]

    def job(self) -> Job:
        job = copy.deepcopy(base_job())
        self.mutate(job)
        return job


def _set(path: str, value: Any) -> Callable[[Job], None]:
    def mutate(job: Job) -> None:
        *parents, leaf = path.split(".")
        node = job
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value

    return mutate


def _delete(path: str) -> Callable[[Job], None]:
    def mutate(job: Job) -> None:
        *parents, leaf = path.split(".")
        node = job
        for p in parents:
            node = node[p]
        del node[leaf]

    return mutate


def _all(*mutations: Callable[[Job], None]) -> Callable[[Job], None]:
    def mutate(job: Job) -> None:
        for m in mutations:
            m(job)

    return mutate


# An asynchronous mode the base job can run (its rollout pods are separate).
_SEPARATE_ASYNC = (_set("spec.trainer.v1.trainerMode", "separate_async"), _set("spec.trainer.testFreq", -1))

# Multi-turn runs only with the rollout in the actor's pods (rljob.py says why).
_COLOCATED = _set("spec.roles.rollout", {"placement": "colocated"})

INVALID = [
    Case("colocated-rollout-replicas", _set("spec.roles.rollout", {"replicas": 3}), ("spec.roles.rollout.replicas",)),
    Case(
        "colocated-rollout-resources",
        _set("spec.roles.rollout", {"resources": {"cpu": "2"}}),
        ("spec.roles.rollout.resources",),
    ),
    Case("replicas-zero", _set("spec.roles.actor.replicas", 0), ("spec.roles.actor.replicas",)),
    Case("actor-missing", _delete("spec.roles.actor"), ("spec.roles.actor",)),
    # The image comes from the job or from the runtime it names.
    Case("image-missing-without-runtime", _delete("spec.image"), ("spec.image",)),
    Case(
        "runtime-ref-of-unknown-kind",
        _set("spec.runtimeRef", {"kind": "TrainingRuntime", "name": "gpu"}),
        ("spec.runtimeRef.kind",),
    ),
    Case(
        "tp-does-not-divide-gpus",
        _set("spec.roles.rollout.tensorParallelSize", 3),
        ("spec.roles.rollout.tensorParallelSize",),
    ),
    Case(
        "colocated-tp-does-not-divide-actor-gpus",
        _all(
            _delete("spec.roles.rollout"),
            _set("spec.roles.rollout", {"placement": "colocated", "tensorParallelSize": 3}),
        ),
        ("spec.roles.rollout.tensorParallelSize",),
    ),
    Case(
        "hf-engine-tensor-parallel",
        _all(_set("spec.rollout.name", "hf"), _set("spec.roles.rollout.tensorParallelSize", 2)),
        ("spec.roles.rollout.tensorParallelSize",),
    ),
    Case("fsdp-does-not-fit", _set("spec.roles.actor.fsdpSize", 5), ("spec.roles.actor.fsdpSize",)),
    # The actor of the base job: 2 pods × 8 GPUs, fsdpSize 16.
    Case(
        "model-parallel-does-not-divide-the-world",
        _all(_delete("spec.roles.actor.fsdpSize"), _set("spec.roles.actor.pipelineParallelSize", 3)),
        ("spec.roles.actor.tensorParallelSize", "must divide replicas × gpusPerReplica"),
    ),
    Case(
        "tensor-parallel-spans-nodes",
        _all(_delete("spec.roles.actor.fsdpSize"), _set("spec.roles.actor.tensorParallelSize", 16)),
        ("spec.roles.actor.tensorParallelSize", "must divide gpusPerReplica"),
    ),
    Case(
        "virtual-pipeline-without-pipeline",
        _set("spec.roles.actor.virtualPipelineParallelSize", 2),
        ("spec.roles.actor.virtualPipelineParallelSize",),
    ),
    Case(
        "fsdp-does-not-divide-the-data-parallel-ranks",
        _set("spec.roles.actor.tensorParallelSize", 2),
        ("spec.roles.actor.fsdpSize", "data-parallel ranks"),
    ),
    Case(
        "reward-model-tensor-parallel",
        _set("spec.roles.reward", {"colocateWith": "actor", "tensorParallelSize": 2}),
        ("spec.roles.reward.tensorParallelSize", "loaded whole on each rank"),
    ),
    Case(
        "colocated-role-with-a-layout-that-does-not-divide-the-actor",
        _set("spec.roles.reference.ulyssesSequenceParallelSize", 3),
        ("spec.roles.reference.tensorParallelSize", "must divide the actor's world size"),
    ),
    Case(
        "fit-names-and-states-the-model",
        _set(
            "spec.fit",
            {
                "modelArchitecture": "qwen2.5-7b",
                "modelDimensions": {
                    "numHiddenLayers": 2,
                    "hiddenSize": 64,
                    "intermediateSize": 128,
                    "numAttentionHeads": 2,
                    "vocabSize": 512,
                },
            },
        ),
        ("spec.fit.modelDimensions", "not both"),
    ),
    Case("fit-unknown-architecture", _set("spec.fit", {"modelArchitecture": "gpt-5"}), ("spec.fit.modelArchitecture",)),
    Case(
        "critic-pipeline-does-not-divide-its-world",
        _set("spec.roles.critic", {"replicas": 3, "gpusPerReplica": 2, "pipelineParallelSize": 4}),
        ("spec.roles.critic.tensorParallelSize", "must divide replicas × gpusPerReplica"),
    ),
    Case(
        "colocated-role-with-pool",
        _set("spec.roles.reference.pool", {"nodeSelector": {"a": "b"}}),
        ("spec.roles.reference.colocateWith",),
    ),
    Case(
        "colocated-role-with-gpus",
        _set("spec.roles.reference.gpusPerReplica", 1),
        ("spec.roles.reference.colocateWith",),
    ),
    Case("placement-unknown", _set("spec.roles.rollout.placement", "remote"), ("spec.roles.rollout.placement",)),
    Case(
        "colocated-rollout-with-pool",
        _set("spec.roles.rollout.placement", "colocated"),
        ("spec.roles.rollout.placement",),
    ),
    Case(
        "separate-rollout-without-gpus",
        _delete("spec.roles.rollout.gpusPerReplica"),
        ("spec.roles.rollout.gpusPerReplica",),
    ),
    Case("actor-without-gpus", _delete("spec.roles.actor.gpusPerReplica"), ("spec.roles.actor.gpusPerReplica",)),
    Case("name-too-long", _set("metadata.name", "a" * 42), ("metadata.name",)),
    Case("name-not-dns-label", _set("metadata.name", "9-grpo"), ("metadata.name",)),
    Case("adv-estimator-unknown", _set("spec.algorithm.advEstimator", "ppo2"), ("spec.algorithm.advEstimator",)),
    Case(
        "optimal-token-baseline-needs-the-actors-pass",
        _all(
            _set("spec.algorithm.advEstimator", "optimal_token_baseline"),
            _set("spec.algorithm.rolloutCorrection", {"bypassMode": True}),
        ),
        ("spec.algorithm.rolloutCorrection.bypassMode",),
    ),
    Case(
        "tir-optimal-token-baseline-needs-n-above-1",
        _all(
            _set("spec.algorithm.advEstimator", "tir_optimal_token_baseline"), _set("spec.rollout.samplesPerPrompt", 1)
        ),
        ("spec.rollout.samplesPerPrompt",),
    ),
    Case("gdpo-needs-reward-keys", _set("spec.algorithm.advEstimator", "gdpo"), ("spec.algorithm.gdpoRewardKeys",)),
    Case(
        "gdpo-weight-per-key",
        _all(
            _set("spec.algorithm.advEstimator", "gdpo"),
            _set("spec.algorithm.gdpoRewardKeys", ["format", "acc"]),
            _set("spec.algorithm.gdpoRewardWeights", [1.0]),
        ),
        ("spec.algorithm.gdpoRewardWeights",),
    ),
    Case("policy-loss-dro-needs-beta", _set("spec.actor.policyLoss", "dro"), ("spec.actor.droBeta",)),
    Case("loss-scale-factor-zero", _set("spec.actor.lossScaleFactor", 0), ("spec.actor.lossScaleFactor",)),
    Case(
        "grpo-passk-needs-n-above-1",
        _all(_set("spec.algorithm.advEstimator", "grpo_passk"), _set("spec.rollout.samplesPerPrompt", 1)),
        ("spec.rollout.samplesPerPrompt",),
    ),
    Case(
        "bypass-mode-replaces-the-policy-loss",
        _all(
            _set("spec.algorithm.rolloutCorrection", {"bypassMode": True}),
            _set("spec.actor.policyLoss", "cispo"),
        ),
        ("spec.actor.policyLoss",),
    ),
    Case("grpo-needs-n-above-1", _set("spec.rollout.samplesPerPrompt", 1), ("spec.rollout.samplesPerPrompt",)),
    Case("gae-needs-critic", _set("spec.algorithm.advEstimator", "gae"), ("spec.roles", "critic")),
    Case("clip-ratio-c-at-most-1", _set("spec.actor.clipRatioC", 1.0), ("spec.actor.clipRatioC",)),
    Case("train-files-empty", _set("spec.data.trainFiles", []), ("spec.data.trainFiles",)),
    Case(
        "gpu-memory-utilization-above-1",
        _set("spec.rollout.gpuMemoryUtilization", 1.5),
        ("spec.rollout.gpuMemoryUtilization",),
    ),
    Case(
        "mini-batch-does-not-divide-batch",
        _set("spec.actor.ppoMiniBatchSize", 100),
        ("spec.actor.ppoMiniBatchSize",),
    ),
    Case(
        "reward-function-and-model",
        _set("spec.reward.model", {"path": "/models/rm"}),
        ("spec.reward", "at most one of reward.function and reward.model"),
    ),
    Case(
        "reward-function-path-and-configmap",
        _set("spec.reward.function.path", "/rewards/gsm8k.py"),
        ("spec.reward.function", "exactly one of path and configMap"),
    ),
    Case(
        "reward-remote-and-function",
        _set("spec.reward.remote", {"url": "https://verifier.example/score"}),
        ("spec.reward.remote", "reward.remote replaces reward.function"),
    ),
    Case(
        "reward-remote-fields-without-url",
        _all(_delete("spec.reward.function"), _set("spec.reward.remote", {"timeoutSeconds": 5})),
        ("spec.reward.remote.url",),
    ),
    Case(
        "reward-remote-url-not-http",
        _all(_delete("spec.reward.function"), _set("spec.reward.remote", {"url": "ftp://verifier/score"})),
        ("spec.reward.remote.url",),
    ),
    Case(
        "reward-num-workers-with-a-reward-model",
        _all(
            _delete("spec.reward.function"),
            _set("spec.reward.model", {"path": "/models/rm"}),
            _set("spec.reward.numWorkers", 4),
        ),
        ("spec.reward.numWorkers",),
    ),
    Case(
        "reward-timeout-without-worker-processes",
        _all(_set("spec.reward.numWorkers", 0), _set("spec.reward.timeoutSeconds", 10)),
        ("spec.reward.timeoutSeconds", "cannot be stopped"),
    ),
    Case(
        "reward-secret-header-name",
        _all(
            _delete("spec.reward.function"),
            _set(
                "spec.reward.remote",
                {"url": "https://v/score", "secretHeaders": [{"header": "Bad Header", "secret": "t", "key": "k"}]},
            ),
        ),
        ("spec.reward.remote.secretHeaders", ".header"),
    ),
    Case("image-missing", _delete("spec.image"), ("spec.image",)),
    Case("resume-unknown", _set("spec.checkpoint.resume", "latest"), ("spec.checkpoint.resume",)),
    Case("unknown-field", _set("spec.algorithm.advEstimatr", "grpo"), ("advEstimatr",)),
    Case(
        "env-sets-a-rendezvous-variable",
        _set("spec.env", [{"name": "MASTER_PORT", "value": "1234"}]),
        ("spec.env", "MASTER_PORT"),
    ),
    Case("kl-loss-type-unknown", _set("spec.actor.klLossType", "k4"), ("spec.actor.klLossType",)),
    Case(
        "volume-name-used-by-the-operator",
        _set("spec.volumes", [{"name": "config", "mountPath": "/x", "source": {"emptyDir": {}}}]),
        ("spec.volumes", "name", "used by the operator"),
    ),
    Case(
        "volume-names-repeat",
        _set(
            "spec.volumes",
            [
                {"name": "models", "mountPath": "/a", "source": {"emptyDir": {}}},
                {"name": "models", "mountPath": "/b", "source": {"emptyDir": {}}},
            ],
        ),
        ("spec.volumes", "volume names must be unique"),
    ),
    Case(
        "volume-mount-path-relative",
        _set("spec.volumes", [{"name": "models", "mountPath": "models", "source": {"emptyDir": {}}}]),
        ("spec.volumes", "mountPath"),
    ),
    Case("actor-strategy-unknown", _set("spec.actor.strategy", "zero3"), ("spec.actor.strategy",)),
    Case(
        "reference-optimizer-offload",
        _set("spec.ref.fsdpConfig", {"optimizerOffload": True}),
        ("spec.ref.fsdpConfig.optimizerOffload", "the reference has no optimizer"),
    ),
    Case(
        "reference-mixed-precision",
        _set("spec.ref.fsdpConfig", {"mixedPrecision": {"paramDtype": "fp32"}}),
        ("spec.ref.fsdpConfig.mixedPrecision.paramDtype", "applies to actor and critic"),
    ),
    Case(
        "reference-model-dtype",
        _set("spec.ref.fsdpConfig", {"modelDtype": "bf16"}),
        ("spec.ref.fsdpConfig.modelDtype", "the reference has no master weights"),
    ),
    # "on"/"off" would be YAML 1.1 booleans in a trainer YAML: the values are always/never/auto.
    Case("recompute-logits-unknown", _set("spec.actor.recomputeLogits", "on"), ("spec.actor.recomputeLogits",)),
    Case(
        "critic-compile-not-a-bool",
        _set("spec.critic.compileDecoderLayers", "layers"),
        ("spec.critic.compileDecoderLayers",),
    ),
    Case(
        "reference-compile-differs-from-the-actor-with-lora",
        _all(_set("spec.model.loraRank", 8), _set("spec.ref.compileDecoderLayers", True)),
        ("spec.ref.compileDecoderLayers", "the reference is the actor's model"),
    ),
    # --- what pod creation would refuse: quantities, labels, tolerations, names --------------------
    Case(
        "memory-in-gigabytes",
        _set("spec.roles.actor.resources.memory", "900GB"),
        ("spec.roles.actor.resources.memory",),
    ),
    Case("cpu-negative", _set("spec.roles.rollout.resources.cpu", "-16"), ("spec.roles.rollout.resources.cpu",)),
    Case(
        "controller-cpu-not-a-quantity",
        _set("spec.controller.resources", {"cpu": "two"}),
        ("spec.controller.resources.cpu",),
    ),
    Case(
        "node-selector-key-not-a-label-key",
        _set("spec.roles.actor.pool.nodeSelector", {"rlkube.dev/pool name": "h100-train"}),
        ("spec.roles.actor.pool.nodeSelector", "label keys"),
    ),
    Case(
        "node-selector-value-not-a-label-value",
        _set("spec.roles.actor.pool.nodeSelector", {"rlkube.dev/pool": "h100 train"}),
        ("spec.roles.actor.pool.nodeSelector",),
    ),
    Case(
        "toleration-exists-with-value",
        _set("spec.roles.actor.pool.tolerations", [{"key": "nvidia.com/gpu", "operator": "Exists", "value": "true"}]),
        ("spec.roles.actor.pool.tolerations", "value must be empty when operator is Exists"),
    ),
    Case(
        "toleration-without-key-needs-exists",
        _set("spec.roles.actor.pool.tolerations", [{"operator": "Equal", "value": "true"}]),
        ("spec.roles.actor.pool.tolerations", "operator must be Exists when key is empty"),
    ),
    Case(
        "toleration-seconds-without-no-execute",
        _set(
            "spec.roles.actor.pool.tolerations",
            [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule", "tolerationSeconds": 60}],
        ),
        ("spec.roles.actor.pool.tolerations", "tolerationSeconds is only allowed with effect NoExecute"),
    ),
    Case(
        "toleration-key-not-a-label-key",
        _set("spec.roles.actor.pool.tolerations", [{"key": "nvidia.com/gpu/x", "operator": "Exists"}]),
        ("spec.roles.actor.pool.tolerations", "key must be a label key"),
    ),
    Case(
        "image-pull-secret-name",
        _set("spec.imagePullSecrets", [{"name": "Registry_Creds"}]),
        ("spec.imagePullSecrets",),
    ),
    Case("service-account-name", _set("spec.serviceAccountName", "trainer sa"), ("spec.serviceAccountName",)),
    Case(
        "reward-config-map-name",
        _set("spec.reward.function.configMap.name", "GSM8K_reward"),
        ("spec.reward.function.configMap.name",),
    ),
    Case(
        "reward-config-map-key",
        _set("spec.reward.function.configMap.key", "rewards/gsm8k.py"),
        ("spec.reward.function.configMap.key",),
    ),
    Case(
        "reward-config-map-key-dots",
        _set("spec.reward.function.configMap.key", "..gsm8k.py"),
        ("spec.reward.function.configMap", "'..'"),
    ),
    Case(
        "gang-priority-class",
        _set("spec.runPolicy.gang", {"scheduler": "volcano", "priorityClassName": "High"}),
        ("spec.runPolicy.gang.priorityClassName",),
    ),
    Case(
        "kueue-queue-longer-than-a-label-value",
        _set("spec.runPolicy.gang", {"scheduler": "kueue", "queue": "q" * 64}),
        ("spec.runPolicy.gang.queue", "at most 63 characters"),
    ),
    # --- podFailurePolicy ---------------------------------------------------------------------------
    Case(
        "failure-rule-with-both-matchers",
        _set(
            "spec.runPolicy.podFailurePolicy",
            {
                "rules": [
                    {
                        "action": "FailJob",
                        "onExitCodes": {"operator": "In", "values": [42]},
                        "onPodConditions": [{"type": "DisruptionTarget"}],
                    }
                ]
            },
        ),
        ("spec.runPolicy.podFailurePolicy.rules", "exactly one of onExitCodes and onPodConditions"),
    ),
    Case(
        "failure-rule-exit-code-zero",
        _set(
            "spec.runPolicy.podFailurePolicy",
            {"rules": [{"action": "FailJob", "onExitCodes": {"operator": "In", "values": [0, 1]}}]},
        ),
        ("spec.runPolicy.podFailurePolicy.rules", "must not contain 0"),
    ),
    Case(
        "failure-rule-exit-code-beyond-255",
        _set(
            "spec.runPolicy.podFailurePolicy",
            {"rules": [{"action": "Count", "onExitCodes": {"operator": "NotIn", "values": [256]}}]},
        ),
        ("spec.runPolicy.podFailurePolicy.rules",),
    ),
    Case(
        "failure-rule-unknown-action",
        _set(
            "spec.runPolicy.podFailurePolicy",
            {"rules": [{"action": "Retry", "onPodConditions": [{"type": "DisruptionTarget"}]}]},
        ),
        ("spec.runPolicy.podFailurePolicy.rules",),
    ),
    Case("env-name", _set("spec.env", [{"name": "NCCL DEBUG", "value": "INFO"}]), ("spec.env",)),
    # --- image references: a bad one fails only at pull ------------------------------------------------
    Case("image-upper-case", _set("spec.image", "Rlkube-Trainer:0.1.0"), ("spec.image", "image reference")),
    Case("image-trailing-space", _set("spec.image", "rlkube-trainer:0.1.0 "), ("spec.image", "image reference")),
    Case("image-two-tags", _set("spec.image", "rlkube-trainer:0.1:gpu"), ("spec.image", "image reference")),
    # --- in-pod paths -----------------------------------------------------------------------------------
    Case("model-path-relative", _set("spec.model.path", "models/qwen"), ("spec.model.path", "absolute")),
    Case("tokenizer-path-relative", _set("spec.model.tokenizerPath", "tok"), ("spec.model.tokenizerPath", "absolute")),
    Case(
        "train-file-relative",
        _set("spec.data.trainFiles", ["gsm8k/train.parquet"]),
        ("spec.data.trainFiles", "absolute"),
    ),
    Case("val-file-relative", _set("spec.data.valFiles", ["test.parquet"]), ("spec.data.valFiles", "absolute")),
    Case("checkpoint-dir-relative", _set("spec.checkpoint.dir", "checkpoints"), ("spec.checkpoint.dir", "absolute")),
    Case(
        "volume-on-an-operator-mount",
        _set("spec.volumes", [{"name": "etc", "mountPath": "/etc/rlkube", "source": {"emptyDir": {}}}]),
        ("spec.volumes", "may not be a path the operator mounts"),
    ),
    Case(
        "volume-on-the-checkpoint-dir",
        _set("spec.volumes", [{"name": "ckpt", "mountPath": "/checkpoints", "source": {"emptyDir": {}}}]),
        ("spec.volumes", "may not be a path the operator mounts"),
    ),
    # --- shared checkpoint storage ---------------------------------------------------------------------
    Case(
        "checkpoint-dir-in-each-pods-own-filesystem",
        _all(_delete("spec.checkpoint.volume"), _set("spec.checkpoint.dir", "/checkpoints")),
        ("spec.checkpoint.dir", "every pod shares"),
    ),
    Case(
        "checkpoint-dir-beside-a-volume",
        _all(_delete("spec.checkpoint.volume"), _set("spec.checkpoint.dir", "/data-checkpoints")),
        ("spec.checkpoint.dir", "every pod shares"),
    ),
    Case(
        "checkpoint-dir-on-a-read-only-volume",
        _all(_delete("spec.checkpoint.volume"), _set("spec.checkpoint.dir", "/data/checkpoints")),
        ("spec.checkpoint.dir", "every pod shares"),
    ),
    # --- periods ----------------------------------------------------------------------------------------
    Case("save-freq-zero", _set("spec.trainer.saveFreq", 0), ("spec.trainer.saveFreq", "-1")),
    Case("test-freq-zero", _set("spec.trainer.testFreq", 0), ("spec.trainer.testFreq", "-1")),
    Case(
        "separate-async-colocated",
        _all(
            _set("spec.trainer.v1.trainerMode", "separate_async"),
            _set("spec.trainer.testFreq", -1),
            _set("spec.roles.rollout", {"placement": "colocated"}),
        ),
        ("spec.trainer.v1.trainerMode", "separate rollout pods"),
    ),
    Case(
        "colocate-async-sleeping-engine",
        _all(
            _set("spec.trainer.v1.trainerMode", "colocate_async"),
            _set("spec.trainer.testFreq", -1),
            _set("spec.roles.rollout", {"placement": "colocated"}),
            _set("spec.rollout.freeCacheEngine", True),
        ),
        ("spec.rollout.freeCacheEngine", "colocate_async"),
    ),
    Case(
        "warmup-fractional",
        _set("spec.trainer.v1.colocateAsync.numWarmupBatches", 1.5),
        ("spec.trainer.v1.colocateAsync.numWarmupBatches",),
    ),
    Case(
        "off-policy-threshold-zero",
        _set("spec.trainer.v1.sampler.maxOffPolicyThreshold", 0),
        ("spec.trainer.v1.sampler.maxOffPolicyThreshold",),
    ),
    Case(
        "off-policy-strategy-unknown",
        _set("spec.trainer.v1.sampler.maxOffPolicyStrategy", "block"),
        ("spec.trainer.v1.sampler.maxOffPolicyStrategy",),
    ),
    # Partial rollouts (asyncTraining.partialRollout): each refusal's own reason.
    Case(
        "partial-rollout-in-sync",
        _set("spec.asyncTraining.partialRollout", True),
        ("spec.asyncTraining.partialRollout", "needs an asynchronous trainer.v1.trainerMode"),
    ),
    Case(
        "partial-rollout-with-hf",
        _all(
            _set("spec.asyncTraining.partialRollout", True),
            *_SEPARATE_ASYNC,
            _set("spec.rollout.name", "hf"),
            _set("spec.roles.rollout.tensorParallelSize", 1),
        ),
        ("spec.asyncTraining.partialRollout", "needs rollout.name vllm"),
    ),
    Case(
        "partial-rollout-with-multi-turn",
        _all(
            _set("spec.asyncTraining.partialRollout", True),
            *_SEPARATE_ASYNC,
            _set("spec.rollout.multiTurn", {"enable": True, "functionToolPath": "/tools/lookup.py"}),
        ),
        ("spec.asyncTraining.partialRollout", "not supported with rollout.multiTurn"),
    ),
    Case(
        "partial-rollout-colocated-tensor-parallel",
        _all(
            _set("spec.asyncTraining.partialRollout", True),
            _set("spec.trainer.v1.trainerMode", "colocate_async"),
            _set("spec.trainer.testFreq", -1),
            _set("spec.rollout.freeCacheEngine", False),
            _set("spec.roles.rollout", {"placement": "colocated", "tensorParallelSize": 2}),
        ),
        ("spec.asyncTraining.partialRollout", "tensorParallelSize 1"),
    ),
    Case("save-freq-below-minus-one", _set("spec.trainer.saveFreq", -2), ("spec.trainer.saveFreq",)),
    # --- roles without a use ----------------------------------------------------------------------------
    Case(
        "critic-pods-without-gae",
        _set("spec.roles.critic", {"replicas": 1, "gpusPerReplica": 8}),
        ("spec.roles.critic", "sit idle"),
    ),
    Case(
        "reference-pods-without-kl",
        _all(_set("spec.actor.useKlLoss", False), _set("spec.roles.reference", {"replicas": 1, "gpusPerReplica": 8})),
        ("spec.roles.reference", "sit idle"),
    ),
    Case(
        "reward-pods-without-a-model",
        _set("spec.roles.reward", {"replicas": 1, "gpusPerReplica": 1}),
        ("spec.roles.reward", "sit idle"),
    ),
    # --- batch arithmetic across ranks (16 actor ranks, 8 samples per prompt) ---------------------------
    Case(
        "actor-mini-batch-does-not-split-over-ranks",
        _all(_set("spec.data.trainBatchSize", 24), _set("spec.actor.ppoMiniBatchSize", 3)),
        ("spec.actor.ppoMiniBatchSize", "split evenly"),
    ),
    Case(
        "actor-rank-share-not-a-multiple-of-micro",
        _set("spec.actor.ppoMicroBatchSizePerGpu", 24),
        ("spec.actor.ppoMicroBatchSizePerGpu", "multiple of ppoMicroBatchSizePerGpu"),
    ),
    Case(
        "critic-mini-batch-does-not-divide-batch",
        _all(
            _set("spec.algorithm.advEstimator", "gae"),
            _set("spec.roles.critic", {"colocateWith": "actor"}),
            _set("spec.critic.ppoMiniBatchSize", 100),
        ),
        ("spec.critic.ppoMiniBatchSize", "must divide data.trainBatchSize"),
    ),
    Case(
        "critic-mini-batch-does-not-split-over-its-ranks",
        _all(
            _set("spec.algorithm.advEstimator", "gae"), _set("spec.roles.critic", {"replicas": 3, "gpusPerReplica": 1})
        ),
        ("spec.critic.ppoMiniBatchSize", "split evenly"),
    ),
    Case(
        "critic-rank-share-not-a-multiple-of-micro",
        _all(
            _set("spec.algorithm.advEstimator", "gae"),
            _set("spec.roles.critic", {"colocateWith": "actor"}),
            _set("spec.critic.ppoMicroBatchSizePerGpu", 24),
        ),
        ("spec.critic.ppoMicroBatchSizePerGpu", "multiple of critic.ppoMicroBatchSizePerGpu"),
    ),
    Case(
        "network-policy-metrics-namespace",
        _set("spec.networkPolicy", {"enabled": True, "metricsNamespace": "Monitoring"}),
        ("spec.networkPolicy.metricsNamespace",),
    ),
    # Found by the fuzz: the models coerced strings to numbers, the API server does not.
    Case("save-freq-a-string", _set("spec.trainer.saveFreq", "5"), ("spec.trainer.saveFreq",)),
    Case("kl-loss-a-string", _set("spec.actor.useKlLoss", "true"), ("spec.actor.useKlLoss",)),
    Case(
        "samples-per-prompt-a-boolean", _set("spec.rollout.samplesPerPrompt", True), ("spec.rollout.samplesPerPrompt",)
    ),
    # In Python `$` also matches before a final newline; in RE2 (the server's) it does not.
    Case(
        "node-selector-key-ends-in-a-newline",
        _set("spec.roles.actor.pool.nodeSelector", {"pool\n": "h100-train"}),
        ("spec.roles.actor.pool.nodeSelector",),
    ),
    Case("image-ends-in-a-newline", _set("spec.image", "rlkube-trainer:0.1.0\n"), ("spec.image",)),
    Case(
        "service-account-ends-in-a-newline", _set("spec.serviceAccountName", "trainer\n"), ("spec.serviceAccountName",)
    ),
    Case("train-batch-size-too-large", _set("spec.data.trainBatchSize", 2**40), ("spec.data.trainBatchSize",)),
    Case(
        "multi-turn-without-tools", _set("spec.rollout.multiTurn", {"enable": True}), ("spec.rollout.multiTurn.enable",)
    ),
    Case(
        "multi-turn-tools-while-disabled",
        _set("spec.rollout.multiTurn", {"functionToolPath": "/tools/lookup.py"}),
        ("spec.rollout.multiTurn.enable",),
    ),
    Case(
        "multi-turn-config-map-key-is-a-path",
        _all(
            _COLOCATED,
            _set(
                "spec.rollout.multiTurn",
                {"enable": True, "configMap": {"name": "agent-tools"}, "toolConfigPath": "/tools/tools.yaml"},
            ),
        ),
        ("spec.rollout.multiTurn.toolConfigPath",),
    ),
    Case(
        "multi-turn-relative-path-without-config-map",
        _all(_COLOCATED, _set("spec.rollout.multiTurn", {"enable": True, "interactionConfigPath": "i.yaml"})),
        ("spec.rollout.multiTurn.interactionConfigPath",),
    ),
    Case(
        "multi-turn-sandbox-while-disabled",
        _all(_COLOCATED, _set("spec.rollout.multiTurn", {"sandbox": {"cpuSeconds": 2}})),
        ("spec.rollout.multiTurn.enable",),
    ),
    Case(
        "multi-turn-sandbox-memory-too-small",
        _all(
            _COLOCATED,
            _set(
                "spec.rollout.multiTurn",
                {"enable": True, "toolConfigPath": "/t.yaml", "sandbox": {"memoryBytes": 1024}},
            ),
        ),
        ("spec.rollout.multiTurn.sandbox.memoryBytes",),
    ),
    Case(
        "multi-turn-format-not-hermes",
        _set("spec.rollout.multiTurn", {"enable": True, "functionToolPath": "/t.py", "format": "llama3_json"}),
        ("format",),
    ),
    # model.uri and data.uri (fetch_source.py): the uri, and the folder it fills on a writable volume.
    Case("model-uri-of-another-scheme", _set("spec.model.uri", "ftp://models/qwen"), ("spec.model.uri",)),
    Case("model-uri-on-a-read-only-volume", _set("spec.model.uri", "s3://models/qwen"), ("spec.model.path",)),
    Case("data-uri-without-dir", _set("spec.data.uri", "hf://openai/gsm8k"), ("spec.data.dir",)),
    Case(
        "data-files-outside-dir",
        _all(_set("spec.data.uri", "hf://openai/gsm8k@main"), _set("spec.data.dir", "/data/other")),
        ("spec.data.trainFiles",),
    ),
]

_SHARED_WORK = _set(
    "spec.volumes", [{"name": "work", "mountPath": "/work", "source": {"persistentVolumeClaim": {"claimName": "w"}}}]
)

# Specs at the edges of the rules above that both the API server and the models must accept.
VALID = [
    Case(
        "model-and-data-fetched-into-a-shared-volume",
        _all(
            _SHARED_WORK,
            _set("spec.model.path", "/work/models/qwen"),
            _set("spec.model.uri", "s3://models/qwen"),
            _set("spec.model.endpointUrl", "http://minio.storage:9000"),
            _set("spec.model.credentialsSecret", "models-s3"),
            _set("spec.data.uri", "hf://openai/gsm8k@refs/pr/1"),
            _set("spec.data.endpointUrl", "https://hub-mirror.internal"),
            _set("spec.data.dir", "/work/gsm8k"),
            _set("spec.data.trainFiles", ["/work/gsm8k/train.parquet"]),
            _set("spec.data.valFiles", ["/work/gsm8k/test.parquet"]),
        ),
        (),
    ),
    # The runtime gives the image and the volumes: the rules that need them wait for the merge
    # (runtime_merge.resolve, in the operator).
    Case(
        "runtime-gives-image-and-volumes",
        _all(_delete("spec.image"), _delete("spec.volumes"), _set("spec.runtimeRef", {"name": "gpu-platform"})),
        (),
    ),
    Case(
        "actor-tp2-pp2-interleaved",
        _all(
            _set("spec.roles.actor.tensorParallelSize", 2),
            _set("spec.roles.actor.pipelineParallelSize", 2),
            _set("spec.roles.actor.virtualPipelineParallelSize", 2),
            _set("spec.roles.actor.fsdpSize", 4),
        ),
        (),
    ),
    Case("fit-known-architecture", _set("spec.fit", {"modelArchitecture": "qwen2.5-7b", "gpuMemoryMiB": 81559}), ()),
    # Without GPUs each pod is one rank: tensor-parallel groups span pods.
    Case(
        "cpu-actor-tp2-sp2",
        _all(
            _set("spec.roles.actor", {"replicas": 4, "gpusPerReplica": 0, "tensorParallelSize": 2}),
            _set("spec.roles.actor.ulyssesSequenceParallelSize", 2),
        ),
        (),
    ),
    Case(
        "reward-function-in-worker-processes",
        _all(
            _set("spec.reward.numWorkers", 8),
            _set("spec.reward.timeoutSeconds", 30),
            _set("spec.reward.onFailure", "zero"),
        ),
        (),
    ),
    Case(
        "reward-remote-verifier",
        _all(
            _delete("spec.reward.function"),
            _set(
                "spec.reward.remote",
                {
                    "url": "https://verifier.example/score",
                    "headers": {"X-Task": "math"},
                    "secretHeaders": [{"header": "Authorization", "secret": "verifier-token", "key": "token"}],
                    "timeoutSeconds": 10,
                    "retries": 2,
                    "maxConcurrent": 32,
                },
            ),
        ),
        (),
    ),
    # Separate rollout pods: the base spec's placement (tests/e2e/test_agent_job.py runs such a job).
    Case(
        "multi-turn-on-separate-rollout-pods",
        _set("spec.rollout.multiTurn", {"enable": True, "functionToolPath": "/tools/lookup.py"}),
        (),
    ),
    Case(
        "multi-turn-with-function-tools",
        _all(
            _COLOCATED,
            _set("spec.rollout.multiTurn", {"enable": True, "functionToolPath": "/tools/lookup.py", "maxUserTurns": 2}),
        ),
        (),
    ),
    Case(
        "multi-turn-interaction-only",
        _all(_COLOCATED, _set("spec.rollout.multiTurn", {"enable": True, "interactionConfigPath": "/i.yaml"})),
        (),
    ),
    Case(
        "multi-turn-files-from-a-config-map-with-a-sandbox",
        _all(
            _COLOCATED,
            _set(
                "spec.rollout.multiTurn",
                {
                    "enable": True,
                    "configMap": {"name": "agent-tools"},
                    "toolConfigPath": "tools.yaml",
                    "interactionConfigPath": "interaction.yaml",
                    "sandbox": {"cpuSeconds": 2, "wallSeconds": 4.5, "memoryBytes": 268435456},
                },
            ),
        ),
        (),
    ),
    Case(
        "checkpoints-on-object-storage",
        _all(_delete("spec.checkpoint.volume"), _set("spec.checkpoint.uri", "s3://ckpt/run")),
        (),
    ),
    Case(
        "checkpoint-dir-under-a-shared-volume",
        _all(
            _delete("spec.checkpoint.volume"),
            _set(
                "spec.volumes",
                [{"name": "work", "mountPath": "/work/", "source": {"persistentVolumeClaim": {"claimName": "w"}}}],
            ),
            _set("spec.checkpoint.dir", "/work/checkpoints/run"),
        ),
        (),
    ),
    Case(
        "checkpoint-dir-on-a-shared-volume",
        _all(
            _delete("spec.checkpoint.volume"),
            _set(
                "spec.volumes",
                [{"name": "ckpt", "mountPath": "/ckpt", "source": {"persistentVolumeClaim": {"claimName": "c"}}}],
            ),
            _set("spec.checkpoint.dir", "/ckpt"),
        ),
        (),
    ),
    Case("memory-fraction-of-gibibytes", _set("spec.roles.actor.resources.memory", "1.5Gi"), ()),
    Case("cpu-exponent", _set("spec.roles.actor.resources.cpu", "1e2"), ()),
    Case("toleration-of-every-taint", _set("spec.roles.actor.pool.tolerations", [{"operator": "Exists"}]), ()),
    Case(
        "toleration-no-execute-seconds",
        _set(
            "spec.roles.actor.pool.tolerations",
            [
                {
                    "key": "node.kubernetes.io/unreachable",
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": 30,
                }
            ],
        ),
        (),
    ),
    Case("node-selector-key-without-prefix", _set("spec.roles.actor.pool.nodeSelector", {"pool": "H100_train.a"}), ()),
    Case("node-selector-empty-value", _set("spec.roles.actor.pool.nodeSelector", {"example.com/gpu": ""}), ()),
    Case(
        "image-with-registry-port-and-digest",
        _set("spec.image", "registry.example:5000/team/rlkube-trainer:0.1.0@sha256:" + "a" * 64),
        (),
    ),
    Case("image-without-tag", _set("spec.image", "ghcr.io/rlkube/trainer"), ()),
    Case("adv-estimator-opo", _set("spec.algorithm.advEstimator", "opo"), ()),
    # ReMax compares each sample with its prompt's greedy response, so one sample per prompt will do.
    Case(
        "adv-estimator-remax",
        _all(
            _set("spec.algorithm.advEstimator", "remax"),
            _set("spec.rollout.samplesPerPrompt", 1),
            _set("spec.actor.ppoMicroBatchSizePerGpu", 1),
            _set("spec.critic.ppoMicroBatchSizePerGpu", 1),
        ),
        (),
    ),
    Case("adv-estimator-optimal-token-baseline", _set("spec.algorithm.advEstimator", "optimal_token_baseline"), ()),
    Case(
        "adv-estimator-tir-optimal-token-baseline",
        _all(
            _set("spec.algorithm.advEstimator", "tir_optimal_token_baseline"),
            _set("spec.algorithm.rolloutCorrection", {"rolloutIs": "token", "rolloutIsThreshold": "2.0"}),
        ),
        (),
    ),
    Case(
        "gdpo-with-keys-and-weights",
        _all(
            _set("spec.algorithm.advEstimator", "gdpo"),
            _set("spec.algorithm.gdpoRewardKeys", ["format", "acc"]),
            _set("spec.algorithm.gdpoRewardWeights", [1.0, 2.0]),
        ),
        (),
    ),
    Case(
        "policy-loss-dro-with-beta",
        _all(_set("spec.actor.policyLoss", "dro"), _set("spec.actor.droBeta", 0.1)),
        (),
    ),
    Case(
        "token-sum-and-straight-through-kl",
        _all(_set("spec.actor.lossAggMode", "token-sum"), _set("spec.actor.klLossType", "k3+")),
        (),
    ),
    Case(
        "gae-with-a-colocated-critic",
        _all(_set("spec.algorithm.advEstimator", "gae"), _set("spec.roles.critic", {"colocateWith": "actor"})),
        (),
    ),
    Case(
        "gae-with-critic-pods-of-its-own",
        _all(
            _set("spec.algorithm.advEstimator", "gae"),
            _set("spec.roles.critic", {"replicas": 1, "gpusPerReplica": 8}),
            _set("spec.critic.ppoMicroBatchSizePerGpu", 64),
        ),
        (),
    ),
    Case("reference-colocated-without-kl", _set("spec.actor.useKlLoss", False), ()),
    # Unset, rollout.freeCacheEngine takes the mode's default (false in colocate_async).
    Case(
        "colocate-async-engine-default",
        _all(
            _set("spec.trainer.v1.trainerMode", "colocate_async"),
            _set("spec.roles.rollout", {"placement": "colocated"}),
            _set("spec.trainer.testFreq", -1),
        ),
        (),
    ),
    Case(
        "colocate-async",
        _all(
            _set("spec.trainer.v1.trainerMode", "colocate_async"),
            _set("spec.rollout.freeCacheEngine", False),
            _set("spec.roles.rollout", {"placement": "colocated"}),
            _set("spec.trainer.testFreq", -1),
        ),
        (),
    ),
    # Validation quiesces the schedule between updates (async_training/schedule.py).
    Case(
        "colocate-async-validation",
        _all(
            _set("spec.trainer.v1.trainerMode", "colocate_async"),
            _set("spec.rollout.freeCacheEngine", False),
            _set("spec.roles.rollout", {"placement": "colocated"}),
            _set("spec.trainer.testFreq", 5),
        ),
        (),
    ),
    Case(
        "separate-async",
        _all(_set("spec.trainer.v1.trainerMode", "separate_async"), _set("spec.trainer.testFreq", -1)),
        (),
    ),
    # A push pauses the generation in flight on the rollout ranks' own thread (ray_group.py).
    Case("separate-async-partial-rollout", _all(_set("spec.asyncTraining.partialRollout", True), *_SEPARATE_ASYNC), ()),
    Case(
        "colocate-async-partial-rollout",
        _all(
            _set("spec.asyncTraining.partialRollout", True),
            _set("spec.trainer.v1.trainerMode", "colocate_async"),
            _set("spec.trainer.testFreq", -1),
            _set("spec.rollout.freeCacheEngine", False),
            _set("spec.roles.rollout", {"placement": "colocated"}),
        ),
        (),
    ),
    Case("save-and-test-every-step", _all(_set("spec.trainer.saveFreq", 1), _set("spec.trainer.testFreq", 1)), ()),
    Case("gang-kueue", _set("spec.runPolicy.gang", {"scheduler": "kueue", "queue": "team-a"}), ()),
    Case(
        "failure-policy-rules",
        _set(
            "spec.runPolicy.podFailurePolicy",
            {
                "rules": [
                    {"action": "FailJob", "onExitCodes": {"operator": "In", "values": [42, 43]}},
                    {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
                    {"action": "Count", "onExitCodes": {"operator": "NotIn", "values": [0]}},
                ]
            },
        ),
        (),
    ),
]

# Changes refused on update: (id, mutation, field).
IMMUTABLE = [
    Case("model-path-changes", _set("spec.model.path", "/models/other"), ("spec.model",)),
    Case("actor-gpus-change", _set("spec.roles.actor.gpusPerReplica", 16), ("spec.roles.actor.gpusPerReplica",)),
    Case("actor-replicas-change", _set("spec.roles.actor.replicas", 4), ("spec.roles.actor.replicas",)),
    Case(
        "actor-tensor-parallel-changes",
        _all(_set("spec.roles.actor.tensorParallelSize", 2), _set("spec.roles.actor.fsdpSize", 8)),
        ("spec.roles.actor.tensorParallelSize", "is immutable"),
    ),
    Case(
        "network-policy-switched-off",
        _set("spec.networkPolicy", {"enabled": False}),
        ("spec.networkPolicy.enabled", "enabled is immutable"),
    ),
    Case(
        "rollout-placement-changes",
        _set("spec.roles.rollout", {"placement": "colocated"}),
        ("spec.roles.rollout.placement", "placement is immutable"),
    ),
]


# Elastic rollout capacity: rollout replicas change in place only with one-process
# engines, never under Kueue; tensorParallelSize never changes. (id, old, new, fields): no
# fields, the update is accepted.
@dataclass(frozen=True)
class Transition:
    id: str
    old: Callable[[Job], None]
    new: Callable[[Job], None]
    fields: tuple[str, ...]

    def jobs(self) -> tuple[Job, Job]:
        old, new = copy.deepcopy(base_job()), copy.deepcopy(base_job())
        self.old(old)
        self.new(new)
        return old, new


_TP1 = _set("spec.roles.rollout.tensorParallelSize", 1)
_KUEUE = _set("spec.runPolicy.gang", {"scheduler": "kueue", "queue": "team-a"})
_REPLICAS_MUST_STAY = "only with tensorParallelSize 1"

ROLLOUT_TRANSITIONS = [
    Transition("rollout-scales-up-with-tp1", _TP1, _all(_TP1, _set("spec.roles.rollout.replicas", 6)), ()),
    Transition("rollout-scales-down-with-tp1", _TP1, _all(_TP1, _set("spec.roles.rollout.replicas", 1)), ()),
    Transition(
        "rollout-replicas-change-with-tp2",
        _all(),
        _set("spec.roles.rollout.replicas", 6),
        ("spec.roles.rollout.replicas", _REPLICAS_MUST_STAY),
    ),
    Transition(
        "rollout-tp-changes",
        _all(),
        _TP1,
        ("spec.roles.rollout.tensorParallelSize", "tensorParallelSize is immutable"),
    ),
    Transition(
        "rollout-replicas-change-under-kueue",
        _all(_TP1, _KUEUE),
        _all(_TP1, _KUEUE, _set("spec.roles.rollout.replicas", 6)),
        ("spec.roles.rollout.replicas", "Kueue admits a pod group of a fixed size"),
    ),
    Transition(
        "other-changes-under-kueue",
        _all(_TP1, _KUEUE),
        _all(_TP1, _KUEUE, _set("spec.trainer.totalTrainingSteps", 1000)),
        (),
    ),
]
