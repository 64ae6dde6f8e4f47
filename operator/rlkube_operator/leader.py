"""Leader election over a coordination.k8s.io Lease, as client-go's leaderelection does it:
several replicas run, one holds the Lease and reconciles, the others wait to take it over.

kopf's peering is not leader election (replicas of equal priority all pause). Every replica
runs kopf, so its watches and indexes are warm, but the per-job loops reconcile only while
the replica holds the Lease (handlers.OperatorState.leading): a standby that takes over acts
at once instead of first starting up. The holder renews the
Lease every `renew_every` seconds; a standby takes it once it has seen the same record for
`duration` seconds. Expiry is judged by the standby's own clock (how long the record stayed
unchanged), never by comparing its clock with the holder's renewTime, so clock skew between
nodes does not matter. A holder that cannot renew within `duration` stops (the pod restarts
and becomes a standby); one that stops normally hands the Lease back at once, and a standby
takes a handed-back Lease at its next look (`retry_every`). `leaseTransitions` counts every
change of holder, a take-over of a handed-back Lease included, as client-go counts them.

Every API call has a deadline (`request_timeout`) and any failure of one (an API error, a
refused or timed-out connection) counts as "not holding it this time": the election thread
never dies of a network error, which would leave a standby that never takes over or a
holder that reconciles without renewing."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from kubernetes import client
from kubernetes.client.exceptions import ApiException

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Timings:
    # A Lease not renewed for this long may be taken over.
    duration: float = 10.0
    # The holder renews this often.
    renew_every: float = 2.0
    # A standby looks this often.
    retry_every: float = 1.0
    # The longest one Lease read or write may take (connect and read); a hung call counts as failed.
    request_timeout: float = 5.0


@dataclass(frozen=True)
class LeaseRecord:
    """The parts of a Lease's spec the election reads."""

    holder: str | None
    duration_seconds: int | None
    renew_time: datetime | None
    transitions: int


def may_take(record: LeaseRecord | None, me: str, unchanged_for: float) -> bool:
    """Whether `me` may take (or keep) the Lease: nobody holds it, we do, or the holder has
    not renewed it for its duration, as seen by our own clock."""
    if record is None or not record.holder or record.holder == me:
        return True
    return unchanged_for >= (record.duration_seconds or 0)


def holding(record: LeaseRecord, me: str, timings: Timings, now: datetime) -> LeaseRecord:
    """The record `me` writes to take or renew the Lease. Taking it from anyone else, or
    taking one its holder handed back, is a transition (client-go counts both)."""
    return LeaseRecord(
        holder=me,
        duration_seconds=max(1, round(timings.duration)),
        renew_time=now,
        transitions=record.transitions + (0 if record.holder == me else 1),
    )


def _record(lease: client.V1Lease | None) -> LeaseRecord | None:
    if lease is None or lease.spec is None:
        return None
    spec = lease.spec
    return LeaseRecord(
        holder=spec.holder_identity,
        duration_seconds=spec.lease_duration_seconds,
        renew_time=spec.renew_time,
        transitions=spec.lease_transitions or 0,
    )


