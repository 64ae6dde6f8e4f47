"""The objects a job's pods name and Kubernetes must find before they can start: the
ConfigMaps, Secrets and PersistentVolumeClaims of their volumes, environment and image
pulls. Read from the pod templates the builders make, so that what a pod names is written
once (statefulset.py, overrides.py). Optional ones are left out (a pod starts without
them), and so are the job's own children (its config ConfigMap and Ray token Secret),
which the operator creates before any StatefulSet."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal, TypeGuard

from rlkube_api.names import config_map_name
from rlkube_api.rljob import RLJob
from rlkube_operator.children.secret import ray_secret_name
from rlkube_operator.children.statefulset import pod_template
from rlkube_operator.children.topology import pod_roles
from rlkube_operator.gang import plugin_for

Kind = Literal["ConfigMap", "Secret", "PersistentVolumeClaim"]
Obj = dict[str, Any]


@dataclass(frozen=True, order=True)
class Reference:
    """An object a pod names, and where it names it (for the message; not part of its identity)."""

    kind: Kind
    name: str
    use: str = field(default="", compare=False)

    def __str__(self) -> str:
        return f"{self.kind} {self.name} ({self.use})" if self.use else f"{self.kind} {self.name}"


def _required(source: Any) -> TypeGuard[Obj]:
    """A reference the pod cannot start without (not `optional: true`)."""
    return isinstance(source, dict) and not source.get("optional")


def _volume_references(volume: Obj) -> Iterator[Reference]:
    use = f"volume {volume.get('name', '')}"
    if _required(config_map := volume.get("configMap")):
        yield Reference("ConfigMap", config_map.get("name", ""), use)
    if _required(secret := volume.get("secret")):
        yield Reference("Secret", secret.get("secretName", ""), use)
    if isinstance(claim := volume.get("persistentVolumeClaim"), dict):
        yield Reference("PersistentVolumeClaim", claim.get("claimName", ""), use)
    for projection in (volume.get("projected") or {}).get("sources") or []:
        if _required(config_map := projection.get("configMap")):
            yield Reference("ConfigMap", config_map.get("name", ""), use)
        if _required(secret := projection.get("secret")):
            yield Reference("Secret", secret.get("name", ""), use)


def _container_references(container: Obj) -> Iterator[Reference]:
    where = f"container {container.get('name', '')}"
    for env in container.get("env") or []:
        source = env.get("valueFrom") or {}
        use = f"env {env.get('name', '')} of {where}"
        if _required(ref := source.get("configMapKeyRef")):
            yield Reference("ConfigMap", ref.get("name", ""), use)
        if _required(ref := source.get("secretKeyRef")):
            yield Reference("Secret", ref.get("name", ""), use)
    for env_from in container.get("envFrom") or []:
        use = f"envFrom of {where}"
        if _required(ref := env_from.get("configMapRef")):
            yield Reference("ConfigMap", ref.get("name", ""), use)
        if _required(ref := env_from.get("secretRef")):
            yield Reference("Secret", ref.get("name", ""), use)


def pod_references(pod: Obj) -> list[Reference]:
    """What a pod spec names and cannot start without, each object once (its first use)."""
    found: list[Reference] = []
    for volume in pod.get("volumes") or []:
        found += _volume_references(volume)
    for container in [*(pod.get("initContainers") or []), *(pod.get("containers") or [])]:
        found += _container_references(container)
    # The kubelet pulls without a missing pull Secret, and a private registry then refuses
    # the image: named, the Secret is meant to be there.
    found += [Reference("Secret", s.get("name", ""), "imagePullSecrets") for s in pod.get("imagePullSecrets") or []]
    unique: dict[tuple[str, str], Reference] = {}
    for ref in found:
        if ref.name:
            unique.setdefault((ref.kind, ref.name), ref)
    return list(unique.values())


def job_references(job: RLJob) -> list[Reference]:
    """What the job's pods (every role's) name besides the job's own children, sorted."""
    gang = plugin_for(job)
    own = {("ConfigMap", config_map_name(job.metadata.name or "")), ("Secret", ray_secret_name(job))}
    found: dict[tuple[str, str], Reference] = {}
    for role in pod_roles(job):
        template = pod_template(job, role, 0, gang.pod_patch(job, role.name, 0))
        for ref in pod_references(template["spec"]):
            if (ref.kind, ref.name) not in own:
                found.setdefault((ref.kind, ref.name), ref)
    return sorted(found.values())
