"""desired_children(): the ConfigMap, headless Services and StatefulSets built from an
RLJob. Pure builders, so every test is a table of jobs and the manifests they must give."""

from __future__ import annotations

import posixpath
from typing import Any

import pytest
import yaml

from rlkube_api.names import (
    AGENT_DIR,
    ANNOTATION_ATTEMPT,
    CONFIG_FILE,
    LABEL_JOB,
    LABEL_MANAGED_BY,
    LABEL_ROLE,
    MANAGED_BY,
    NODE_HEALTH_PORT,
    REWARD_DIR,
    SHM_DIR,
    Env,
)
from rlkube_api.rljob import RLJob
from rlkube_api.validation import parse_trainer_config
from rlkube_operator.children.configmap import trainer_config
from tests.operator.helpers import CPU, GPU, NAMESPACE, UID, Mutation, Obj, children_of, load_job, set_path

GPU_RESOURCE = "nvidia.com/gpu"

COLOCATED_ROLLOUT = set_path("spec.roles.rollout", {"placement": "colocated", "tensorParallelSize": 2})
SEPARATE_CRITIC_AND_REFERENCE = [
    set_path("spec.algorithm.advEstimator", "gae"),  # only gae uses a critic
    set_path("spec.roles.critic", {"replicas": 1, "gpusPerReplica": 8}),
    set_path("spec.roles.reference", {"replicas": 2, "gpusPerReplica": 4}),
]
COLOCATED_CRITIC = set_path("spec.roles.critic", {"colocateWith": "actor"})
SEPARATE_REWARD = [  # the reward role runs a reward model
    set_path("spec.reward", {"model": {"path": "/rlkube/reward-model"}}),
    set_path("spec.roles.reward", {"replicas": 1, "gpusPerReplica": 0}),
]


def by_kind(children: list[Obj], kind: str) -> dict[str, Obj]:
    """Children of one kind keyed by role (StatefulSet, Service) or name."""
    out: dict[str, Obj] = {}
    for child in children:
        if child["kind"] == kind:
            meta = child["metadata"]
            out[meta["labels"].get(LABEL_ROLE, meta["name"])] = child
    return out


def stateful_set(job: RLJob, role: str, **kwargs: Any) -> Obj:
    return by_kind(children_of(job, **kwargs), "StatefulSet")[role]


def pod_spec(sts: Obj) -> Obj:
    spec: Obj = sts["spec"]["template"]["spec"]
    return spec


def container(sts: Obj) -> Obj:
    containers = pod_spec(sts)["containers"]
    assert len(containers) == 1
    c: Obj = containers[0]
    return c


def env_values(sts: Obj) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container(sts)["env"] if "value" in e}


def mount_for(sts: Obj, volume: str) -> Obj:
    mounts = [m for m in container(sts)["volumeMounts"] if m["name"] == volume]
    assert len(mounts) == 1, f"volume {volume} mounted {len(mounts)} times"
    m: Obj = mounts[0]
    return m


def volume(sts: Obj, name: str) -> Obj:
    volumes = [v for v in pod_spec(sts)["volumes"] if v["name"] == name]
    assert len(volumes) == 1, f"volume {name} defined {len(volumes)} times"
    v: Obj = volumes[0]
    return v


# --- which children -----------------------------------------------------------------------------

CHILD_SETS = [
    pytest.param(GPU, [], ["controller", "actor", "rollout"], id="gpu-separate-rollout-colocated-reference"),
    pytest.param(CPU, [], ["controller", "actor", "rollout"], id="tiny-cpu"),
    pytest.param(GPU, [COLOCATED_ROLLOUT], ["controller", "actor"], id="gpu-colocated-rollout"),
    pytest.param(
        GPU,
        SEPARATE_CRITIC_AND_REFERENCE,
        ["controller", "actor", "critic", "reference", "rollout"],
        id="gpu-separate-critic-and-reference",
    ),
    pytest.param(GPU, [COLOCATED_CRITIC], ["controller", "actor", "rollout"], id="gpu-colocated-critic"),
    pytest.param(CPU, SEPARATE_REWARD, ["controller", "actor", "reward", "rollout"], id="cpu-separate-reward"),
]


