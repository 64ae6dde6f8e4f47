"""Elastic rollout capacity: separate rollout engines join and leave while the job
trains, without restarting the gang.

The operator scales the rollout StatefulSet when `spec.roles.rollout.replicas` changes; each
rollout pod is a Ray node advertising `rlkube_rollout_<pod>` (ray_node.py). Between calls
the driver looks at which rollout ranks are there (`Fleet.present`) and how many the job wants
now (`Fleet.wanted`, from the mounted config the operator re-renders), then:

- a new rank gets an engine (its Ray actor set up in the background); it joins the
  weight-sync group at the next weight push and takes work once it holds the weights every
  other engine holds: the weight version stays one number for all engines that generate;
- a rank past the wanted count (the StatefulSet removes the highest ordinals) gets no more
  work; a rank whose node is gone is dropped;
- a generation is split over the engines that hold the current weights; a share whose engine
  dies is generated again on the others with the same seed offset, so no sample is lost or
  counted twice.

With partial rollouts (`async_training.partial_rollout`) a weight push comes while a generation
is in flight on the schedule's rollout thread: the engines generating are paused at a step
boundary, the push goes to every member (new engines included), and all of them resume with the
new version. The fleet's books are then read and changed from two threads, so they are kept under
one lock; a call in flight holds its own group, not a lookup into the books.

The decisions are pure functions (`plan_fleet`, `serving`, `sync_members`, `assign`); the class
`ElasticRollout` only carries them out over `RankGroup`s.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import threading
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, Protocol

from rlkube_trainer.cluster.dispatch import shard_sampling
from rlkube_trainer.cluster.rank_group import Pending, RankGroup, RankLost, split
from rlkube_trainer.rollout import RolloutBatch, RolloutSample, SamplingConfig
from rlkube_trainer.workers.weight_sync import Manifest

log = logging.getLogger("rlkube.trainer")


class EngineState(Enum):
    STARTING = "starting"  # its rank's setup (loading the engine) runs
    LOADED = "loaded"  # set up; takes work once it holds the current weights
    LIVE = "live"  # in the weight-sync group, holding `Engine.version`


@dataclass(frozen=True)
class Engine:
    rank: int
    state: EngineState
    version: int = -1  # the weight version it holds (-1: none pushed yet)


Engines = Mapping[int, Engine]


@dataclass(frozen=True)
class FleetChanges:
    start: tuple[int, ...]  # ranks present without an engine: launch one
    drop: tuple[int, ...]  # engines whose rank is gone (its pod deleted, its node dead)


def plan_fleet(engines: Engines, present: Collection[int]) -> FleetChanges:
    return FleetChanges(
        start=tuple(sorted(set(present) - set(engines))),
        drop=tuple(sorted(set(engines) - set(present))),
    )


def _wanted(rank: int, wanted: int | None) -> bool:
    return wanted is None or rank < wanted


def serving(engines: Engines, wanted: int | None, version: int) -> list[int]:
    """The engines a generation goes to: live, holding the current weights, and still wanted.
    If the wanted ones cannot serve (the others are about to be removed), the ones past the
    count do until they go: a scale-down never stops generation."""
    current = [e.rank for e in engines.values() if e.state is EngineState.LIVE and e.version == version]
    kept = [rank for rank in current if _wanted(rank, wanted)]
    return sorted(kept or current)


def sync_members(engines: Engines, wanted: int | None) -> tuple[int, ...]:
    """The rollout ranks the next weight push goes to (weight-sync ranks 1.. in this order):
    every engine set up and still wanted."""
    return tuple(
        sorted(e.rank for e in engines.values() if e.state is not EngineState.STARTING and _wanted(e.rank, wanted))
    )


def assign(prompts: slice, ranks: Sequence[int]) -> list[tuple[int, slice]]:
    """Prompts `prompts` (a range of the batch) split evenly over `ranks`, in order; each
    engine's seed is offset by its share's first prompt (`shard_sampling`), so a share generated
    again elsewhere samples what it would have."""
    start = prompts.start or 0
    parts = split(prompts.stop - start, len(ranks))
    return [
        (rank, slice(start + part.start, start + part.stop))
        for rank, part in zip(ranks, parts, strict=True)
        if part.stop > part.start
    ]


def wanted_ranks(config: Mapping[str, Any], procs_per_pod: int) -> int | None:
    """The rollout ranks the job wants now, from the trainer's YAML (`roles.rollout.replicas`)."""
    rollout = (config.get("roles") or {}).get("rollout") or {}
    replicas = rollout.get("replicas")
    return int(replicas) * procs_per_pod if isinstance(replicas, int) else None


# --- the edge: Ray (or ranks in this process) --------------------------------------------------


class Fleet(Protocol):
    """Where rollout engines come from."""

    def present(self) -> set[int]:
        """Rollout ranks whose pod is in the cluster now."""
        ...

    def wanted(self) -> int | None:
        """Rollout ranks the job wants now (None: all that are present)."""
        ...

    def launch(self, rank: int) -> RankGroup:
        """An engine's rank, started (its `setup` not yet called)."""
        ...


