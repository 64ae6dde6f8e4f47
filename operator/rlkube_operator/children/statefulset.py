"""One StatefulSet per role: pods with the role's GPUs, pool, /dev/shm, config,
checkpoint volume and rendezvous environment."""

from __future__ import annotations

import copy
from typing import Any

from rlkube_api.exit_codes import TERMINATION_MESSAGE_PATH
from rlkube_api.names import (
    AGENT_DIR,
    ANNOTATION_ATTEMPT,
    ANNOTATION_LAYOUT,
    CONFIG_DIR,
    CONFIG_FILE,
    CONTROLLER_ROLE,
    DRIVER_METRICS_PORT,
    NODE_HEALTH_PORT,
    RAY_PORT,
    RENDEZVOUS_PORT,
    REWARD_DIR,
    REWARD_HEADER_ENV_PREFIX,
    SHM_DIR,
    WEIGHT_SYNC_PORT,
    Env,
    child_name,
    config_map_name,
)
from rlkube_api.placement import Role, layout_of
from rlkube_api.pod_template import TRAINER_CONTAINER
from rlkube_api.rljob import RLJob
from rlkube_operator.children.fetch import fetch_init_containers
from rlkube_operator.children.labels import role_labels, role_selector
from rlkube_operator.children.overrides import apply_pod_template
from rlkube_operator.children.rbac import trainer_service_account_name
from rlkube_operator.children.rendezvous import rendezvous_env
from rlkube_operator.children.secret import TOKEN_KEY, ray_secret_name
from rlkube_operator.children.topology import PodRole, container_resources
from rlkube_operator.gang.base import PodSchedulingPatch

CONTAINER = TRAINER_CONTAINER

# Defaults a user overrides through spec.env. Async error handling makes a dead
# peer abort the collective instead of hanging it; the rest keeps logs readable.
NCCL_DEFAULTS = {
    "NCCL_DEBUG": "WARN",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
    "TORCH_NCCL_DUMP_ON_TIMEOUT": "0",
    "HF_HUB_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
}


# The "restricted" Pod Security Standard, so that jobs run in namespaces that enforce it.
# The trainer needs no privilege: NCCL's shared memory is the /dev/shm emptyDir, and Ray and
# torch.distributed listen on unprivileged ports.
CONTAINER_SECURITY_CONTEXT: dict[str, Any] = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "runAsNonRoot": True,
    "seccompProfile": {"type": "RuntimeDefault"},
}
# The trainer image's group (Dockerfile.trainer: USER 1000:1000). As fsGroup, it makes volumes
# such as the checkpoint PersistentVolumeClaim writable by the non-root user; OnRootMismatch
# skips the recursive chown of a volume already owned by it (a model volume is large).
TRAINER_GID = 1000
POD_SECURITY_CONTEXT: dict[str, Any] = {
    "runAsNonRoot": True,
    "seccompProfile": {"type": "RuntimeDefault"},
    "fsGroup": TRAINER_GID,
    "fsGroupChangePolicy": "OnRootMismatch",
}


# The pods that write or read checkpoints: the driver (its own state, the manifest, the
# marker) and the ranks of the trainable roles (their parts). Only these get the object
# store's credentials (checkpoint.credentialsSecret).
CHECKPOINT_WRITERS = frozenset({CONTROLLER_ROLE, "actor", "critic"})


def container_env_from(job: RLJob, role: str) -> list[dict[str, Any]]:
    """The object store's credentials, every key of the Secret as a variable, as its fsspec
    backend reads them (AWS_ACCESS_KEY_ID, ...)."""
    secret = job.spec.checkpoint.credentials_secret
    if secret is None or role not in CHECKPOINT_WRITERS:
        return []
    return [{"secretRef": {"name": secret}}]