@pytest.mark.parametrize(("example", "mutations", "roles"), CHILD_SETS)
@pytest.mark.parametrize("pods_wanted", [True, False], ids=["running", "scaled-down"])
def test_children_per_job(example: str, mutations: list[Mutation], roles: list[str], pods_wanted: bool) -> None:
    job = load_job(example, *mutations)
    name = job.metadata.name
    children = children_of(job, pods_wanted=pods_wanted)
    got = [(c["kind"], c["metadata"]["name"]) for c in children]
    expected = [
        ("ConfigMap", f"{name}-config"),
        ("ConfigMap", f"{name}-exits"),
        ("Secret", f"{name}-ray"),
        ("ServiceAccount", f"{name}-trainer"),
        ("Role", f"{name}-progress"),
        ("RoleBinding", f"{name}-progress"),
        ("NetworkPolicy", f"{name}-network"),
    ]
    expected += [("Service", f"{name}-{r}") for r in roles]
    expected += [("StatefulSet", f"{name}-{r}") for r in roles]
    assert sorted(got) == sorted(expected)  # also: no duplicates, no PodGroup without a gang
    # The controller comes first (the Ray head the other roles join).
    assert [c["metadata"]["labels"][LABEL_ROLE] for c in children if c["kind"] == "StatefulSet"] == roles


@pytest.mark.parametrize(("example", "mutations", "roles"), CHILD_SETS)
def test_every_child_is_owned_and_labelled(example: str, mutations: list[Mutation], roles: list[str]) -> None:
    job = load_job(example, *mutations)
    name = job.metadata.name
    owner = {
        "apiVersion": "rlkube.dev/v1alpha1",
        "kind": "RLJob",
        "name": name,
        "uid": UID,
        "controller": True,
        "blockOwnerDeletion": True,
    }
    for child in children_of(job):
        meta = child["metadata"]
        assert meta["ownerReferences"] == [owner], meta["name"]
        assert meta["namespace"] == NAMESPACE, meta["name"]
        assert meta["labels"][LABEL_JOB] == name, meta["name"]
        assert meta["labels"][LABEL_MANAGED_BY] == MANAGED_BY, meta["name"]
        if child["kind"] in ("StatefulSet", "Service"):
            assert meta["name"] == f"{name}-{meta['labels'][LABEL_ROLE]}"
            assert meta["labels"][LABEL_ROLE] in roles


@pytest.mark.parametrize(("example", "mutations", "roles"), CHILD_SETS)
def test_services_are_headless_and_publish_not_ready(example: str, mutations: list[Mutation], roles: list[str]) -> None:
    job = load_job(example, *mutations)
    children = children_of(job)
    services = by_kind(children, "Service")
    sets = by_kind(children, "StatefulSet")
    assert set(services) == set(roles)
    for role, svc in services.items():
        spec = svc["spec"]
        assert spec["clusterIP"] == "None", role
        assert spec["publishNotReadyAddresses"] is True, role
        assert spec["selector"] == {LABEL_JOB: job.metadata.name, LABEL_ROLE: role}
        # The StatefulSet's pods get DNS names from this Service and it selects exactly them.
        sts = sets[role]
        assert sts["spec"]["serviceName"] == svc["metadata"]["name"]
        template_labels = sts["spec"]["template"]["metadata"]["labels"]
        assert spec["selector"].items() <= template_labels.items()


# --- StatefulSets -------------------------------------------------------------------------------

TOLERATE_GPU = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]

# example, role, replicas, gpusPerReplica, nodeSelector, tolerations, cpu, memory
ROLE_PODS = [
    pytest.param(GPU, "controller", 1, 0, None, None, "1", "4Gi", id="gpu-controller"),
    pytest.param(GPU, "actor", 2, 8, {"rlkube.dev/pool": "h100-train"}, TOLERATE_GPU, "64", "900Gi", id="gpu-actor"),
    pytest.param(GPU, "rollout", 4, 2, {"rlkube.dev/pool": "l40s-infer"}, None, "16", "200Gi", id="gpu-rollout"),
    pytest.param(CPU, "controller", 1, 0, None, None, "1", "4Gi", id="cpu-controller"),
    pytest.param(CPU, "actor", 2, 0, None, None, None, None, id="cpu-actor"),
    pytest.param(CPU, "rollout", 1, 0, None, None, None, None, id="cpu-rollout"),
]


