"""What the job's pods may do through the API server, as a Role bound to their
ServiceAccount: the driver patches the `rlkube.dev/progress` annotation of its own pod
(the controller pod; that one pod only), which the operator already watches; and every
trainer container records its non-zero exit in the job's exit-record ConfigMap (which
outlives the pod: trainer/rlkube_trainer/pod/exit_record.py), that one ConfigMap only. The
pods may not create Events: that right cannot be narrowed to their own pods."""

from __future__ import annotations

from typing import Any

from rlkube_api.names import CONTROLLER_ROLE, child_name, exit_records_name
from rlkube_api.rljob import RLJob
from rlkube_operator.children.labels import job_labels


def trainer_service_account_name(job: RLJob) -> str:
    return job.spec.service_account_name or f"{job.metadata.name}-trainer"


def driver_pod_name(job: RLJob) -> str:
    return f"{child_name(job.metadata.name or '', CONTROLLER_ROLE)}-0"


def rbac_children(job: RLJob) -> list[dict[str, Any]]:
    job_name = job.metadata.name or ""
    name = f"{job_name}-progress"
    meta = {"namespace": job.metadata.namespace, "labels": job_labels(job)}
    children: list[dict[str, Any]] = []
    if job.spec.service_account_name is None:
        children.append(
            {
                "apiVersion": "v1",
                "kind": "ServiceAccount",
                "metadata": {"name": trainer_service_account_name(job), **meta},
                "automountServiceAccountToken": True,
            }
        )
    # Created empty; the trainer adds its pods' records (server-side apply leaves them be).
    children.append(
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": exit_records_name(job_name), **meta}}
    )
    children.append(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": name, **meta},
            "rules": [
                {
                    "apiGroups": [""],
                    "resources": ["pods"],
                    "resourceNames": [driver_pod_name(job)],
                    "verbs": ["get", "patch"],
                },
                {
                    "apiGroups": [""],
                    "resources": ["configmaps"],
                    "resourceNames": [exit_records_name(job_name)],
                    "verbs": ["patch"],
                },
            ],
        }
    )
    children.append(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": name, **meta},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [
                {
                    "kind": "ServiceAccount",
                    "name": trainer_service_account_name(job),
                    "namespace": job.metadata.namespace,
                }
            ],
        }
    )
    return children
