"""Hypothesis strategies for RLJobs, valid and invalid: one of the examples (on volumes the
test cluster has, and a short pending timeout) with a few of the mistakes users make, each
drawn from values on both sides of a rule: quantities, label keys and values, tolerations,
names, images, paths, periods, roles and their use, batch arithmetic across ranks, types.

No oracle: the test holds the API server and the models to the same verdict, so a strategy
only has to reach both sides of every rule often, not know which side it is on."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from hypothesis import strategies as st

from tests.api.cases import example

Obj = dict[str, Any]
Draw = Callable[[st.SearchStrategy[Any]], Any]
Mutation = Callable[[Obj, Draw], None]

# The test cluster's pools (e2e/pools.yaml): jobs that fit are Running, the rest Unschedulable.
PENDING_TIMEOUT_SECONDS = 3
EMPTY_DIR: Obj = {"emptyDir": {}}


def _cpu_base() -> Obj:
    job = example("tiny-cpu.yaml")
    job["spec"]["volumes"][0]["source"] = EMPTY_DIR
    return job


def _gpu_base() -> Obj:
    job = example("gpu-multipool.yaml")
    for volume in job["spec"]["volumes"]:
        volume["source"] = EMPTY_DIR
    job["spec"]["checkpoint"]["volume"] = EMPTY_DIR
    return job


BASES = {"cpu": _cpu_base(), "gpu": _gpu_base()}


def _node(job: Obj, path: str) -> Obj:
    node = job
    for part in path.split("."):
        node = node.setdefault(part, {})
    return node


def _set(job: Obj, path: str, value: Any) -> None:
    *parents, leaf = path.split(".")
    parent = _node(job, ".".join(parents)) if parents else job
    if value is None:
        parent.pop(leaf, None)
    else:
        parent[leaf] = copy.deepcopy(value)  # values are shared between examples; later mutations edit in place


def _choose(path: str, values: list[Any]) -> Mutation:
    """Sets `path` to one of `values` (None removes it)."""

    def mutate(job: Obj, draw: Draw) -> None:
        _set(job, path, draw(st.sampled_from(values)))

    return mutate


QUANTITIES = ["8", "500m", "0.5", "1.5Gi", "64Gi", "100M", "1e3", "2Ki", "0", "-1", "64GB", "two", "1.5.5", " 8", "1K"]
LABEL_KEYS = ["rlkube.dev/pool", "pool", "example.com/gpu-type", "bad key", "a/b/c", "-pool", "x" * 64, "UPPER.dev/x"]
LABEL_VALUES = ["h100-train", "l40s-infer", "cpu", "", "H100_x.y", "bad value", "-x", "y" * 64]
NAMES = ["models", "team-a.creds", "Bad_Name", "a" * 254, "-x", "ok-1"]
# The valid ones, for the test to create as ServiceAccounts: pods naming a ServiceAccount that
# does not exist are never created (see test_fuzz.py's findings).
SERVICE_ACCOUNTS = ["models", "team-a.creds", "ok-1"]
# The ConfigMaps and Secrets the valid specs name, for the test to create: pods naming one
# that does not exist are never created (the job waits, then fails MissingReference).
CONFIG_MAPS = ["tiny-reward", "gsm8k-reward"]
SECRETS = ["regcred"]
IMAGES = [
    "rlkube-trainer:dev",
    "ghcr.io/rlkube/trainer:0.1.0",
    "registry.example:5000/team/trainer@sha256:" + "a" * 64,
    "localhost/trainer",
    "Rlkube-Trainer:1",
    "trainer:1.0 ",
    "trainer:a:b",
    "trainer@sha256:short",
    ":latest",
]
PATHS = ["/rlkube/tiny/model", "/models/x", "relative/model", "model", "./model"]
PERIODS = [-2, -1, 0, 1, 5, 20]


@st.composite
def tolerations(draw: Draw) -> list[Obj]:
    out = []
    for _ in range(draw(st.integers(0, 2))):
        toleration: Obj = {}
        for key, values in (
            ("key", ["nvidia.com/gpu", "", "bad key", "example.com/x"]),
            ("operator", ["Exists", "Equal", "In"]),
            ("value", ["", "true", "bad value"]),
            ("effect", ["NoSchedule", "NoExecute", "PreferNoSchedule", "Sometimes"]),
            ("tolerationSeconds", [30, 0]),
        ):
            if draw(st.booleans()):
                toleration[key] = draw(st.sampled_from(values))
        out.append(toleration)
    return out


def _pool(role: str) -> Mutation:
    def mutate(job: Obj, draw: Draw) -> None:
        pool: Obj = {}
        if draw(st.booleans()):
            pool["nodeSelector"] = {draw(st.sampled_from(LABEL_KEYS)): draw(st.sampled_from(LABEL_VALUES))}
        if draw(st.booleans()):
            pool["tolerations"] = draw(tolerations())
        _set(job, f"spec.roles.{role}.pool", pool)

    return mutate


def _resources(path: str) -> Mutation:
    def mutate(job: Obj, draw: Draw) -> None:
        resources = {k: draw(st.sampled_from(QUANTITIES)) for k in ("cpu", "memory") if draw(st.booleans())}
        _set(job, path, resources)

    return mutate


def _role(name: str) -> Mutation:
    """critic, reference or reward: absent, colocated with the actor, or pods of its own."""

    def mutate(job: Obj, draw: Draw) -> None:
        shape = draw(st.sampled_from(["absent", "colocated", "pods"]))
        if shape == "absent":
            _set(job, f"spec.roles.{name}", None)
        elif shape == "colocated":
            _set(job, f"spec.roles.{name}", {"colocateWith": "actor"})
        else:
            replicas = draw(st.sampled_from([1, 2, 3]))
            _set(
                job, f"spec.roles.{name}", {"replicas": replicas, "gpusPerReplica": draw(st.sampled_from([0, 1, 4, 8]))}
            )

    return mutate


def _reward_model(job: Obj, draw: Draw) -> None:
    if draw(st.booleans()):
        _set(job, "spec.reward", {"model": {"path": draw(st.sampled_from(["/models/rm", "rm"]))}})


def _volumes(job: Obj, draw: Draw) -> None:
    volumes = job["spec"].setdefault("volumes", [])
    name = draw(st.sampled_from(["extra", "config", "Bad", "work"]))
    mount = draw(st.sampled_from(["/extra", "/etc/rlkube", "/dev/shm", "extra", "/checkpoints", "/rlkube"]))
    volumes.append({"name": name, "mountPath": mount, "source": EMPTY_DIR})


def _env(job: Obj, draw: Draw) -> None:
    name = draw(st.sampled_from(["NCCL_DEBUG", "MY_VAR", "MY VAR", "1ABC", "MASTER_PORT", "RLKUBE_RAY_START_ARGS"]))
    _set(job, "spec.env", [{"name": name, "value": "x"}])


def _type_confusion(job: Obj, draw: Draw) -> None:
    path, value = draw(
        st.sampled_from(
            [
                ("spec.roles.actor.replicas", "two"),
                ("spec.trainer.saveFreq", "5"),
                ("spec.data.trainBatchSize", 3.5),
                ("spec.roles.actor.resources", {"memory": 64}),
                ("spec.rollout.samplesPerPrompt", True),
                ("spec.algorithm.advEstimatr", "grpo"),
                ("spec.data.trainFiles", "/data/train.parquet"),
            ]
        )
    )
    _set(job, path, value)


MUTATIONS: list[Mutation] = [
    _resources("spec.roles.actor.resources"),
    _resources("spec.controller.resources"),
    _pool("actor"),
    _pool("rollout"),
    _choose("spec.image", IMAGES),
    _choose("spec.imagePullSecrets", [None, [{"name": "regcred"}], [{"name": "Reg_Cred"}]]),
    _choose("spec.serviceAccountName", [None, *NAMES]),
    _choose("spec.model.path", PATHS),
    _choose("spec.model.tokenizerPath", [None, *PATHS]),
    _choose("spec.data.trainFiles", [["/rlkube/tiny/data/train.parquet"], ["train.parquet"], []]),
    _choose("spec.checkpoint.dir", ["/rlkube/checkpoints/x", "checkpoints", "/etc/rlkube"]),
    _choose("spec.trainer.saveFreq", PERIODS),
    _choose("spec.trainer.testFreq", PERIODS),
    _choose("spec.algorithm.advEstimator", ["grpo", "gae", "rloo", "reinforce_plus_plus", "ppo2"]),
    _choose("spec.actor.useKlLoss", [True, False]),
    _choose("spec.algorithm.useKlInReward", [True, False]),
    _role("critic"),
    _role("reference"),
    _role("reward"),
    _reward_model,
    _choose("spec.data.trainBatchSize", [1, 8, 16, 24, 32, 64, 256]),
    _choose("spec.actor.ppoMiniBatchSize", [1, 2, 3, 4, 8, 16, 64]),
    _choose("spec.actor.ppoMicroBatchSizePerGpu", [1, 2, 4, 8, 16, 24, 64]),
    _choose("spec.critic.ppoMiniBatchSize", [None, 2, 4, 8, 16]),
    _choose("spec.critic.ppoMicroBatchSizePerGpu", [1, 4, 8, 16, 24]),
    _choose("spec.rollout.samplesPerPrompt", [1, 2, 3, 4, 8]),
    _choose("spec.roles.actor.replicas", [1, 2, 3, 4]),
    _choose("spec.roles.actor.gpusPerReplica", [0, 1, 2, 8, 16]),
    _choose("spec.roles.actor.fsdpSize", [None, 1, 2, 4, 5, 16]),
    _choose(
        "spec.roles.rollout",
        [
            {"placement": "colocated"},
            {"placement": "colocated", "tensorParallelSize": 2},
            {"placement": "separate", "replicas": 1, "gpusPerReplica": 0},
            {"placement": "separate", "replicas": 2, "gpusPerReplica": 2, "tensorParallelSize": 2},
            {"placement": "separate", "replicas": 1, "gpusPerReplica": 4, "tensorParallelSize": 3},
        ],
    ),
    _choose(
        "spec.reward.function.configMap", [{"name": "tiny-reward", "key": "reward.py"}, {"name": "R", "key": "a/b"}]
    ),
    _volumes,
    _env,
    _choose("spec.networkPolicy", [None, {"enabled": True}, {"enabled": True, "metricsNamespace": "Prom"}]),
    _choose("spec.runPolicy.backoffLimit", [0, 2, -1]),
    _choose("spec.runPolicy.activeDeadlineSeconds", [None, 0, 2, 3600]),
    _choose("spec.suspend", [False, True]),
    _type_confusion,
]


@st.composite
def rljobs(draw: Draw) -> Obj:
    """An RLJob (metadata.name left to the caller) with up to four mutations of a base."""
    job = copy.deepcopy(BASES[draw(st.sampled_from(sorted(BASES)))])
    job["spec"].setdefault("runPolicy", {})["pendingTimeoutSeconds"] = PENDING_TIMEOUT_SECONDS
    for mutation in draw(st.lists(st.sampled_from(MUTATIONS), min_size=0, max_size=4)):
        mutation(job, draw)
    return job
