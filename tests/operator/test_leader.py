"""Leader election: who may take the Lease, and the elector against a fake Lease API with
a fake clock (test_leader_cluster.py runs two real replicas)."""

from __future__ import annotations

import copy
import threading
import time
from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import MaxRetryError

from rlkube_operator.leader import Election, LeaderElector, LeaseRecord, Timings, holding, may_take

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
TIMINGS = Timings(duration=10.0, renew_every=2.0, retry_every=1.0)


@pytest.mark.parametrize(
    ("holder", "unchanged_for", "allowed"),
    [
        (None, 0.0, True),  # nobody holds it
        ("", 0.0, True),  # handed back
        ("me", 0.0, True),  # ours: renew
        ("other", 9.9, False),  # renewed recently, as far as we have seen
        ("other", 10.0, True),  # not renewed for its duration
    ],
)
def test_may_take(holder: str | None, unchanged_for: float, allowed: bool) -> None:
    record = LeaseRecord(holder, 10, NOW, 3)
    assert may_take(record, "me", unchanged_for) is allowed
    assert may_take(None, "me", 0.0)


def test_holding_counts_a_transition_only_when_the_holder_changes() -> None:
    theirs = LeaseRecord("other", 10, NOW, 3)
    assert holding(theirs, "me", TIMINGS, NOW) == LeaseRecord("me", 10, NOW, 4)
    mine = LeaseRecord("me", 10, NOW, 4)
    assert holding(mine, "me", TIMINGS, NOW).transitions == 4
    # A Lease its holder handed back: taking it is a change of holder too, as in client-go.
    assert holding(LeaseRecord(None, 1, NOW, 4), "me", TIMINGS, NOW).transitions == 5
    assert holding(LeaseRecord("", 1, NOW, 4), "me", TIMINGS, NOW).transitions == 5


class FakeLeases:
    """CoordinationV1Api's Lease calls on one stored Lease, with resourceVersion checks."""

    def __init__(self) -> None:
        self.lease: client.V1Lease | None = None
        self.version = 0

    def read_namespaced_lease(self, name: str, namespace: str, **_options: object) -> client.V1Lease:
        if self.lease is None:
            raise ApiException(status=404)
        return copy.deepcopy(self.lease)

    def create_namespaced_lease(self, namespace: str, body: client.V1Lease, **_options: object) -> None:
        if self.lease is not None:
            raise ApiException(status=409)
        self._store(body)

    def replace_namespaced_lease(self, name: str, namespace: str, body: client.V1Lease, **_options: object) -> None:
        assert self.lease is not None
        if body.metadata.resource_version != self.lease.metadata.resource_version:
            raise ApiException(status=409)
        self._store(body)

    def _store(self, body: client.V1Lease) -> None:
        self.version += 1
        self.lease = copy.deepcopy(body)
        self.lease.metadata.resource_version = str(self.version)

    @property
    def holder(self) -> str | None:
        assert self.lease is not None and self.lease.spec is not None
        holder: str | None = self.lease.spec.holder_identity
        return holder


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Ticking(Clock):
    """A clock that moves one second each time it is read."""

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def elector(leases: FakeLeases, identity: str, clock: Clock) -> LeaderElector:
    made = LeaderElector(client.ApiClient(), "ops", "lease", identity, TIMINGS, clock)
    made.leases = leases  # type: ignore[assignment]
    return made


def test_one_holds_the_other_takes_over_only_after_the_duration_unchanged() -> None:
    leases, clock = FakeLeases(), Clock()
    a, b = elector(leases, "a", clock), elector(leases, "b", clock)
    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()
    # a renews: b keeps seeing a changed record and waits.
    for _ in range(10):
        clock.now += 2.0
        assert a.try_acquire_or_renew()
        assert not b.try_acquire_or_renew()
    # a stops renewing (killed): b takes over once the record has stood still for the duration.
    clock.now += 9.0
    assert not b.try_acquire_or_renew()
    clock.now += 1.0
    assert b.try_acquire_or_renew()
    assert leases.holder == "b"
    lease: Any = leases.lease
    assert lease.spec.lease_transitions == 1
    # a, back, does not take it while b renews.
    assert not a.try_acquire_or_renew()


class ReadBefore(FakeLeases):
    """The Lease API as a replica sees it that read the Lease just before another wrote it."""

    def __init__(self, real: FakeLeases, seen: client.V1Lease) -> None:
        self.real, self.seen = real, seen

    def read_namespaced_lease(self, name: str, namespace: str, **_options: object) -> client.V1Lease:
        return copy.deepcopy(self.seen)

    def replace_namespaced_lease(self, name: str, namespace: str, body: client.V1Lease, **_options: object) -> None:
        self.real.replace_namespaced_lease(name, namespace, body)