def _with_cause(lost: RankLost) -> str:
    """The loss with the rank's own error: Ray's first line names only the method and the
    process; the remote exception is further down (its last `...Error: ` line, else the last)."""
    lines = [line.strip() for line in str(lost.__cause__ or "").splitlines()[1:] if line.strip()]
    errors = [line for line in lines if re.match(r"[\w.]+(Error|Exception): ", line)]
    cause = errors[-1] if errors else lines[-1] if lines else ""
    # A loss from ray_group already ends with it (rank_error); one from elsewhere may not.
    return f"{lost}: {cause}" if cause and not str(lost).endswith(cause) else str(lost)


class NoRolloutEngine(RuntimeError):
    """Every rollout engine was lost and none holds the weights to take over."""


class ElasticRollout:
    """`ppo.Rollout` over rollout engines that come and go (separate placement, one process
    per engine). The weights reach them from every actor rank (each sends its own slices; under
    LoRA or a pipeline, rank 0 sends them whole) over the weight-sync group, re-formed whenever its
    members change."""

    def __init__(
        self,
        actor: RankGroup,
        initial: RankGroup,
        fleet: Fleet,
        manifest: Manifest,
        bucket_bytes: int,
        address: tuple[str, int],
    ) -> None:
        self.actor = actor
        self.fleet = fleet
        self.manifest = manifest
        self.bucket_bytes = bucket_bytes
        self.address = address
        # The initial ranks joined the weight-sync group (generation 0) with the placement's
        # numbering and hold the model's initial weights (version 0).
        self.engines: dict[int, Engine] = {r: Engine(r, EngineState.LIVE, 0) for r in range(len(initial))}
        self.groups: dict[int, RankGroup] = {r: initial.only(r) for r in range(len(initial))}
        self.setups: dict[int, Pending] = {}
        self.members: tuple[int, ...] = tuple(range(len(initial)))
        self.launched: set[int] = set()
        self.generation = 0
        self.version = 0
        # The driver's thread pushes weights while the rollout thread generates (partial rollouts).
        self.lock = threading.RLock()
        self.paused: set[int] = set()  # the engines the push in progress paused
        self.last_loss = ""  # why the latest engine left, for the error when none is left

    # --- membership -----------------------------------------------------------------------------
    def refresh(self) -> None:
        """Launches engines for new ranks, drops those whose rank is gone, and marks those
        whose setup finished as loaded."""
        with self.lock:
            self._refresh()

    def _refresh(self) -> None:
        changes = plan_fleet(self.engines, self.fleet.present())
        for rank in changes.drop:
            self._drop(rank, "its pod is gone")
        for rank in changes.start:
            try:
                group = self.fleet.launch(rank)
            except Exception as error:  # a new engine never ends the run: tried again at the next look
                log.warning("rollout rank %d: its engine did not start (%s); trying again later", rank, error)
                continue
            self.groups[rank] = group
            self.launched.add(rank)
            self.setups[rank] = group.submit("setup", [()])
            self.engines[rank] = Engine(rank, EngineState.STARTING)
            log.info("rollout rank %d joined: starting its engine", rank)
        for rank, pending in list(self.setups.items()):
            if not self.groups[rank].done(pending):
                continue
            del self.setups[rank]
            try:
                where = self.groups[rank].wait(pending)[0]
            except RankLost as lost:
                self._drop(rank, str(lost))
                continue
            self.engines[rank] = Engine(rank, EngineState.LOADED)
            log.info("rollout engine ready: %s; it takes work after the next weight push", where)

    def _drop(self, rank: int, why: str) -> None:
        with self.lock:
            if self.engines.pop(rank, None) is not None:
                log.warning("rollout rank %d left (%s): its work goes to the other engines", rank, why)
                self.last_loss = why
            self.groups.pop(rank, None)
            self.setups.pop(rank, None)

    def live_ranks(self) -> list[int]:
        with self.lock:
            return serving(self.engines, self.fleet.wanted(), self.version)

    # --- weights --------------------------------------------------------------------------------
    def sync_weights(self) -> int:
        """Pushes the actor's weights to every engine set up and wanted (new ones included);
        they all hold the new version after it."""
        with self.lock:
            return self._sync_weights()

    def _sync_weights(self) -> int:
        self._refresh()
        while True:
            members = sync_members(self.engines, self.fleet.wanted())
            try:
                if members != self.members:
                    self._reform(members)
                sent = self._broadcast(members)
            except RankLost as lost:
                if lost.group != "rollout":
                    raise
                continue  # the lost engine was dropped: form the group without it
            break
        self.version += 1
        for rank in members:
            self.engines[rank] = Engine(rank, EngineState.LIVE, self.version)
        return sent

    def _reform(self, members: tuple[int, ...]) -> None:
        """New weight-sync groups: the actor's ranks (the senders) first, the members after, in order."""
        self.generation += 1
        senders = len(self.actor)
        world = senders + len(members)
        addr, port = self.address
        log.info("weight-sync group %d: the actor's ranks and rollout ranks %s", self.generation, list(members))
        actor = self.actor.submit(
            "rejoin_weight_sync", [(addr, port, self.generation, world, a) for a in range(senders)]
        )
        joins = {
            r: self.groups[r].submit("rejoin_weight_sync", [(addr, port, self.generation, world, senders + i)])
            for i, r in enumerate(members)
        }
        self._wait_members(joins)
        self.actor.wait(actor)
        self.members = members

    def _broadcast(self, members: tuple[int, ...]) -> int:
        args = [(self.manifest, self.bucket_bytes)]
        sends = self.actor.submit("send_weights", args * len(self.actor))
        receives = {r: self.groups[r].submit("receive_weights", args) for r in members}
        self._wait_members(receives)
        return int(self.actor.wait(sends)[0])

    def _wait_members(self, pending: Mapping[int, Pending]) -> None:
        """Every member's answer; a lost one is dropped and reported (as rollout's RankLost)."""
        lost: RankLost | None = None
        for rank, call in pending.items():
            try:
                self.groups[rank].wait(call)
            except RankLost as error:
                self._drop(rank, str(error))
                self.members = ()  # whatever formed is broken: the next try forms anew
                lost = lost or RankLost("rollout", rank, str(error))
        if lost is not None:
            raise lost

    # --- generation -----------------------------------------------------------------------------
    def generate(self, prompt_token_ids: list[list[int]], sampling: SamplingConfig) -> RolloutBatch:
        """The batch's prompts over the serving engines; a share whose engine is lost is
        generated again on the others (same seed offset). Samples in prompt order."""
        self.refresh()
        todo = [slice(0, len(prompt_token_ids))]
        samples: list[RolloutSample] = []
        while todo:
            with self.lock:  # the books as they are now; a push may change them while we wait
                ranks = self._serving_or_wait()
                work = [(rank, self.groups[rank], share) for part in todo for rank, share in assign(part, ranks)]
                calls = [
                    (
                        rank,
                        group,
                        share,
                        group.submit("generate", [(prompt_token_ids[share], shard_sampling(sampling, share.start))]),
                    )
                    for rank, group, share in work
                ]
            todo = []
            for rank, group, share, call in calls:
                try:
                    batch: RolloutBatch = group.wait(call)[0]
                except RankLost as lost:
                    self._drop(rank, _with_cause(lost))
                    todo.append(share)
                    continue
                samples += [dataclasses.replace(s, prompt_index=share.start + s.prompt_index) for s in batch.samples]
        samples.sort(key=lambda s: s.prompt_index)  # stable: a prompt's n samples keep their order
        return RolloutBatch(samples, sampling.n)

    def _serving_or_wait(self) -> list[int]:
        ranks = serving(self.engines, self.fleet.wanted(), self.version)
        if not ranks:
            # Only a weight push makes an engine serve, and none comes during a generation.
            raise NoRolloutEngine(
                f"every rollout engine holding the current weights was lost (engines now: {sorted(self.engines)}); "
                f"the last: {self.last_loss}"
            )
        return ranks

    # --- partial rollouts -----------------------------------------------------------------------
    def pause_generation(self) -> None:
        """The engines the push will reach (live and still wanted) stop at a step boundary; one
        past the wanted count gets no weights, so it finishes its share with those it holds
        (and its pod, on its way out, is never waited for). The lock is held until
        `resume_generation`: no membership change between pause and resume but the push's own."""
        self.lock.acquire()
        try:
            members = set(sync_members(self.engines, self.fleet.wanted()))
            self.paused = {r for r, e in self.engines.items() if e.state is EngineState.LIVE and r in members}
            self._wait_members({r: self.groups[r].submit("pause_generation", [()]) for r in sorted(self.paused)})
        except RankLost as lost:
            log.warning("pausing the rollout: %s", lost)  # dropped: its share is generated again
        except BaseException:
            self.lock.release()
            raise

    def resume_generation(self, weight_version: int) -> None:
        """The live engines go on with the version they now hold (the push's, or the one still
        held after a failed push); an engine that joined at the push starts counting its tokens
        with it."""
        try:
            # The paused ones and those that joined at the push (members now, live).
            going_on = (self.paused | set(self.members)) & set(self.groups)
            resumed = {
                r: self.groups[r].submit("resume_generation", [(weight_version,)])
                for r in sorted(going_on)
                if self.engines[r].state is EngineState.LIVE
            }
            try:
                self._wait_members(resumed)
            except RankLost as lost:
                log.warning("resuming the rollout: %s", lost)
        finally:
            self.lock.release()

    def close(self) -> None:
        """Closes the engines that joined later (the driver closes the initial group's)."""
        for rank, group in list(self.groups.items()):
            if rank not in self.launched:
                continue
            try:
                group.call_all("close")
            except Exception as error:  # a lost rank was reported already
                log.debug("closing rollout rank %d: %s", rank, error)
