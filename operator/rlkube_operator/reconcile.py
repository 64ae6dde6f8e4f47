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


@dataclass
class AppliedCache:
    """Hashes of what was last applied, so unchanged children are not re-sent."""

    hashes: dict[tuple[str, str, str], tuple[str, float]] = field(default_factory=dict)

    def needs_apply(self, uid: str, manifest: dict[str, Any], now: float) -> bool:
        key = (uid, manifest["kind"], manifest["metadata"]["name"])
        digest = hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()
        seen = self.hashes.get(key)
        return seen is None or seen[0] != digest or now - seen[1] > RESYNC_SECONDS

    def record(self, uid: str, manifest: dict[str, Any], now: float) -> None:
        key = (uid, manifest["kind"], manifest["metadata"]["name"])
        digest = hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()
        self.hashes[key] = (digest, now)

    def forget(self, uid: str, kind: str | None = None) -> None:
        for key in [k for k in self.hashes if k[0] == uid and (kind is None or k[1] == kind)]:
            del self.hashes[key]


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
        self.applied = AppliedCache()
        self.ray_tokens: dict[str, str] = {}
        # uid -> time.monotonic() of the job's last status write.
        self.last_write: dict[str, float] = {}
        # uid -> ((generation, attempt, pods_wanted), children): built once per spec generation.
        # Building renders and validates the trainer config (~15 ms); most passes change nothing.
        self._children: dict[str, tuple[tuple[int | None, int, bool], list[dict[str, Any]]]] = {}

    def children(self, job: RLJob, uid: str, attempt: int, pods_wanted: bool) -> list[dict[str, Any]]:
        """desired_children, from a cache keyed by what they depend on: the spec generation
        (name and namespace are immutable; the Ray token is fixed per uid), attempt and pods."""
        key = (job.metadata.generation, attempt, pods_wanted)
        cached = self._children.get(uid)
        if cached is None or cached[0] != key:
            cached = (key, desired_children(job, uid, attempt, pods_wanted, self.ray_token(job, uid)))
            self._children[uid] = cached
        return cached[1]

    def forget(self, uid: str) -> None:
        """Drops what is kept about a deleted job."""
        self.applied.forget(uid)
        self.ray_tokens.pop(uid, None)
        self.last_write.pop(uid, None)
        self._children.pop(uid, None)

    def ray_token(self, job: RLJob, uid: str) -> str:
        """The job's Ray token: read from its Secret, or made once when there is none."""
        if uid not in self.ray_tokens:
            namespace = job.metadata.namespace or ""
            existing = self.kube.read_secret_value(namespace, ray_secret_name(job), TOKEN_KEY)
            self.ray_tokens[uid] = existing or secrets.token_urlsafe(32)
        return self.ray_tokens[uid]

    def apply_children(
        self, job: RLJob, uid: str, attempt: int, pods_wanted: bool, present: set[str], force: bool = False
    ) -> dict[str, str]:
        """Applies what changed (or is missing); returns 'Kind/name' -> error for refusals."""
        errors: dict[str, str] = {}
        now = time.monotonic()
        for child in self.children(job, uid, attempt, pods_wanted):
            name = f"{child['kind']}/{child['metadata']['name']}"
            missing = child["kind"] == "StatefulSet" and child["metadata"]["name"] not in present
            if not (force or missing or self.applied.needs_apply(uid, child, now)):
                continue
            try:
                self.kube.apply(child)
                self.applied.record(uid, child, now)
            except ApiException as exc:
                errors[name] = _api_error(exc)
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
            self.applied.forget(uid)
            self._children.pop(uid, None)
        if decision.delete_children:
            self.kube.delete_children(namespace, name)
        if status.state == "Running" and prev.state in (None, "Pending", "Created") and status.restart_count == 0:
            created = datetime.fromisoformat(meta["creationTimestamp"].replace("Z", "+00:00"))
            METRICS.time_to_running.observe((now - created).total_seconds())
        written = None
        requeue = decision.requeue_after
        since = time.monotonic() - self.last_write.get(uid, -math.inf)
        delay = status_write_delay(prev, status, since, COUNTS_WRITE_INTERVAL)
        if delay == 0:
            written = self.kube.patch_status(namespace, name, status_patch(status))
            self.last_write[uid] = time.monotonic()
        elif delay is not None:
            # Nothing is lost: the next pass computes the status afresh from the pods.
            requeue = delay if requeue is None else min(requeue, delay)
        if status.state in TERMINAL:
            self.last_write.pop(uid, None)
        return ReconcileResult(decision.events, written, status.state, requeue)


def _attempt(pod: dict[str, Any]) -> int:
    return int((pod["metadata"].get("annotations") or {}).get(ANNOTATION_ATTEMPT, "0"))


def _api_error(exc: ApiException) -> str:
    try:
        body = json.loads(exc.body or "{}")
        return str(body.get("message") or exc.reason)
    except (ValueError, TypeError):
        return str(exc.reason)
