"""One reconcile pass, in the one direction the design asks for:

spec → validated model → pure builders → server-side apply → observed pods →
pure status function → status patch and actions (restart the gang, scale down,
clean up after the TTL).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import secrets
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from kubernetes.client.exceptions import ApiException

from rlkube_api.names import ANNOTATION_ATTEMPT
from rlkube_api.rljob import RLJob, RLJobStatus
from rlkube_api.validation import InvalidSpec, parse_rljob
from rlkube_operator.children.secret import TOKEN_KEY, ray_secret_name
from rlkube_operator.desired import desired_children
from rlkube_operator.kube import Kube
from rlkube_operator.metrics import METRICS
from rlkube_operator.observed import view_pod
from rlkube_operator.status import TERMINAL, Event, Observed, compute_status, status_write_delay

log = logging.getLogger(__name__)
# Children are re-applied at least this often even when unchanged, to repair drift.
RESYNC_SECONDS = 300.0
# A status change that is only counts and messages (not a transition) waits at most this
# long after the job's previous status write, collecting what happens meanwhile.
COUNTS_WRITE_INTERVAL = 1.0


ChildKey = tuple[str, str]  # (kind, name)


def _digest(manifest: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()


@dataclass
class JobMemory:
    """What the reconciler keeps about one job between passes; dropped when it finishes or goes."""

    # Read from the job's Secret, or made, once: the children carry it.
    ray_token: str | None = None
    # The children with their digests, built for (spec generation, attempt, pods wanted):
    # building validates and renders the trainer config (~15 ms), and most passes change nothing.
    built_for: tuple[int | None, int, bool] | None = None
    children: list[tuple[dict[str, Any], str]] = field(default_factory=list)
    # (kind, name) -> (digest, time.monotonic()) of the last apply, so unchanged children are not re-sent.
    applied: dict[ChildKey, tuple[str, float]] = field(default_factory=dict)
    # time.monotonic() of the last status write.
    last_write: float = -math.inf

    def needs_apply(self, manifest: dict[str, Any], digest: str, now: float) -> bool:
        seen = self.applied.get((manifest["kind"], manifest["metadata"]["name"]))
        return seen is None or seen[0] != digest or now - seen[1] > RESYNC_SECONDS


def status_patch(status: RLJobStatus) -> dict[str, Any]:
    """A merge patch: present fields set, fields now unset removed (null)."""
    patch: dict[str, Any] = status.to_wire()
    for name, info in RLJobStatus.model_fields.items():
        if getattr(status, name) is None:
            patch[info.alias or name] = None
    return patch


@dataclass
class ReconcileResult:
    events: list[Event] = field(default_factory=list)
    # The RLJob as returned by our status patch, newer than the watch may have delivered yet.
    written: dict[str, Any] | None = None
    state: str | None = None
    requeue_after: float | None = None


class Reconciler:
    def __init__(self, kube: Kube) -> None:
        self.kube = kube
        self.jobs: dict[str, JobMemory] = {}  # by uid

    def forget(self, uid: str) -> None:
        """Drops what is kept about a job (deleted, or finished)."""
        self.jobs.pop(uid, None)

    def children(self, job: RLJob, uid: str, attempt: int, pods_wanted: bool) -> list[tuple[dict[str, Any], str]]:
        """desired_children with their digests, built again only when what they depend on
        changes: the spec generation (name and namespace are immutable, the Ray token is fixed
        per uid), the attempt and whether pods are wanted."""
        memory = self.jobs.setdefault(uid, JobMemory())
        key = (job.metadata.generation, attempt, pods_wanted)
        if memory.built_for != key:
            built = desired_children(job, uid, attempt, pods_wanted, self.ray_token(job, memory))
            memory.children = [(child, _digest(child)) for child in built]
            memory.built_for = key
        return memory.children

    def ray_token(self, job: RLJob, memory: JobMemory) -> str:
        """The job's Ray token: read from its Secret, or made once when there is none."""
        if memory.ray_token is None:
            namespace = job.metadata.namespace or ""
            existing = self.kube.read_secret_value(namespace, ray_secret_name(job), TOKEN_KEY)
            memory.ray_token = existing or secrets.token_urlsafe(32)
        return memory.ray_token

    def apply_children(
        self, job: RLJob, uid: str, attempt: int, pods_wanted: bool, present: set[str], force: bool = False
    ) -> dict[str, str]:
        """Applies what changed (or is missing); returns 'Kind/name' -> error for refusals."""
        errors: dict[str, str] = {}
        now = time.monotonic()
        memory = self.jobs.setdefault(uid, JobMemory())
        for child, digest in self.children(job, uid, attempt, pods_wanted):
            kind, name = child["kind"], child["metadata"]["name"]
            missing = kind == "StatefulSet" and name not in present
            if not (force or missing or memory.needs_apply(child, digest, now)):
                continue
            try:
                self.kube.apply(child)
                memory.applied[(kind, name)] = (digest, now)
            except ApiException as exc:
                errors[f"{kind}/{name}"] = _api_error(exc)
        return errors

    def reconcile(
        self,
        body: dict[str, Any],
        pods: list[dict[str, Any]],
        present_sets: set[str],
        now: datetime | None = None,
    ) -> ReconcileResult:
        now = now or datetime.now(UTC)
        meta = body["metadata"]
        namespace, name, uid = meta["namespace"], meta["name"], meta["uid"]
        try:
            job = parse_rljob(body, f"RLJob {namespace}/{name}", admitted=True)
        except InvalidSpec as exc:
            # The CRD refuses invalid specs; this only happens with an older CRD installed.
            return ReconcileResult([Event("Warning", "InvalidSpec", str(exc))])
        prev = job.status or RLJobStatus()
        errors: dict[str, str] = {}
        if prev.state not in TERMINAL:
            errors = self.apply_children(
                job, uid, prev.restart_count, pods_wanted=not job.spec.suspend, present=present_sets
            )
        decision = compute_status(job, Observed([view_pod(p) for p in pods], now, errors))
        status = decision.status

        if decision.restart_gang:
            # New templates first (the attempt annotation), then the old gang goes.
            self.apply_children(job, uid, status.restart_count, pods_wanted=True, present=present_sets, force=True)
            METRICS.restarts.labels(namespace=namespace).inc()
        stale = [
            (p["metadata"]["name"], p["metadata"]["uid"])
            for p in pods
            if _attempt(p) < status.restart_count and not p["metadata"].get("deletionTimestamp")
        ]
        if stale:
            self.kube.delete_pods(namespace, stale)
        if status.state in TERMINAL and prev.state not in TERMINAL:
            self.kube.scale_to_zero(namespace, name)
        if decision.delete_children:
            self.kube.delete_children(namespace, name)
        if status.state == "Running" and prev.state in (None, "Pending", "Created") and status.restart_count == 0:
            created = datetime.fromisoformat(meta["creationTimestamp"].replace("Z", "+00:00"))
            METRICS.time_to_running.observe((now - created).total_seconds())
        written = None
        requeue = decision.requeue_after
        memory = self.jobs.setdefault(uid, JobMemory())
        delay = status_write_delay(prev, status, time.monotonic() - memory.last_write, COUNTS_WRITE_INTERVAL)
        if delay == 0:
            written = self.kube.patch_status(namespace, name, status_patch(status))
            memory.last_write = time.monotonic()
        elif delay is not None:
            # Nothing is lost: the next pass computes the status afresh from the pods.
            requeue = delay if requeue is None else min(requeue, delay)
        if status.state in TERMINAL:
            self.forget(uid)  # no more children to apply, and every later write is a transition
        return ReconcileResult(decision.events, written, status.state, requeue)


def _attempt(pod: dict[str, Any]) -> int:
    return int((pod["metadata"].get("annotations") or {}).get(ANNOTATION_ATTEMPT, "0"))


def _api_error(exc: ApiException) -> str:
    try:
        body = json.loads(exc.body or "{}")
        return str(body.get("message") or exc.reason)
    except (ValueError, TypeError):
        return str(exc.reason)
