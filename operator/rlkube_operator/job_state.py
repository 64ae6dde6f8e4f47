"""What the operator keeps about one RLJob between passes, in one typed object per job,
keyed by (namespace, name) and dropped when the job is deleted.

Two sides touch it: the event loop (watch events: the newest body, lost pods, the wake-up)
and the job's one reconcile thread at a time (children, digests, the last write). Neither
side writes the other's fields."""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

JobKey = tuple[str, str]  # (namespace, name)
ChildKey = tuple[str, str]  # (kind, name)
Manifest = dict[str, Any]

# Children are re-applied at least this often even when unchanged, to repair drift.
RESYNC_SECONDS = 300.0


def digest(manifest: Manifest) -> str:
    return hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()


def version(body: Manifest | None) -> int:
    """metadata.resourceVersion as a number (-1 when absent)."""
    try:
        return int((body or {})["metadata"]["resourceVersion"])
    except (KeyError, TypeError, ValueError):
        return -1


@dataclass
class TrackedJob:
    namespace: str
    name: str

    # --- the event loop's side -------------------------------------------------------------------
    # The job as the watch last delivered it (without managedFields).
    body: Manifest = field(default_factory=dict)
    # The job as our own last status patch returned it, while newer than `body`.
    written: Manifest | None = None
    # Failed or lost pods by uid, kept until the next pass: a StatefulSet may replace a pod
    # before the loop looks at the job.
    lost_pods: dict[str, Manifest] = field(default_factory=dict)
    # The state the last pass decided (the job-state gauge counts these).
    state: str | None = None
    wakeup: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None

    # --- the reconcile thread's side -------------------------------------------------------------
    # The job's uid when the fields below were filled: a job deleted and created again under
    # the same name starts afresh.
    uid: str = ""
    # Made once: the job's Secret carries it when this operator creates that Secret.
    ray_token: str | None = None
    # What the children were last built for, (spec generation, attempt, pods wanted), and
    # their (kind, name): they are the same until that changes. Building validates and
    # renders the trainer config (~15 ms) and most passes change nothing, so a pass builds
    # only when the key changed, a child is due for a resync or was refused, or a
    # StatefulSet is missing. The manifests themselves are not kept (~70 KB a job).
    built_for: tuple[int | None, int, bool] | None = None
    child_keys: list[ChildKey] = field(default_factory=list)
    # (kind, name) -> (digest, time.monotonic()) of the last apply, so unchanged children are not re-sent.
    applied: dict[ChildKey, tuple[str, float]] = field(default_factory=dict)
    # "Kind/name" -> error from the last apply, for the Created condition.
    apply_errors: dict[str, str] = field(default_factory=dict)
    # Of those, the refusals of the object itself (400, 422), and the spec generation they
    # were made for: they fail the job until the spec changes.
    invalid_children: dict[str, str] = field(default_factory=dict)
    invalid_generation: int | None = None
    # The spec generation whose StatefulSets passed a dry-run apply (all or nothing: none is
    # created before every one would be accepted).
    validated_generation: int | None = None
    # time.monotonic() of the last status write.
    last_write: float = -math.inf
    # A job with a runtimeRef: the digest of its spec and runtime copy whose merge passed every
    # RLJob rule (runtimes.resolve_checked), so that an unchanged merge is not checked again.
    runtime_checked: str | None = None
    # StatefulSet name -> (the pass time it was read at, its latest FailedCreate Event or None),
    # for those short of pods: read again only every few seconds, however often pods wake the job.
    create_failures_read: dict[str, tuple[datetime, tuple[datetime, str] | None]] = field(default_factory=dict)

    @property
    def key(self) -> JobKey:
        return (self.namespace, self.name)

    def newest(self) -> Manifest:
        """The live body, unless our own last status patch is newer than what the watch delivered."""
        if self.written is not None and version(self.written) > version(self.body):
            return dict(self.written)
        return dict(self.body)

    def delivered(self, body: Manifest) -> bool:
        """Takes a body from the watch; False when it is only the echo of our own status patch
        (nothing new to look at)."""
        self.body = body
        if self.written is not None and version(body) >= version(self.written):
            echo = version(body) == version(self.written)
            self.written = None  # the watch caught up: one copy is enough
            return not echo
        return True

    def remember_written(self, stored: Manifest) -> None:
        """Keeps our status patch's result until the watch delivers it (or something newer)."""
        if version(stored) > version(self.body):
            self.written = stored

    def wake(self) -> None:
        self.wakeup.set()

    def take_lost_pods(self) -> dict[str, Manifest]:
        lost, self.lost_pods = self.lost_pods, {}
        return lost

    # --- reconcile side ---------------------------------------------------------------------------

    def adopt(self, uid: str) -> None:
        """Starts afresh when the job under this name is another object than before."""
        if uid != self.uid:
            self.forget_children()
            self.ray_token = None
            self.last_write = -math.inf
            self.apply_errors = {}
            self.invalid_children, self.invalid_generation, self.validated_generation = {}, None, None
            self.create_failures_read = {}
            self.uid = uid

    def forget_children(self) -> None:
        """Drops the built children and their digests (the job finished: none are applied again)."""
        self.built_for = None
        self.child_keys = []
        self.applied = {}

    def needs_apply(self, manifest: Manifest, child_digest: str, now: float) -> bool:
        seen = self.applied.get((manifest["kind"], manifest["metadata"]["name"]))
        return seen is None or seen[0] != child_digest or now - seen[1] > RESYNC_SECONDS

    def children_in_place(self, key: tuple[int | None, int, bool], present_sets: set[str], now: float) -> bool:
        """Whether the children built for `key` were all applied, recently enough, and every
        StatefulSet among them still exists: then nothing needs building or applying."""
        if self.built_for != key or not self.child_keys:
            return False
        for kind, name in self.child_keys:
            seen = self.applied.get((kind, name))
            if seen is None or now - seen[1] > RESYNC_SECONDS:
                return False
            if kind == "StatefulSet" and name not in present_sets:
                return False
        return True