def reward_header_env(job: RLJob, role: str) -> list[dict[str, Any]]:
    """reward.remote.secretHeaders, each from its Secret key, in the driver's pod: the driver
    sends the requests (trainer: reward/remote.py)."""
    remote = job.spec.reward.remote
    if remote is None or role != CONTROLLER_ROLE:
        return []
    return [
        {
            "name": f"{REWARD_HEADER_ENV_PREFIX}{index}",
            "valueFrom": {"secretKeyRef": {"name": header.secret, "key": header.key}},
        }
        for index, header in enumerate(remote.secret_headers or [])
    ]


def container_command(role: str) -> list[str]:
    if role == CONTROLLER_ROLE:
        return ["rlkube-trainer", "driver"]
    return ["rlkube-trainer", "node", "--role", role]


def container_env(job: RLJob, role: PodRole, attempt: int) -> list[dict[str, Any]]:
    env = rendezvous_env(job, role, attempt)
    env.append({"name": Env.RAY_AUTH_MODE, "value": "token"})
    env.append(
        {
            "name": Env.RAY_AUTH_TOKEN,
            "valueFrom": {"secretKeyRef": {"name": ray_secret_name(job), "key": TOKEN_KEY}},
        }
    )
    env.append({"name": Env.CONFIG, "value": f"{CONFIG_DIR}/{CONFIG_FILE}"})
    env.append({"name": Env.METRICS_PORT, "value": str(DRIVER_METRICS_PORT)})
    env += reward_header_env(job, role.name)
    user = {e.name: e.value for e in job.spec.env or []}
    env += [{"name": k, "value": v} for k, v in NCCL_DEFAULTS.items() if k not in user]
    env += [{"name": k, "value": v} for k, v in user.items()]
    return env


# Role pods serve /healthz (`rlkube-trainer node`). A wedged node process is restarted by
# the kubelet; the operator then sees the container restart and restarts the gang. Loose
# timings: a node busy loading a model must not be killed. The controller has no probe: a
# driver that hangs is bounded by the trainer's own collective and call timeouts.
ROLE_LIVENESS_PROBE: dict[str, Any] = {
    "httpGet": {"path": "/healthz", "port": "health"},
    "initialDelaySeconds": 30,
    "periodSeconds": 20,
    "timeoutSeconds": 10,
    "failureThreshold": 6,
}


def container_ports(role: str) -> list[dict[str, Any]]:
    if role == CONTROLLER_ROLE:
        return [
            {"name": "ray", "containerPort": RAY_PORT},
            {"name": "metrics", "containerPort": DRIVER_METRICS_PORT},
        ]
    ports = [
        {"name": "rendezvous", "containerPort": RENDEZVOUS_PORT},
        {"name": "health", "containerPort": NODE_HEALTH_PORT},
    ]
    if role in ("actor", "rollout"):
        ports.append({"name": "weight-sync", "containerPort": WEIGHT_SYNC_PORT})
    return ports


def volumes_and_mounts(job: RLJob) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    name = job.metadata.name or ""
    # NCCL and vLLM use shared memory; the 64 MB container default breaks NCCL.
    volumes: list[dict[str, Any]] = [
        {"name": "shm", "emptyDir": {"medium": "Memory"}},
        {"name": "config", "configMap": {"name": config_map_name(name)}},
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "shm", "mountPath": SHM_DIR},
        {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
    ]
    checkpoint = job.spec.checkpoint
    if checkpoint.volume is not None:
        volumes.append({"name": "checkpoints", **checkpoint.volume.to_pod()})
        mounts.append({"name": "checkpoints", "mountPath": checkpoint.dir})
    for volume in job.spec.volumes or []:
        volumes.append({"name": volume.name, **volume.source.to_pod()})
        mounts.append({"name": volume.name, "mountPath": volume.mount_path, "readOnly": volume.read_only})
    function = job.spec.reward.function
    if function is not None and function.config_map is not None:
        ref = function.config_map
        volumes.append(
            {"name": "reward", "configMap": {"name": ref.name, "items": [{"key": ref.key, "path": ref.key}]}}
        )
        mounts.append({"name": "reward", "mountPath": REWARD_DIR, "readOnly": True})
    agent_files = job.spec.rollout.multi_turn.config_map
    if agent_files is not None:
        # Whole: a tool config's class_name may import a module shipped beside it.
        volumes.append({"name": "agent", "configMap": {"name": agent_files.name}})
        mounts.append({"name": "agent", "mountPath": AGENT_DIR, "readOnly": True})
    return volumes, mounts