@pytest.mark.parametrize(
    ("example", "role", "replicas", "gpus", "node_selector", "tolerations", "cpu", "memory"), ROLE_PODS
)
def test_stateful_set_per_role(
    example: str,
    role: str,
    replicas: int,
    gpus: int,
    node_selector: dict[str, str] | None,
    tolerations: list[Obj] | None,
    cpu: str | None,
    memory: str | None,
) -> None:
    job = load_job(example)
    sts = stateful_set(job, role)
    spec = sts["spec"]
    assert spec["podManagementPolicy"] == "Parallel"
    assert spec["replicas"] == replicas
    assert spec["serviceName"] == f"{job.metadata.name}-{role}"
    selector = spec["selector"]["matchLabels"]
    assert selector == {LABEL_JOB: job.metadata.name, LABEL_ROLE: role}
    assert selector.items() <= spec["template"]["metadata"]["labels"].items()

    pod = pod_spec(sts)
    assert pod.get("nodeSelector") == node_selector
    assert pod.get("tolerations") == tolerations
    assert "affinity" not in pod
    assert "schedulerName" not in pod

    resources = container(sts).get("resources", {})
    requests, limits = resources.get("requests", {}), resources.get("limits", {})
    if gpus:
        assert requests[GPU_RESOURCE] == limits[GPU_RESOURCE] == str(gpus)
    else:
        assert GPU_RESOURCE not in requests
        assert GPU_RESOURCE not in limits
    assert requests.get("cpu") == cpu
    assert "cpu" not in limits
    assert requests.get("memory") == limits.get("memory") == memory


@pytest.mark.parametrize(("example", "mutations", "roles"), CHILD_SETS)
def test_scaled_down_keeps_stateful_sets_with_zero_replicas(
    example: str, mutations: list[Mutation], roles: list[str]
) -> None:
    job = load_job(example, *mutations)
    sets = by_kind(children_of(job, pods_wanted=False), "StatefulSet")
    assert {role: s["spec"]["replicas"] for role, s in sets.items()} == dict.fromkeys(roles, 0)


def test_pool_affinity_is_copied() -> None:
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "gpu.product", "operator": "In", "values": ["L40S"]}]}
                ]
            }
        }
    }
    tolerations = [
        {"key": "infer", "operator": "Equal", "value": "yes", "effect": "NoExecute", "tolerationSeconds": 60}
    ]
    job = load_job(
        GPU,
        set_path("spec.roles.rollout.pool.affinity", affinity),
        set_path("spec.roles.rollout.pool.tolerations", tolerations),
        set_path("spec.controller.pool", {"nodeSelector": {"pool": "cpu"}}),
    )
    sets = by_kind(children_of(job), "StatefulSet")
    rollout = pod_spec(sets["rollout"])
    assert rollout["affinity"] == affinity
    assert rollout["tolerations"] == tolerations
    assert rollout["nodeSelector"] == {"rlkube.dev/pool": "l40s-infer"}
    assert pod_spec(sets["controller"])["nodeSelector"] == {"pool": "cpu"}
    # Each role keeps its own pool: the actor's is not the rollout's.
    assert "affinity" not in pod_spec(sets["actor"])
    assert pod_spec(sets["actor"])["nodeSelector"] == {"rlkube.dev/pool": "h100-train"}


def test_the_controller_asks_for_default_resources_and_a_set_one_replaces_only_itself() -> None:
    """A pod without requests is BestEffort, the first evicted when its node runs short."""
    default = container(stateful_set(load_job(CPU), "controller"))["resources"]
    assert default == {"requests": {"cpu": "1", "memory": "4Gi"}, "limits": {"memory": "4Gi"}}
    job = load_job(CPU, set_path("spec.controller.resources", {"cpu": "4"}))
    resources = container(stateful_set(job, "controller"))["resources"]
    assert resources == {"requests": {"cpu": "4", "memory": "4Gi"}, "limits": {"memory": "4Gi"}}


