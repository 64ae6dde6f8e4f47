"""The operator's calls to the API server: server-side apply of children, pod
deletion for gang restarts, scaling down, status patches. Thin and blocking;
the reconciler runs them in worker threads."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any, Protocol

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from rlkube_api.names import LABEL_JOB, exit_records_name
from rlkube_api.rljob import GROUP, PLURAL, VERSION
from rlkube_api.runtime import CLUSTER_KIND, CLUSTER_PLURAL
from rlkube_api.runtime import KIND as RUNTIME_KIND
from rlkube_api.runtime import PLURAL as RUNTIME_PLURAL
from rlkube_operator.children.secret import ray_secret_name_of
from rlkube_operator.observed import event_time, parse_time

FIELD_MANAGER = "rlkube-operator"
# A GET that returns only the object's metadata (PartialObjectMetadata).
METADATA_ONLY = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
METADATA_ONLY_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
log = logging.getLogger(__name__)

# Plural resource names of the kinds the operator creates or looks up.
PLURALS = {
    "ConfigMap": "configmaps",
    "Secret": "secrets",
    "Service": "services",
    "StatefulSet": "statefulsets",
    "PodGroup": "podgroups",
    "ServiceAccount": "serviceaccounts",
    "Role": "roles",
    "RoleBinding": "rolebindings",
    "NetworkPolicy": "networkpolicies",
    "PersistentVolumeClaim": "persistentvolumeclaims",
}
# Kinds deleted when ttlSecondsAfterFinished elapses, as (apiVersion, kind).
RUNTIME_PLURALS = {RUNTIME_KIND: RUNTIME_PLURAL, CLUSTER_KIND: CLUSTER_PLURAL}
CHILD_KINDS = (
    ("apps/v1", "StatefulSet"),
    ("v1", "Service"),
    ("v1", "ConfigMap"),
    ("v1", "ServiceAccount"),
    ("rbac.authorization.k8s.io/v1", "Role"),
    ("rbac.authorization.k8s.io/v1", "RoleBinding"),
    ("networking.k8s.io/v1", "NetworkPolicy"),
    ("scheduling.volcano.sh/v1beta1", "PodGroup"),
    ("scheduling.x-k8s.io/v1alpha1", "PodGroup"),
)


def connect(pool_size: int) -> client.ApiClient:
    """A client for the cluster the operator runs in (or the kubeconfig's, outside one)."""
    try:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    except config.ConfigException:
        config.load_kube_config()  # type: ignore[no-untyped-call]
    configuration = client.Configuration.get_default_copy()
    # One pooled connection per thread that calls the API (the default, CPUs x 5, is 10 on 2 cores).
    configuration.connection_pool_maxsize = pool_size
    return client.ApiClient(configuration)


def _collection_path(api_version: str, kind: str, namespace: str) -> str:
    base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    return f"{base}/namespaces/{namespace}/{PLURALS[kind]}"


class Cluster(Protocol):
    """The calls a reconcile pass makes (Kube, or a test's fake that records them)."""

    def apply(self, manifest: dict[str, Any], dry_run: bool = False) -> None: ...
    def create(self, manifest: dict[str, Any]) -> bool: ...
    def delete_pods(self, namespace: str, pods: Iterable[tuple[str, str]], grace_period_seconds: int = 0) -> None: ...
    def scale_to_zero(self, namespace: str, stateful_sets: Iterable[str]) -> None: ...
    def delete_children(self, namespace: str, job: str) -> None: ...
    def exists(self, namespace: str, kind: str, name: str) -> bool: ...
    def read_runtime(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None: ...
    def create_failure(self, namespace: str, stateful_set: str) -> tuple[datetime, str] | None: ...
    def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> dict[str, Any]: ...
    def pod_warning(self, namespace: str, uid: str) -> str | None: ...
    def pod_events(self, namespace: str, uid: str) -> list[dict[str, Any]]: ...
    def exit_records(self, namespace: str, job: str) -> dict[str, dict[str, Any]]: ...
    def node_labels(self) -> list[dict[str, str]]: ...


class Kube:
    def __init__(self, api: client.ApiClient) -> None:
        self.api = api
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)

    def _call(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: list[tuple[str, Any]] | None = None,
        content_type: str = "application/json",
        accept: str = "application/json",
    ) -> Any:
        """A raw request for what the typed API classes don't cover (server-side apply, any kind)."""
        if body is not None and "yaml" in content_type:
            body = json.dumps(body)  # JSON is YAML; the client only serializes JSON content types itself
        method_, url, headers, body_, _ = self.api.param_serialize(
            method=method,
            resource_path=path,
            query_params=query or [],
            header_params={"Content-Type": content_type, "Accept": accept},
            body=body,
            auth_settings=["BearerToken"],
        )
        response = self.api.call_api(method_, url, header_params=headers, body=body_)
        response.read()  # type: ignore[no-untyped-call]
        if not 200 <= response.status < 300:
            raise ApiException(http_resp=response)
        return json.loads(response.data or b"{}")

    def apply(self, manifest: dict[str, Any], dry_run: bool = False) -> None:
        """Server-side apply: idempotent, and the operator owns the fields it sets. With
        `dry_run`, only validated and admitted, nothing stored."""
        meta = manifest["metadata"]
        path = f"{_collection_path(manifest['apiVersion'], manifest['kind'], meta['namespace'])}/{meta['name']}"
        self._call(
            "PATCH",
            path,
            body=manifest,
            query=[("fieldManager", FIELD_MANAGER), ("force", "true"), *([("dryRun", "All")] if dry_run else [])],
            content_type="application/apply-patch+yaml",
        )

    def create(self, manifest: dict[str, Any]) -> bool:
        """Creates the object; False when one of that name exists already (left as it is)."""
        meta = manifest["metadata"]
        try:
            self._call("POST", _collection_path(manifest["apiVersion"], manifest["kind"], meta["namespace"]), manifest)
        except ApiException as exc:
            if exc.status == 409:
                return False
            raise
        return True

    def delete_pods(self, namespace: str, pods: Iterable[tuple[str, str]], grace_period_seconds: int = 0) -> None:
        """Deletes (name, uid) pods, giving each `grace_period_seconds` between SIGTERM and
        SIGKILL. The UID precondition matters: a StatefulSet reuses a pod's name at once, and
        only the object we saw may go, never its successor."""
        for name, uid in pods:
            body = client.V1DeleteOptions(
                grace_period_seconds=grace_period_seconds, preconditions=client.V1Preconditions(uid=uid)
            )
            try:
                self.core.delete_namespaced_pod(name, namespace, body=body)
            except ApiException as exc:
                if exc.status not in (404, 409):  # gone already, or already replaced
                    raise

    def scale_to_zero(self, namespace: str, stateful_sets: Iterable[str]) -> None:
        """Sets these StatefulSets' replicas to 0; a merge patch never recreates one that was deleted."""
        path = _collection_path("apps/v1", "StatefulSet", namespace)
        for name in stateful_sets:
            try:
                self._call(
                    "PATCH",
                    f"{path}/{name}",
                    body={"spec": {"replicas": 0}},
                    content_type="application/merge-patch+json",
                )
            except ApiException as exc:
                if exc.status != 404:
                    raise

    def delete_children(self, namespace: str, job: str) -> None:
        """Deletes every child (pods go with their StatefulSets). The Secret is deleted by its
        name rather than found by label: listing Secrets would return every Secret's data,
        a permission the operator does not need otherwise."""
        self._delete(f"/api/v1/namespaces/{namespace}/secrets/{ray_secret_name_of(job)}")
        selector = f"{LABEL_JOB}={job}"
        for api_version, kind in CHILD_KINDS:
            path = _collection_path(api_version, kind, namespace)
            try:
                found = self._call("GET", path, query=[("labelSelector", selector)])
            except ApiException as exc:
                # 404: a PodGroup CRD that isn't installed; 403: one this operator may not use
                # (its chart grants only the gang schedulers it was installed for).
                if exc.status in (403, 404) and kind == "PodGroup":
                    continue
                raise
            for item in found.get("items", []):
                self._delete(f"{path}/{item['metadata']['name']}")

    def _delete(self, path: str) -> None:
        try:
            self._call("DELETE", path, query=[("propagationPolicy", "Background")])
        except ApiException as exc:
            if exc.status != 404:
                raise

    def exists(self, namespace: str, kind: str, name: str) -> bool:
        """Whether the object exists. A ConfigMap or claim: a GET of its metadata only. A
        Secret: a dry-run create of an empty one of that name, which the API server answers
        409 when the name is taken and stores nothing either way; the operator may create
        Secrets (the job's Ray token) but never read one. An object this operator may not
        check (403, an older chart's RBAC; an admission webhook that refuses dry runs) counts
        as present: the job is not held back for what cannot be checked."""
        collection = _collection_path("v1", kind, namespace)
        secret = kind == "Secret"
        try:
            if secret:
                probe = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": namespace}}
                self._call("POST", collection, probe, query=[("dryRun", "All")])
                return False
            self._call("GET", f"{collection}/{name}", accept=METADATA_ONLY)
        except ApiException as exc:
            if exc.status == 409 and secret:
                return True
            if exc.status == 404 and not secret:
                return False
            if exc.status in (400, 403, 404, 422):
                log.warning("could not check %s %s/%s (%s): not held back for it", kind, namespace, name, exc.reason)
                return True
            raise
        return True

    def read_runtime(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        """An RLJobRuntime (in `namespace`) or ClusterRLJobRuntime, or None when there is none."""
        plural = RUNTIME_PLURALS[kind]
        where = f"namespaces/{namespace}/" if kind == RUNTIME_KIND else ""
        try:
            found: dict[str, Any] = self._call("GET", f"/apis/{GROUP}/{VERSION}/{where}{plural}/{name}")
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return found

    def pod_warning(self, namespace: str, uid: str) -> str | None:
        """The pod's latest Warning Event as "Reason: message" (the kubelet's FailedMount, say).
        By UID: a pod of an earlier attempt had the same name, and Events of its own."""
        items = [e for e in self.pod_events(namespace, uid) if e.get("type") == "Warning"]
        if not items:
            return None
        latest = max(items, key=event_time)
        return f"{latest.get('reason', '')}: {latest.get('message', '')}"

    def node_labels(self) -> list[dict[str, str]]:
        """Every node's labels (metadata only). Without the right to list nodes (an older chart's
        RBAC), none: nothing is held for what cannot be checked."""
        try:
            found = self._call("GET", "/api/v1/nodes", accept=METADATA_ONLY_LIST)
        except ApiException as exc:
            if exc.status == 403:
                log.warning("may not list nodes: GPU memory labels not read")
                return []
            raise
        return [dict((item.get("metadata") or {}).get("labels") or {}) for item in found.get("items") or []]

    def pod_events(self, namespace: str, uid: str) -> list[dict[str, Any]]:
        """The Events about one pod, by its UID (they outlive the pod, an hour by default)."""
        selector = f"involvedObject.kind=Pod,involvedObject.uid={uid}"
        found = self._call("GET", f"/api/v1/namespaces/{namespace}/events", query=[("fieldSelector", selector)])
        return list(found.get("items") or [])

    def exit_records(self, namespace: str, job: str) -> dict[str, dict[str, Any]]:
        """The exit records the job's trainer containers wrote, by pod UID (the job's
        exit-record ConfigMap; empty when it is gone). A record that does not parse is left out."""
        try:
            found = self._call("GET", f"/api/v1/namespaces/{namespace}/configmaps/{exit_records_name(job)}")
        except ApiException as exc:
            if exc.status == 404:
                return {}
            raise
        records = {}
        for uid, text in (found.get("data") or {}).items():
            try:
                record = json.loads(text)
            except ValueError:
                continue
            if isinstance(record, dict):
                records[uid] = record
        return records

    def create_failure(self, namespace: str, stateful_set: str) -> tuple[datetime, str] | None:
        """When the StatefulSet's controller last failed to create a pod, and why (its
        FailedCreate Warning Event), if it has."""
        selector = (
            f"involvedObject.kind=StatefulSet,involvedObject.name={stateful_set},type=Warning,reason=FailedCreate"
        )
        found = self._call("GET", f"/api/v1/namespaces/{namespace}/events", query=[("fieldSelector", selector)])
        items = found.get("items") or []
        if not items:
            return None
        latest = max(items, key=event_time)
        seen = parse_time(event_time(latest))
        return (seen or datetime.min.replace(tzinfo=UTC)), str(latest.get("message", ""))

    def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> dict[str, Any]:
        """Merge-patches the status subresource; returns the object as stored."""
        path = f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}/{name}/status"
        stored: dict[str, Any] = self._call(
            "PATCH", path, body={"status": status}, content_type="application/merge-patch+json"
        )
        return stored