def test_of_two_taking_an_expired_lease_at_once_one_wins() -> None:
    leases, clock = FakeLeases(), Clock()
    dead, b, c = elector(leases, "dead", clock), elector(leases, "b", clock), elector(leases, "c", clock)
    assert dead.try_acquire_or_renew()
    assert not b.try_acquire_or_renew() and not c.try_acquire_or_renew()
    clock.now += 10.0
    expired = leases.read_namespaced_lease("lease", "ops")
    assert b.try_acquire_or_renew()
    # c read the same expired record before b wrote: its write carries a stale resourceVersion.
    c.leases = ReadBefore(leases, expired)  # type: ignore[assignment]
    assert not c.try_acquire_or_renew()
    assert leases.holder == "b"


def test_a_released_lease_is_taken_at_the_next_look() -> None:
    leases, clock = FakeLeases(), Clock()
    a, b = elector(leases, "a", clock), elector(leases, "b", clock)
    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()
    a.release()
    assert leases.holder is None
    assert b.try_acquire_or_renew()
    lease: Any = leases.lease
    assert lease.spec.lease_transitions == 1
    # b renewing is no transition; a taking it back after b hands it back is the second.
    assert b.try_acquire_or_renew()
    b.release()
    assert a.try_acquire_or_renew()
    assert leases.lease is not None and leases.lease.spec is not None
    assert leases.lease.spec.lease_transitions == 2


class Unreachable(FakeLeases):
    """The Lease API behind a network that refuses the first `failures` calls the way urllib3
    does (not an ApiException)."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures

    def read_namespaced_lease(self, name: str, namespace: str, **_options: object) -> client.V1Lease:
        if self.failures > 0:
            self.failures -= 1
            raise MaxRetryError(None, f"/leases/{name}", ConnectionRefusedError(111, "Connection refused"))  # type: ignore[arg-type]
        return super().read_namespaced_lease(name, namespace)


def test_a_connection_error_counts_as_not_holding_and_the_standby_keeps_looking() -> None:
    leases = Unreachable(failures=3)
    leases.create_namespaced_lease(
        "ops", client.V1Lease(metadata=client.V1ObjectMeta(name="lease"), spec=client.V1LeaseSpec(holder_identity=None))
    )
    standby = Election(LeaderElector(client.ApiClient(), "ops", "lease", "b", Timings(10.0, 0.05, 0.01)))
    standby.elector.leases = leases  # type: ignore[assignment]
    leading = threading.Event()
    standby.start(on_leading=leading.set)
    try:
        assert leading.wait(5), "the election thread gave up after a connection error"
        assert leases.failures == 0
        assert leases.holder == "b"
    finally:
        standby.stop()


def leading_election(leases: FakeLeases, every: float) -> Election:
    """An election of candidate "a" over `leases`, renewing and retrying `every` seconds,
    started and already leading."""
    election = Election(LeaderElector(client.ApiClient(), "ops", "lease", "a", Timings(10.0, every, every)))
    election.elector.leases = leases  # type: ignore[assignment]
    leading = threading.Event()
    election.start(on_leading=leading.set)
    assert leading.wait(5)
    return election


def test_a_stopped_election_does_not_take_the_lease_again_after_handing_it_back() -> None:
    """The renewing thread ends before the release: a renewal after it would take the Lease
    back, and the standby would wait a whole duration for it to expire."""
    for _ in range(20):
        leases = FakeLeases()
        election = leading_election(leases, every=0.001)
        election.stop()
        time.sleep(0.01)
        assert leases.holder is None


def test_an_election_calls_back_when_leading_and_hands_the_lease_back_on_stop() -> None:
    leases = FakeLeases()
    election = leading_election(leases, every=0.05)
    election.stop()
    assert leases.holder is None
    assert not election.lost.is_set()


def test_a_holder_that_cannot_renew_reports_the_lease_lost() -> None:
    leases, clock = FakeLeases(), Ticking()
    a = elector(leases, "a", clock)
    a.timings = Timings(duration=10.0, renew_every=0.01, retry_every=0.01)
    assert a.try_acquire_or_renew()
    assert leases.lease is not None and leases.lease.spec is not None
    leases.lease.spec.holder_identity = "usurper"  # someone else holds it now; renewals fail
    lost, stop = threading.Event(), threading.Event()
    a.keep_renewing(lost, stop)  # returns once it gives up: 8 s (duration - renew_every) of its clock
    assert lost.is_set()


def test_an_election_that_loses_the_lease_calls_on_lost() -> None:
    """The operator's stop flag is raised from on_lost (an asyncio Event set thread-safely)."""
    leases = FakeLeases()
    lost = threading.Event()
    election = Election(
        LeaderElector(client.ApiClient(), "ops", "lease", "a", Timings(0.3, 0.05, 0.05)), on_lost=lost.set
    )
    election.elector.leases = leases  # type: ignore[assignment]
    leading = threading.Event()
    election.start(on_leading=leading.set)
    assert leading.wait(5)
    assert leases.lease is not None and leases.lease.spec is not None
    leases.lease.spec.holder_identity = "usurper"  # renewals fail from now on
    assert lost.wait(5)
    assert election.lost.is_set()
    election.stop()
    assert leases.holder == "usurper"  # a lost Lease is not "handed back"