class LeaderElector:
    def __init__(
        self,
        api: client.ApiClient,
        namespace: str,
        name: str,
        identity: str,
        timings: Timings = Timings(),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.leases = client.CoordinationV1Api(api)
        self.namespace, self.name, self.identity = namespace, name, identity
        self.timings = timings
        self.clock = clock
        # The record last seen and when it was first seen (our clock): expiry is measured from there.
        self._seen: tuple[LeaseRecord | None, float] = (None, clock())

    def try_acquire_or_renew(self) -> bool:
        """One attempt; True while we hold the Lease. Conflicts (another replica wrote in
        between), API errors and connection failures count as not holding it."""
        try:
            return self._try_acquire_or_renew()
        except Exception as exc:
            log.warning("Lease %s/%s: the API call failed: %s", self.namespace, self.name, exc)
            return False

    def _try_acquire_or_renew(self) -> bool:
        timeout = self.timings.request_timeout
        try:
            lease = self.leases.read_namespaced_lease(self.name, self.namespace, _request_timeout=timeout)
        except ApiException as exc:
            if exc.status != 404:
                log.warning("reading Lease %s/%s failed: %s", self.namespace, self.name, exc.reason)
                return False
            return self._create()
        record = _record(lease) or LeaseRecord(None, None, None, 0)
        if record != self._seen[0]:
            self._seen = (record, self.clock())
        if not may_take(record, self.identity, self.clock() - self._seen[1]):
            return False
        mine = holding(record, self.identity, self.timings, datetime.now(UTC))
        assert lease.spec is not None
        if record.holder != self.identity:
            lease.spec.acquire_time = mine.renew_time
            log.info("taking Lease %s/%s over from %s", self.namespace, self.name, record.holder or "nobody")
        lease.spec.holder_identity = mine.holder
        lease.spec.lease_duration_seconds = mine.duration_seconds
        lease.spec.renew_time = mine.renew_time
        lease.spec.lease_transitions = mine.transitions
        try:
            # The resourceVersion read above makes this a compare-and-swap: of two replicas
            # taking an expired Lease at once, one gets 409.
            self.leases.replace_namespaced_lease(self.name, self.namespace, lease, _request_timeout=timeout)
        except ApiException as exc:
            if exc.status != 409:
                log.warning("writing Lease %s/%s failed: %s", self.namespace, self.name, exc.reason)
            return False
        self._seen = (mine, self.clock())
        return True

    def _create(self) -> bool:
        now = datetime.now(UTC)
        lease = client.V1Lease(
            metadata=client.V1ObjectMeta(name=self.name, namespace=self.namespace),
            spec=client.V1LeaseSpec(
                holder_identity=self.identity,
                lease_duration_seconds=max(1, round(self.timings.duration)),
                acquire_time=now,
                renew_time=now,
                lease_transitions=0,
            ),
        )
        try:
            self.leases.create_namespaced_lease(self.namespace, lease, _request_timeout=self.timings.request_timeout)
        except ApiException as exc:
            if exc.status != 409:  # another replica created it first
                log.warning("creating Lease %s/%s failed: %s", self.namespace, self.name, exc.reason)
            return False
        log.info("created Lease %s/%s", self.namespace, self.name)
        return True

    def wait_until_leader(self, stop: threading.Event) -> bool:
        """Blocks until we hold the Lease (True) or `stop` is set (False)."""
        log.info("waiting for Lease %s/%s as %s", self.namespace, self.name, self.identity)
        while not stop.is_set():
            if self.try_acquire_or_renew():
                log.info("holding Lease %s/%s as %s", self.namespace, self.name, self.identity)
                return True
            stop.wait(self.timings.retry_every)
        return False

    def keep_renewing(self, lost: threading.Event, stop: threading.Event) -> None:
        """Renews until `stop`; sets `lost` once a renewal has not succeeded for the Lease's
        duration, by which time a standby may already hold it."""
        last_renewed = self.clock()
        while not stop.wait(self.timings.renew_every):
            if self.try_acquire_or_renew():
                last_renewed = self.clock()
            elif self.clock() - last_renewed >= self.timings.duration - self.timings.renew_every:
                log.error("lost Lease %s/%s: not renewed in time", self.namespace, self.name)
                lost.set()
                return

    def release(self) -> None:
        """Hands the Lease back (a standby takes it at its next look), if we still hold it.
        The count of transitions stays: the next holder adds one."""
        timeout = self.timings.request_timeout
        try:
            lease = self.leases.read_namespaced_lease(self.name, self.namespace, _request_timeout=timeout)
            if lease.spec is None or lease.spec.holder_identity != self.identity:
                return
            lease.spec.holder_identity = None
            lease.spec.lease_duration_seconds = 1
            self.leases.replace_namespaced_lease(self.name, self.namespace, lease, _request_timeout=timeout)
            log.info("released Lease %s/%s", self.namespace, self.name)
        except Exception as exc:
            log.warning("releasing Lease %s/%s failed: %s", self.namespace, self.name, exc)


class Election:
    """Runs the elector in a thread of its own: `on_leading` is called once the Lease is held;
    `lost` is set when it is lost, and `on_lost` called (the operator then stops: the caller
    raises kopf's stop flag from it)."""

    def __init__(self, elector: LeaderElector, on_lost: Callable[[], object] | None = None) -> None:
        self.elector = elector
        self.on_lost = on_lost
        self.lost = threading.Event()
        self.leading = threading.Event()
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, on_leading: Callable[[], object]) -> None:
        self._thread = threading.Thread(target=self._run, args=(on_leading,), name="lease", daemon=True)
        self._thread.start()

    def _run(self, on_leading: Callable[[], object]) -> None:
        if self.elector.wait_until_leader(self._done):
            self.leading.set()
            on_leading()
            self.elector.keep_renewing(self.lost, self._done)
            if self.lost.is_set() and self.on_lost is not None:
                self.on_lost()

    def stop(self) -> None:
        """Stops standing by or renewing; a Lease still held is handed back, once the renewing
        thread has finished its last attempt (a renewal racing the release would take the
        Lease again, and the standby would then wait for it to expire)."""
        self._done.set()
        if self._thread is not None:
            self._thread.join(timeout=2 * self.elector.timings.request_timeout + 1)
        if self.leading.is_set() and not self.lost.is_set():
            self.elector.release()
