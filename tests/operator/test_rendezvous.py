"""The environment of the trainer container: torch.distributed rendezvous per role
(MASTER_ADDR/PORT, WORLD_SIZE, torchrun's node rank and processes per node), the Ray
head, the actor → rollout weight-sync group (from rlkube_api.placement), and NCCL
defaults the user can override."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import yaml

from rlkube_api.names import LABEL_POD_INDEX, Env
from rlkube_api.validation import InvalidSpec, parse_rljob
from rlkube_operator.children.statefulset import NCCL_DEFAULTS
from tests.operator.helpers import CPU, GPU, UID, Mutation, Obj, children_of, load_job, set_path

GPU_JOB = "qwen-gsm8k-grpo"
COLOCATED_ROLLOUT = set_path("spec.roles.rollout", {"placement": "colocated", "tensorParallelSize": 2})
WEIGHT_SYNC_VARS = (
    Env.WEIGHT_SYNC_ADDR,
    Env.WEIGHT_SYNC_PORT,
    Env.WEIGHT_SYNC_WORLD_SIZE,
    Env.WEIGHT_SYNC_RANK_OFFSET,
)


def containers_by_role(*mutations: Mutation, example: str = GPU) -> dict[str, Obj]:
    job = load_job(example, *mutations)
    out: dict[str, Obj] = {}
    for child in children_of(job):
        if child["kind"] == "StatefulSet":
            role = child["metadata"]["labels"]["rlkube.dev/role"]
            out[role] = child["spec"]["template"]["spec"]["containers"][0]
    return out


def env_list(container: Obj) -> list[Obj]:
    env: list[Obj] = container["env"]
    return env


def env_values(container: Obj) -> dict[str, str]:
    return {e["name"]: e["value"] for e in env_list(container) if "value" in e}


def field_refs(container: Obj) -> dict[str, str]:
    return {
        e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"]
        for e in env_list(container)
        if "fieldRef" in e.get("valueFrom", {})
    }


# example, role, MASTER_ADDR, WORLD_SIZE, pods, PET_NPROC_PER_NODE
RENDEZVOUS = [
    pytest.param(
        GPU, "controller", f"{GPU_JOB}-controller-0.{GPU_JOB}-controller.ml.svc", 1, 1, 1, id="gpu-controller"
    ),
    pytest.param(GPU, "actor", f"{GPU_JOB}-actor-0.{GPU_JOB}-actor.ml.svc", 16, 2, 8, id="gpu-actor-2x8"),
    pytest.param(GPU, "rollout", f"{GPU_JOB}-rollout-0.{GPU_JOB}-rollout.ml.svc", 8, 4, 2, id="gpu-rollout-4x2"),
    pytest.param(CPU, "controller", "tiny-cpu-controller-0.tiny-cpu-controller.ml.svc", 1, 1, 1, id="cpu-controller"),
    pytest.param(CPU, "actor", "tiny-cpu-actor-0.tiny-cpu-actor.ml.svc", 2, 2, 1, id="cpu-actor-2x0"),
    pytest.param(CPU, "rollout", "tiny-cpu-rollout-0.tiny-cpu-rollout.ml.svc", 1, 1, 1, id="cpu-rollout-1x0"),
]


@pytest.mark.parametrize(("example", "role", "master", "world_size", "nnodes", "nproc"), RENDEZVOUS)
def test_rendezvous_env(example: str, role: str, master: str, world_size: int, nnodes: int, nproc: int) -> None:
    container = containers_by_role(example=example)[role]
    env = env_values(container)
    job = GPU_JOB if example == GPU else "tiny-cpu"
    assert env[Env.MASTER_ADDR] == master
    assert env[Env.MASTER_PORT] == "29500"
    assert env[Env.WORLD_SIZE] == str(world_size)
    assert env[Env.PET_NPROC_PER_NODE] == str(nproc)
    assert nnodes * int(env[Env.PET_NPROC_PER_NODE]) == int(env[Env.WORLD_SIZE])
    # The node rank is the StatefulSet pod's ordinal, read through the downward API.
    refs = field_refs(container)
    pod_index = f"metadata.labels['{LABEL_POD_INDEX}']"
    assert LABEL_POD_INDEX == "apps.kubernetes.io/pod-index"
    assert refs[Env.PET_NODE_RANK] == pod_index
    assert refs[Env.POD_NAME] == "metadata.name"
    assert refs[Env.NAMESPACE] == "metadata.namespace"
    assert refs[Env.POD_IP] == "status.podIP"
    # Every role finds the Ray head in the controller pod.
    assert env[Env.RAY_ADDRESS] == f"{job}-controller-0.{job}-controller.ml.svc:6379"
    assert env[Env.JOB_NAME] == job
    assert env[Env.JOB_UID] == UID  # the driver claims checkpoint.dir for this job (checkpoint/owner.py)
    assert env[Env.ROLE] == role


# mutations, example, role, expected weight-sync env (None: no variable at all)
WEIGHT_SYNC = [
    pytest.param([], GPU, "actor", ("actor", "24", "0"), id="gpu-actor-ranks-from-0"),
    pytest.param([], GPU, "rollout", ("actor", "24", "16"), id="gpu-rollout-ranks-after-the-actors"),
    pytest.param([], GPU, "controller", ("actor", "24", None), id="gpu-controller-knows-the-group"),
    pytest.param([], CPU, "actor", ("actor", "3", "0"), id="cpu-actor"),
    pytest.param([], CPU, "rollout", ("actor", "3", "2"), id="cpu-rollout"),
    pytest.param([COLOCATED_ROLLOUT], GPU, "actor", None, id="colocated-actor-none"),
    pytest.param([COLOCATED_ROLLOUT], GPU, "controller", None, id="colocated-controller-none"),
]


@pytest.mark.parametrize(("mutations", "example", "role", "expected"), WEIGHT_SYNC)
def test_weight_sync_env(
    mutations: list[Mutation], example: str, role: str, expected: tuple[str, str, str | None] | None
) -> None:
    container = containers_by_role(*mutations, example=example)[role]
    env = env_values(container)
    if expected is None:
        assert not set(WEIGHT_SYNC_VARS) & set(env)
        return
    addr_role, world_size, offset = expected
    job = GPU_JOB if example == GPU else "tiny-cpu"
    # Every actor rank sends its shards to every rollout worker: actor ranks + rollout ranks.
    assert env[Env.WEIGHT_SYNC_ADDR] == f"{job}-{addr_role}-0.{job}-{addr_role}.ml.svc"
    assert env[Env.WEIGHT_SYNC_PORT] == "29600"
    assert env[Env.WEIGHT_SYNC_WORLD_SIZE] == world_size
    assert env.get(Env.WEIGHT_SYNC_RANK_OFFSET) == offset
    if role in ("actor", "rollout"):
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert ports["weight-sync"] == 29600


@pytest.mark.parametrize("example", [GPU, CPU])
def test_env_names_are_unique_and_nccl_defaults_present(example: str) -> None:
    for role, container in containers_by_role(example=example).items():
        names = [e["name"] for e in env_list(container)]
        duplicates = [n for n, count in Counter(names).items() if count > 1]
        assert not duplicates, f"{role}: {duplicates}"
        env = env_values(container)
        for name, value in NCCL_DEFAULTS.items():
            assert env[name] == value, f"{role}: {name}"
        assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"  # a dead peer aborts instead of hanging
        assert env[Env.CONFIG] == "/etc/rlkube/config.yaml"


def test_spec_env_overrides_nccl_defaults_without_duplicates() -> None:
    user = [{"name": "NCCL_DEBUG", "value": "INFO"}, {"name": "NCCL_SOCKET_IFNAME", "value": "eth0"}]
    for role, container in containers_by_role(set_path("spec.env", user)).items():
        names = [e["name"] for e in env_list(container)]
        assert names.count("NCCL_DEBUG") == 1, role
        assert len(names) == len(set(names)), role
        env = env_values(container)
        assert env["NCCL_DEBUG"] == "INFO"
        assert env["NCCL_SOCKET_IFNAME"] == "eth0"
        assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == NCCL_DEFAULTS["TORCH_NCCL_ASYNC_ERROR_HANDLING"]


def test_spec_env_repeating_a_name_keeps_the_last_value() -> None:
    user = [{"name": "FOO", "value": "1"}, {"name": "FOO", "value": "2"}]
    for role, container in containers_by_role(set_path("spec.env", user)).items():
        assert [e["value"] for e in env_list(container) if e["name"] == "FOO"] == ["2"], role


@pytest.mark.parametrize("name", [Env.MASTER_PORT, Env.CONFIG])
def test_spec_env_naming_an_operator_variable_is_refused(name: str) -> None:
    """The env is a list-map keyed by name: a user entry for a variable the operator sets
    would be a duplicate key and break the StatefulSet's apply, so the API refuses it."""
    job = yaml.safe_load((Path(__file__).resolve().parents[2] / "examples" / "gpu-multipool.yaml").read_text())
    job["spec"]["env"] = [{"name": name, "value": "x"}]
    with pytest.raises(InvalidSpec, match=rf"spec\.env: .*{name}"):
        parse_rljob(job)


def test_every_variable_the_operator_injects_is_read_by_the_trainer() -> None:
    """No env variable is injected that nothing reads: each of rlkube's names the pods get
    is used (as `Env.<NAME>`) by the trainer's code, or by Ray itself (its token auth)."""
    read_by_ray = {Env.RAY_AUTH_MODE, Env.RAY_AUTH_TOKEN}
    trainer = Path(__file__).parents[2] / "trainer" / "rlkube_trainer"
    code = "\n".join(p.read_text() for p in trainer.rglob("*.py"))
    attribute = {value: name for name, value in vars(Env).items() if name.isupper()}
    injected = {
        e["name"]
        for mutations in ([], [COLOCATED_ROLLOUT])
        for container in containers_by_role(*mutations).values()
        for e in env_list(container)
        if e["name"] in attribute and e["name"] not in read_by_ray
    }
    unread = sorted(name for name in injected if f"Env.{attribute[name]}" not in code)
    assert not unread, f"injected but read nowhere in the trainer: {unread}"