def pod_template(job: RLJob, role: PodRole, attempt: int, scheduling: PodSchedulingPatch) -> dict[str, Any]:
    spec = job.spec
    volumes, mounts = volumes_and_mounts(job)
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": container_command(role.name),
        "env": container_env(job, role, attempt),
        "ports": container_ports(role.name),
        "volumeMounts": mounts,
        "securityContext": copy.deepcopy(CONTAINER_SECURITY_CONTEXT),
        # The trainer writes its error to the termination message; a container that died without
        # one (a crash, a kill) gets its log's last lines there instead. The operator puts either
        # into the job's condition and Event, so they outlive the pod.
        "terminationMessagePath": TERMINATION_MESSAGE_PATH,
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    env_from = container_env_from(job, role.name)
    if env_from:
        container["envFrom"] = env_from
    resources = container_resources(role)
    if resources:
        container["resources"] = resources
    if role.name != CONTROLLER_ROLE:
        container["livenessProbe"] = ROLE_LIVENESS_PROBE
    pod: dict[str, Any] = {
        "containers": [container],
        "volumes": volumes,
        "securityContext": copy.deepcopy(POD_SECURITY_CONTEXT),
        # SIGTERM to SIGKILL (suspend, eviction, drain): the trainer saves the step in progress.
        "terminationGracePeriodSeconds": spec.run_policy.termination_grace_period_seconds,
    }
    if init := fetch_init_containers(job, role.name, container):
        pod["initContainers"] = init
    pod["serviceAccountName"] = trainer_service_account_name(job)
    if spec.image_pull_secrets:
        pod["imagePullSecrets"] = [s.to_wire() for s in spec.image_pull_secrets]
    if role.pool is not None:
        pool = role.pool.to_wire()
        for key in ("nodeSelector", "tolerations", "affinity"):
            if key in pool:
                pod[key] = pool[key]
    if scheduling.scheduler_name:
        pod["schedulerName"] = scheduling.scheduler_name
    if scheduling.priority_class_name:
        pod["priorityClassName"] = scheduling.priority_class_name
    template = {
        "metadata": {
            "labels": {**role_labels(job, role.name), **scheduling.labels},
            "annotations": {ANNOTATION_ATTEMPT: str(attempt), **scheduling.annotations},
        },
        "spec": pod,
    }
    return apply_pod_template(template, job, role.name)


def _layout_annotation(job: RLJob, role: PodRole) -> dict[str, Any]:
    """A trainer role's parallel layout. On the StatefulSet, not its pod template: an operator
    upgrade rolls no pod."""
    if role.name == CONTROLLER_ROLE:
        return {}
    return {"annotations": {ANNOTATION_LAYOUT: layout_of(job.spec.roles, Role(role.name), role).describe()}}


def stateful_set(
    job: RLJob, role: PodRole, attempt: int, replicas: int, scheduling: PodSchedulingPatch
) -> dict[str, Any]:
    """`replicas` is the role's size while the job runs and 0 while it is suspended or finished."""
    name = child_name(job.metadata.name or "", role.name)
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {
            "name": name,
            "namespace": job.metadata.namespace,
            "labels": role_labels(job, role.name),
            **_layout_annotation(job, role),
        },
        "spec": {
            "serviceName": name,
            "replicas": replicas,
            "podManagementPolicy": "Parallel",
            # The operator replaces pods itself, as a gang, on restarts.
            "updateStrategy": {"type": "OnDelete"},
            "selector": {"matchLabels": role_selector(job, role.name)},
            "template": pod_template(job, role, attempt, scheduling),
        },
    }
