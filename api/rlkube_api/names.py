"""Names shared by the operator and the trainer: labels, annotations, child
object names, the rendezvous environment variables, ports and mount paths.
Defined once here; both sides import them.
"""

from __future__ import annotations

from typing import Final

# --- labels and annotations -------------------------------------------------------------------
LABEL_JOB: Final = "rlkube.dev/job-name"
LABEL_ROLE: Final = "rlkube.dev/role"
LABEL_MANAGED_BY: Final = "app.kubernetes.io/managed-by"
MANAGED_BY: Final = "rlkube-operator"
# Bumped on every gang restart; pods of older attempts are ignored and deleted.
ANNOTATION_ATTEMPT: Final = "rlkube.dev/attempt"
# The driver writes its progress (JSON) here; the operator copies it into status.progress.
ANNOTATION_PROGRESS: Final = "rlkube.dev/progress"
# On a role's StatefulSet: its parallel layout (tp2×pp2×dp2), for people and tools reading the cluster.
ANNOTATION_LAYOUT: Final = "rlkube.dev/parallel-layout"
# On the Event a trainer container posts about its own pod as it exits non-zero (reason
# EVENT_TRAINER_EXITED): the exit code. The Event outlives the pod, so a pod replaced while no
# operator watched still has its exit code and message on record.
ANNOTATION_EXIT_CODE: Final = "rlkube.dev/exit-code"
EVENT_TRAINER_EXITED: Final = "TrainerExited"
# The driver sets this on its own pod (the time, RFC 3339) once its run has ended with success,
# its last checkpoint written, and then idles instead of exiting: StatefulSet pods restart every
# container that exits (restartPolicy Always), so an exit would start the run again. The
# operator takes the annotation for the driver's success, as it takes an exit code 0.
ANNOTATION_RUN_FINISHED: Final = "rlkube.dev/run-finished"
# In checkpoint.dir, on the job's volume: the step rows (one JSON object a line) and the
# driver's log. They outlive the pods, so `kubectl rlkube curves` and `logs` read a finished
# job's from there.
METRICS_FILE: Final = "metrics.jsonl"
DRIVER_LOG_FILE: Final = "driver.log"
# StatefulSet pods carry their ordinal in this label (Kubernetes >= 1.28).
LABEL_POD_INDEX: Final = "apps.kubernetes.io/pod-index"

CONTROLLER_ROLE: Final = "controller"


def child_name(job: str, role: str) -> str:
    """StatefulSet and headless Service of a role."""
    return f"{job}-{role}"


def config_map_name(job: str) -> str:
    return f"{job}-config"


def exit_records_name(job: str) -> str:
    """The job's ConfigMap of trainer exit records, by pod UID: only the job's own
    ServiceAccount may patch it (its Role names it), so no other job's pods can write there."""
    return f"{job}-exits"


def pod_dns_name(job: str, role: str, index: int, namespace: str) -> str:
    """Stable DNS name of a role's pod behind its headless Service."""
    return f"{child_name(job, role)}-{index}.{child_name(job, role)}.{namespace}.svc"


# --- ports ---------------------------------------------------------------------------------------
RENDEZVOUS_PORT: Final = 29500  # torch.distributed store of each role group
WEIGHT_SYNC_PORT: Final = 29600  # actor ranks -> rollout workers
RAY_PORT: Final = 6379  # Ray head (GCS) in the controller pod
DRIVER_METRICS_PORT: Final = 9400  # Prometheus endpoint of the driver
NODE_HEALTH_PORT: Final = 9401  # health endpoint of each role pod

# --- mount paths ------------------------------------------------------------------------------
CONFIG_DIR: Final = "/etc/rlkube"
CONFIG_FILE: Final = "config.yaml"
# Not under CONFIG_DIR: a mount inside a read-only ConfigMap mount needs its mount point
# created in a read-only file system.
REWARD_DIR: Final = "/etc/rlkube-reward"
# rollout.multiTurn.configMap's keys (tool and interaction files).
AGENT_DIR: Final = "/etc/rlkube-agent"
SHM_DIR: Final = "/dev/shm"


class Env:
    """Environment variables the operator injects and the trainer reads."""

    # torch.distributed rendezvous of the pod's own role group: WORLD_SIZE is the role's
    # total processes; torchrun's PET_NODE_RANK (the pod's index) and PET_NPROC_PER_NODE
    # give each process its rank. Every variable here is read by the trainer.
    MASTER_ADDR: Final = "MASTER_ADDR"
    MASTER_PORT: Final = "MASTER_PORT"
    WORLD_SIZE: Final = "WORLD_SIZE"
    PET_NODE_RANK: Final = "PET_NODE_RANK"
    PET_NPROC_PER_NODE: Final = "PET_NPROC_PER_NODE"
    # rlkube's own.
    JOB_NAME: Final = "RLKUBE_JOB_NAME"
    JOB_UID: Final = "RLKUBE_JOB_UID"  # whose checkpoint.dir it is (checkpoint/owner.py)
    NAMESPACE: Final = "RLKUBE_NAMESPACE"
    ROLE: Final = "RLKUBE_ROLE"
    POD_NAME: Final = "RLKUBE_POD_NAME"
    POD_UID: Final = "RLKUBE_POD_UID"
    POD_IP: Final = "RLKUBE_POD_IP"
    CONFIG: Final = "RLKUBE_CONFIG"
    ATTEMPT: Final = "RLKUBE_ATTEMPT"
    RAY_ADDRESS: Final = "RLKUBE_RAY_ADDRESS"  # host:port of the Ray head (controller pod)
    WEIGHT_SYNC_ADDR: Final = "RLKUBE_WEIGHT_SYNC_ADDR"
    WEIGHT_SYNC_PORT: Final = "RLKUBE_WEIGHT_SYNC_PORT"
    WEIGHT_SYNC_WORLD_SIZE: Final = "RLKUBE_WEIGHT_SYNC_WORLD_SIZE"
    WEIGHT_SYNC_RANK_OFFSET: Final = "RLKUBE_WEIGHT_SYNC_RANK_OFFSET"
    METRICS_PORT: Final = "RLKUBE_METRICS_PORT"
    # Ray's own: token authentication for the job's Ray cluster.
    RAY_AUTH_MODE: Final = "RAY_AUTH_MODE"
    RAY_AUTH_TOKEN: Final = "RAY_AUTH_TOKEN"


# reward.remote.secretHeaders[i] reaches the driver as RLKUBE_REWARD_HEADER_<i>, set by the
# operator from the header's Secret key (the controller pod's env) and read by the trainer.
REWARD_HEADER_ENV_PREFIX: Final = "RLKUBE_REWARD_HEADER_"


# Set by users (spec.env), not the operator, so not in Env (whose names RLJobs may not set):
# extra `ray start` flags (shell words) for the head and the role pods, e.g. object store size.
RAY_START_ARGS_ENV: Final = "RLKUBE_RAY_START_ARGS"