@pytest.mark.parametrize(
    ("mutations", "service_account", "creates_account"),
    [
        pytest.param([], "tiny-cpu-trainer", True, id="own-service-account"),
        pytest.param([set_path("spec.serviceAccountName", "trainer")], "trainer", False, id="user-service-account"),
    ],
)
def test_pods_run_as_the_account_allowed_to_report_progress(
    mutations: list[Mutation], service_account: str, creates_account: bool
) -> None:
    job = load_job(CPU, *mutations)
    children = children_of(job)
    accounts = by_kind(children, "ServiceAccount")
    assert set(accounts) == ({service_account} if creates_account else set())
    for role, sts in by_kind(children, "StatefulSet").items():
        assert pod_spec(sts)["serviceAccountName"] == service_account, role
    # The driver may patch its own pod (the progress annotation), any pod may record its
    # exit in the job's own exit-record ConfigMap, and nothing else (no Events).
    role_obj = by_kind(children, "Role")["tiny-cpu-progress"]
    assert role_obj["rules"] == [
        {
            "apiGroups": [""],
            "resources": ["pods"],
            "resourceNames": ["tiny-cpu-controller-0"],
            "verbs": ["get", "patch"],
        },
        {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["tiny-cpu-exits"], "verbs": ["patch"]},
    ]
    binding = by_kind(children, "RoleBinding")["tiny-cpu-progress"]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "tiny-cpu-progress"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": service_account, "namespace": NAMESPACE}]


def test_pod_image_settings_are_copied() -> None:
    job = load_job(
        CPU,
        set_path("spec.imagePullSecrets", [{"name": "regcred"}]),
        set_path("spec.imagePullPolicy", "Always"),
    )
    for role, sts in by_kind(children_of(job), "StatefulSet").items():
        assert pod_spec(sts)["imagePullSecrets"] == [{"name": "regcred"}], role
        assert container(sts)["image"] == "rlkube-trainer:dev", role
        assert container(sts)["imagePullPolicy"] == "Always", role


@pytest.mark.parametrize(
    ("role", "command"),
    [
        ("controller", ["rlkube-trainer", "driver"]),
        ("actor", ["rlkube-trainer", "node", "--role", "actor"]),
        ("critic", ["rlkube-trainer", "node", "--role", "critic"]),
        ("reference", ["rlkube-trainer", "node", "--role", "reference"]),
        ("rollout", ["rlkube-trainer", "node", "--role", "rollout"]),
    ],
)
def test_command_per_role(role: str, command: list[str]) -> None:
    job = load_job(GPU, *SEPARATE_CRITIC_AND_REFERENCE)
    assert container(stateful_set(job, role))["command"] == command


@pytest.mark.parametrize(
    ("example", "ckpt_dir", "ckpt_source"),
    [
        (GPU, "/checkpoints", {"persistentVolumeClaim": {"claimName": "rl-ckpt"}}),
        # The checkpoints sit on the user's own volume (spec.volumes) mounted at /rlkube.
        (CPU, "/rlkube/checkpoints/tiny-cpu", None),
    ],
)
def test_volumes_of_every_pod(example: str, ckpt_dir: str, ckpt_source: Obj | None) -> None:
    job = load_job(example)
    name = job.metadata.name
    children = children_of(job)
    config_map = by_kind(children, "ConfigMap")[f"{name}-config"]
    function = job.spec.reward.function
    assert function is not None
    assert function.config_map is not None
    reward_ref = function.config_map
    config_path = yaml.safe_load(config_map["data"][CONFIG_FILE])["reward"]["function"]["path"]
    for role, sts in by_kind(children, "StatefulSet").items():
        # /dev/shm: memory-backed, or NCCL breaks on the 64 MB default.
        assert volume(sts, "shm") == {"name": "shm", "emptyDir": {"medium": "Memory"}}, role
        assert mount_for(sts, "shm")["mountPath"] == SHM_DIR == "/dev/shm"
        # The trainer config: the ConfigMap mounted where RLKUBE_CONFIG points.
        assert volume(sts, "config")["configMap"]["name"] == f"{name}-config"
        config_file = env_values(sts)[Env.CONFIG]
        assert posixpath.dirname(config_file) == mount_for(sts, "config")["mountPath"]
        assert posixpath.basename(config_file) in config_map["data"]
        # Checkpoints: the user's volume source at spec.checkpoint.dir.
        assert job.spec.checkpoint.dir == ckpt_dir
        if ckpt_source is None:
            assert all(v["name"] != "checkpoints" for v in pod_spec(sts)["volumes"])
        else:
            assert volume(sts, "checkpoints") == {"name": "checkpoints", **ckpt_source}, role
            assert mount_for(sts, "checkpoints")["mountPath"] == ckpt_dir
        # The reward function's ConfigMap key, mounted as the file the config names.
        reward = volume(sts, "reward")["configMap"]
        assert reward["name"] == reward_ref.name
        assert reward["items"] == [{"key": reward_ref.key, "path": reward_ref.key}]
        mounted_file = posixpath.join(mount_for(sts, "reward")["mountPath"], reward["items"][0]["path"])
        assert mounted_file == config_path == f"{REWARD_DIR}/{reward_ref.key}"
        # No mount twice at one path.
        paths = [m["mountPath"] for m in container(sts)["volumeMounts"]]
        assert len(paths) == len(set(paths)), role


