"""Pure builders: an RLJob in, the manifests of its children out.

One module per child kind in `children/` (statefulset, service, configmap, secret, rbac,
networkpolicy; PodGroups come from the gang plugins). Nothing here talks to the API server.
"""

from __future__ import annotations

from typing import Any

from rlkube_api.rljob import RLJob
from rlkube_operator.children.configmap import config_map
from rlkube_operator.children.labels import owner_reference
from rlkube_operator.children.networkpolicy import network_policies
from rlkube_operator.children.rbac import rbac_children
from rlkube_operator.children.secret import ray_token_secret
from rlkube_operator.children.service import headless_service
from rlkube_operator.children.statefulset import stateful_set
from rlkube_operator.children.topology import pod_roles
from rlkube_operator.gang import plugin_for

Manifest = dict[str, Any]


def desired_children(job: RLJob, uid: str, attempt: int, pods_wanted: bool, ray_token: str) -> list[Manifest]:
    """Every child of the job. With `pods_wanted` False (suspended, finished) the
    StatefulSets stay but scale to zero, so nothing holds GPUs."""
    gang = plugin_for(job)
    children: list[Manifest] = [config_map(job), ray_token_secret(job, ray_token)]
    children += rbac_children(job)
    children += network_policies(job)
    children += gang.children(job)
    for role in pod_roles(job):
        children.append(headless_service(job, role))
        replicas = role.replicas if pods_wanted else 0
        children.append(stateful_set(job, role, attempt, replicas, gang.pod_patch(job, role.name, attempt)))
    owner = owner_reference(job, uid)
    for child in children:
        meta = child["metadata"]
        meta["ownerReferences"] = [owner]
    return children