def test_role_pods_have_a_liveness_probe_on_their_health_port() -> None:
    job = load_job(GPU, *SEPARATE_CRITIC_AND_REFERENCE)
    for role, sts in by_kind(children_of(job), "StatefulSet").items():
        probe = container(sts).get("livenessProbe")
        if role == "controller":
            assert probe is None
            continue
        assert probe is not None, role
        port = probe["httpGet"]["port"]
        assert probe["httpGet"]["path"] == "/healthz"
        assert {"name": port, "containerPort": NODE_HEALTH_PORT} in container(sts)["ports"], role


@pytest.mark.parametrize(("example", "mutations", "roles"), CHILD_SETS)
def test_every_pod_meets_the_restricted_pod_security_standard(
    example: str, mutations: list[Mutation], roles: list[str]
) -> None:
    """The fields "restricted" requires (tests/operator/test_security.py has the API server judge)."""
    for role, sts in by_kind(children_of(load_job(example, *mutations)), "StatefulSet").items():
        pod = sts["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True, role
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, role
        context = container(sts)["securityContext"]
        assert context["allowPrivilegeEscalation"] is False, role
        assert context["capabilities"] == {"drop": ["ALL"]}, role
        assert not any(key in pod for key in ("hostNetwork", "hostPID", "hostIPC")), role
        assert all("hostPort" not in port for port in container(sts)["ports"]), role


def test_user_volumes_are_mounted_in_every_pod() -> None:
    job = load_job(GPU)
    assert job.spec.volumes is not None
    for role, sts in by_kind(children_of(job), "StatefulSet").items():
        assert volume(sts, "models") == {
            "name": "models",
            "persistentVolumeClaim": {"claimName": "models", "readOnly": True},
        }
        assert mount_for(sts, "models") == {"name": "models", "mountPath": "/models", "readOnly": True}, role
        assert mount_for(sts, "data")["mountPath"] == "/data"


def test_no_checkpoint_or_reward_volume_when_not_asked_for() -> None:
    job = load_job(
        CPU,
        set_path("spec.checkpoint", {"dir": "/rlkube/ckpt"}),  # on the example's own volume
        set_path("spec.reward.function", {"path": "/opt/reward.py"}),
    )
    for sts in by_kind(children_of(job), "StatefulSet").values():
        names = {v["name"] for v in pod_spec(sts)["volumes"]}
        assert names == {"shm", "config", "work"}  # work: the example's own volume (spec.volumes)
        assert {m["name"] for m in container(sts)["volumeMounts"]} == {"shm", "config", "work"}


@pytest.mark.parametrize("attempt", [0, 3])
def test_attempt_is_stamped_on_every_pod_template(attempt: int) -> None:
    job = load_job(GPU)
    for role, sts in by_kind(children_of(job, attempt=attempt), "StatefulSet").items():
        template_meta = sts["spec"]["template"]["metadata"]
        assert template_meta["annotations"][ANNOTATION_ATTEMPT] == str(attempt), role
        assert env_values(sts)[Env.ATTEMPT] == str(attempt), role
        assert template_meta["labels"][LABEL_JOB] == job.metadata.name
        assert template_meta["labels"][LABEL_ROLE] == role
        # The operator replaces pods itself, as a gang.
        assert sts["spec"]["updateStrategy"] == {"type": "OnDelete"}


# --- the trainer's ConfigMap --------------------------------------------------------------------


@pytest.mark.parametrize("example", [GPU, CPU])
def test_config_map_parses_back_into_the_trainer_config(example: str) -> None:
    job = load_job(example)
    config_map = by_kind(children_of(job), "ConfigMap")[f"{job.metadata.name}-config"]
    assert set(config_map["data"]) == {CONFIG_FILE}
    raw = yaml.safe_load(config_map["data"][CONFIG_FILE])
    # verl's snake_case spelling, as `rlkube-trainer run` reads it.
    assert raw["rollout"]["n"] == job.spec.rollout.n
    assert "samplesPerPrompt" not in raw["rollout"]
    assert raw["data"]["train_files"] == job.spec.data.train_files
    assert raw["actor"]["ppo_mini_batch_size"] == job.spec.actor.ppo_mini_batch_size
    assert raw["algorithm"]["adv_estimator"] == "grpo"
    assert raw["roles"]["actor"]["replicas"] == job.spec.roles.actor.replicas
    # Only the trainer's sections: nothing that only Kubernetes reads.
    for key in ("image", "imagePullPolicy", "env", "controller", "suspend", "runPolicy", "run_policy"):
        assert key not in raw
    assert "volume" not in raw["checkpoint"]
    assert raw["checkpoint"]["dir"] == job.spec.checkpoint.dir
    # The reward function is the mounted file, not a ConfigMap reference.
    function = raw["reward"]["function"]
    assert function["path"].startswith(f"{REWARD_DIR}/")
    assert "config_map" not in function
    assert "configMap" not in function
    parsed = parse_trainer_config(raw, CONFIG_FILE)
    assert parsed == trainer_config(job)
    assert parsed.rollout.n == job.spec.rollout.n
    assert parsed.roles == job.spec.roles
    assert parsed.checkpoint.max_to_keep == job.spec.checkpoint.max_to_keep


def test_config_map_keeps_a_reward_function_path() -> None:
    job = load_job(CPU, set_path("spec.reward.function", {"path": "/opt/reward.py", "name": "score"}))
    raw = yaml.safe_load(by_kind(children_of(job), "ConfigMap")["tiny-cpu-config"]["data"][CONFIG_FILE])
    assert raw["reward"]["function"] == {"path": "/opt/reward.py", "name": "score"}


# rollout.multiTurn.configMap: the user's tool and interaction files (examples/multi-turn-tools.yaml).
AGENT_FILES = (
    set_path("spec.roles.rollout", {"placement": "colocated"}),
    set_path(
        "spec.rollout.multiTurn",
        {
            "enable": True,
            "configMap": {"name": "agent-tools"},
            "toolConfigPath": "tools.yaml",
            "interactionConfigPath": "interaction.yaml",
            "sandbox": {"cpuSeconds": 2},
        },
    ),
)


def test_the_agent_config_map_is_mounted_whole_in_every_pod() -> None:
    job = load_job(CPU, *AGENT_FILES)
    stateful_sets = by_kind(children_of(job), "StatefulSet")
    assert set(stateful_sets) == {"controller", "actor"}  # the driver runs the episodes; the actor generates
    for role, sts in stateful_sets.items():
        # Whole, not item by item: a tool config's class_name may import a module shipped beside it.
        assert volume(sts, "agent") == {"name": "agent", "configMap": {"name": "agent-tools"}}, role
        assert mount_for(sts, "agent") == {"name": "agent", "mountPath": AGENT_DIR, "readOnly": True}, role
        assert AGENT_DIR == "/etc/rlkube-agent"
    without = by_kind(children_of(load_job(CPU)), "StatefulSet")
    assert all(v["name"] != "agent" for sts in without.values() for v in pod_spec(sts)["volumes"])


def test_the_trainer_config_names_the_mounted_files_of_the_agent_config_map() -> None:
    job = load_job(CPU, *AGENT_FILES)
    raw = yaml.safe_load(by_kind(children_of(job), "ConfigMap")["tiny-cpu-config"]["data"][CONFIG_FILE])
    multi_turn = raw["rollout"]["multi_turn"]
    assert multi_turn["tool_config_path"] == f"{AGENT_DIR}/tools.yaml"
    assert multi_turn["interaction_config_path"] == f"{AGENT_DIR}/interaction.yaml"
    assert "function_tool_path" not in multi_turn  # unset stays unset
    assert "config_map" not in multi_turn  # the trainer reads files, never a ConfigMap
    assert multi_turn["sandbox"] == {"cpu_seconds": 2}
    assert parse_trainer_config(raw, CONFIG_FILE) == trainer_config(job)
    # Without a ConfigMap the paths are the image's files, as written.
    own = load_job(
        CPU,
        AGENT_FILES[0],
        set_path("spec.rollout.multiTurn", {"enable": True, "functionToolPath": "/opt/tools/lookup.py"}),
    )
    raw = yaml.safe_load(by_kind(children_of(own), "ConfigMap")["tiny-cpu-config"]["data"][CONFIG_FILE])
    assert raw["rollout"]["multi_turn"]["function_tool_path"] == "/opt/tools/lookup.py"


def test_every_pod_gets_the_jobs_ray_token_from_its_secret() -> None:
    """Ray's token authentication: only the job's own pods can join its Ray cluster."""
    children = children_of(load_job(GPU))
    secret = next(c for c in children if c["kind"] == "Secret")
    assert secret["stringData"]["token"]
    for sts in (c for c in children if c["kind"] == "StatefulSet"):
        env = {e["name"]: e for e in sts["spec"]["template"]["spec"]["containers"][0]["env"]}
        assert env["RAY_AUTH_MODE"]["value"] == "token"
        ref = env["RAY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"]
        assert (ref["name"], ref["key"]) == (secret["metadata"]["name"], "token")


def test_every_pod_gets_the_jobs_grace_period_to_save_the_step_in_progress() -> None:
    default, longer = load_job(CPU), load_job(CPU, set_path("spec.runPolicy.terminationGracePeriodSeconds", 600))
    for role, sts in by_kind(children_of(default), "StatefulSet").items():
        assert pod_spec(sts)["terminationGracePeriodSeconds"] == 120, role
    for role, sts in by_kind(children_of(longer), "StatefulSet").items():
        assert pod_spec(sts)["terminationGracePeriodSeconds"] == 600, role


def test_the_object_stores_secret_reaches_only_the_pods_that_write_checkpoints() -> None:
    """checkpoint.credentialsSecret: every key of the Secret in the environment of the driver
    and of the actor and critic ranks (their parts); rollout pods get nothing. The uri and
    endpoint go to the trainer's config, the Secret's name does not."""
    job = load_job(
        GPU,
        *SEPARATE_CRITIC_AND_REFERENCE,
        set_path("spec.checkpoint.uri", "s3://ckpt/runs/a"),
        set_path("spec.checkpoint.endpointUrl", "http://object-store.storage:9000"),
        set_path("spec.checkpoint.credentialsSecret", "ckpt-s3"),
    )
    children = children_of(job)
    for role, sts in by_kind(children, "StatefulSet").items():
        expected = [{"secretRef": {"name": "ckpt-s3"}}] if role in ("controller", "actor", "critic") else None
        assert container(sts).get("envFrom") == expected, role
    raw = yaml.safe_load(by_kind(children, "ConfigMap")[f"{job.metadata.name}-config"]["data"][CONFIG_FILE])
    assert raw["checkpoint"]["uri"] == "s3://ckpt/runs/a"
    assert raw["checkpoint"]["endpoint_url"] == "http://object-store.storage:9000"
    assert "credentials_secret" not in raw["checkpoint"]
    assert "envFrom" not in container(stateful_set(load_job(GPU), "controller"))
