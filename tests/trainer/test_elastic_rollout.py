"""elastic_rollout.py: rollout engines that join and leave while the job trains.

The decisions are pure functions, tested first. `ElasticRollout` is then driven over fake
rank groups (a real vLLM engine per Ray node cannot run in a unit test): an engine is an
object that holds the weights it was last sent and answers `generate` with them, so a test
sees which weights made each sample."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import pytest

from rlkube_api.placement import Role
from rlkube_trainer.cluster.elastic_rollout import (
    ElasticRollout,
    Engine,
    EngineState,
    NoRolloutEngine,
    _with_cause,
    assign,
    plan_fleet,
    serving,
    sync_members,
    wanted_ranks,
)
from rlkube_trainer.cluster.rank_group import Pending, RankGroup, RankLost
from rlkube_trainer.loop.async_training.partial_rollout import push_into_generation
from rlkube_trainer.rollout import RolloutBatch, RolloutSample, SamplingConfig

LIVE, LOADED, STARTING = EngineState.LIVE, EngineState.LOADED, EngineState.STARTING


def engines(*specs: tuple[int, EngineState, int]) -> dict[int, Engine]:
    return {rank: Engine(rank, state, version) for rank, state, version in specs}


# --- the pure decisions -----------------------------------------------------------------------


def test_plan_fleet_starts_new_ranks_and_drops_gone_ones() -> None:
    now = engines((0, LIVE, 1), (1, LIVE, 1), (2, STARTING, -1))
    changes = plan_fleet(now, {0, 2, 3, 4})
    assert changes.start == (3, 4)
    assert changes.drop == (1,)
    assert plan_fleet(now, {0, 1, 2}).start == plan_fleet(now, {0, 1, 2}).drop == ()


@pytest.mark.parametrize(
    ("wanted", "version", "served"),
    [
        (None, 3, [0, 1]),  # live at the current weights; the loaded and stale ones wait for a push
        (3, 3, [0, 1]),
        (1, 3, [0]),  # a scale-down: rank 1 gets no more work
        (0, 3, [0, 1]),  # nothing wanted can serve: the ones on their way out do until they go
        (None, 4, []),  # none holds the weights of version 4 yet
    ],
)
def test_serving_is_live_engines_at_the_current_version_that_are_still_wanted(
    wanted: int | None, version: int, served: list[int]
) -> None:
    now = engines((0, LIVE, 3), (1, LIVE, 3), (2, LOADED, -1), (3, LIVE, 2), (4, STARTING, -1))
    assert serving(now, wanted, version) == served


def test_a_weight_push_goes_to_every_engine_set_up_and_wanted() -> None:
    now = engines((0, LIVE, 3), (1, LOADED, -1), (2, STARTING, -1), (3, LOADED, -1))
    assert sync_members(now, None) == (0, 1, 3)  # the loaded ones join at the push
    assert sync_members(now, 2) == (0, 1)  # rank 3 is past the wanted count


@pytest.mark.parametrize(
    ("prompts", "ranks", "shares"),
    [
        (slice(0, 5), [0, 1], [(0, slice(0, 3)), (1, slice(3, 5))]),
        (slice(4, 6), [2, 5, 7], [(2, slice(4, 5)), (5, slice(5, 6))]),  # no empty share
        (slice(0, 4), [3], [(3, slice(0, 4))]),
    ],
)
def test_assign_splits_a_range_of_prompts_over_the_engines_in_order(
    prompts: slice, ranks: list[int], shares: list[tuple[int, slice]]
) -> None:
    assert assign(prompts, ranks) == shares


@pytest.mark.parametrize(
    ("config", "procs", "wanted"),
    [
        ({"roles": {"rollout": {"replicas": 3}}}, 1, 3),
        ({"roles": {"rollout": {"replicas": 2}}}, 2, 4),
        ({"roles": {"rollout": {}}}, 1, None),  # unknown: every present engine is used
        ({}, 1, None),
    ],
)
def test_wanted_ranks_reads_the_rendered_config(config: dict[str, Any], procs: int, wanted: int | None) -> None:
    assert wanted_ranks(config, procs) == wanted


# --- ElasticRollout over fake engines ---------------------------------------------------------


class Weights:
    """The actor's weights: a version number the fake weight push carries."""

    def __init__(self) -> None:
        self.version = 0


class FakeActor:
    def __init__(self, weights: Weights, log: list[tuple[Any, ...]]) -> None:
        self.weights, self.log = weights, log

    def rejoin_weight_sync(self, *args: Any) -> None:
        self.log.append(("actor", *args))

    def send_weights(self, manifest: Any, bucket_bytes: int) -> int:
        return 100


class FakeEngine:
    """A rollout engine: it answers `generate` with the weights it holds (-1: none)."""

    def __init__(self, weights: Weights, log: list[tuple[Any, ...]], holds: int = -1) -> None:
        self.weights, self.log, self.holds = weights, log, holds
        self.alive, self.setup_done, self.closed = True, True, False
        self.joined: tuple[Any, ...] | None = None

    def setup(self) -> str:
        return "a fake node"

    def rejoin_weight_sync(self, *args: Any) -> None:
        self.joined = args

    def receive_weights(self, manifest: Any, bucket_bytes: int) -> None:
        self.holds = self.weights.version

    def generate(self, prompts: list[list[int]], sampling: SamplingConfig) -> RolloutBatch:
        self.log.append(("generate", id(self), len(prompts), sampling.seed))
        samples = [
            RolloutSample(prompt_index=i, token_ids=[prompt[0], self.holds], logprobs=None, finish_reason="stop")
            for i, prompt in enumerate(prompts)
            for _ in range(sampling.n)
        ]
        return RolloutBatch(samples, sampling.n)

    def pause_generation(self) -> None:
        self.log.append(("pause", id(self)))

    def resume_generation(self, weight_version: int) -> None:
        self.log.append(("resume", id(self), weight_version))

    def close(self) -> None:
        self.closed = True


class FakeGroup(RankGroup):
    """Ranks in this process whose calls run at `wait` (a dead one raises RankLost there)."""

    def __init__(self, name: str, ranks: Sequence[Any], offset: int = 0) -> None:
        self.role = Role(name)
        self.ranks = list(ranks)
        self.offset = offset  # this group's rank 0 in the role's numbering

    def __len__(self) -> int:
        return len(self.ranks)

    def submit(self, method: str, args: Sequence[tuple[Any, ...]], ranks: Sequence[int] | None = None) -> Pending:
        chosen = list(ranks) if ranks is not None else list(range(len(args)))
        return Pending(chosen, [(method, a) for a in args])

    def wait(self, pending: Pending) -> list[Any]:
        out = []
        for r, (method, args) in zip(pending.ranks, pending.handles, strict=True):
            rank = self.ranks[r]
            if not getattr(rank, "alive", True):
                raise RankLost(self.role.value, self.offset + r, "its node died")
            out.append(getattr(rank, method)(*args))
        return out

    def done(self, pending: Pending) -> bool:
        return all(getattr(self.ranks[r], "setup_done", True) for r in pending.ranks)

    def only(self, rank: int) -> RankGroup:
        return FakeGroup(self.role.value, [self.ranks[rank]], self.offset + rank)


class FakeFleet:
    def __init__(self, weights: Weights, log: list[tuple[Any, ...]], present: set[int]) -> None:
        self.weights, self.log = weights, log
        self.ranks = set(present)
        self.want: int | None = None
        self.loading = False  # engines launched now take their time to set up
        self.launched: dict[int, FakeEngine] = {}

    def present(self) -> set[int]:
        return set(self.ranks)

    def wanted(self) -> int | None:
        return self.want

    def launch(self, rank: int) -> RankGroup:
        engine = FakeEngine(self.weights, self.log)
        engine.setup_done = not self.loading
        self.launched[rank] = engine
        return FakeGroup("rollout", [engine], rank)


class Setup:
    """An actor, two initial engines holding version 0, and a fleet the test scales."""

    def __init__(self, initial: int = 2) -> None:
        self.weights = Weights()
        self.log: list[tuple[Any, ...]] = []
        self.initial = [FakeEngine(self.weights, self.log, holds=0) for _ in range(initial)]
        self.fleet = FakeFleet(self.weights, self.log, set(range(initial)))
        actor = FakeGroup("actor", [FakeActor(self.weights, self.log)])
        self.rollout = ElasticRollout(
            actor, FakeGroup("rollout", self.initial), self.fleet, [], 1 << 20, ("127.0.0.1", 29600)
        )

    def push(self) -> None:
        """A training step's end: new actor weights, pushed to the engines."""
        self.weights.version += 1
        self.rollout.sync_weights()

    def generate(self, prompts: int, n: int = 2, seed: int | None = 7) -> RolloutBatch:
        return self.rollout.generate([[i] for i in range(prompts)], SamplingConfig(n=n, seed=seed))


def made_with(batch: RolloutBatch) -> set[int]:
    return {s.token_ids[1] for s in batch.samples}


def in_prompt_order(batch: RolloutBatch, prompts: int, n: int = 2) -> bool:
    return [s.prompt_index for s in batch.samples] == [i for i in range(prompts) for _ in range(n)] and [
        s.token_ids[0] for s in batch.samples
    ] == [s.prompt_index for s in batch.samples]


def test_the_initial_engines_generate_with_the_pushed_weights() -> None:
    s = Setup()
    batch = s.generate(4)
    assert in_prompt_order(batch, 4)
    assert made_with(batch) == {0}
    s.push()
    assert s.rollout.version == 1
    assert made_with(s.generate(4)) == {1}
    assert s.rollout.generation == 0  # the members did not change: no new weight-sync group


def test_a_joining_engine_takes_work_only_once_it_holds_the_current_weights() -> None:
    s = Setup()
    s.push()
    s.fleet.ranks.add(2)  # the StatefulSet added a pod: its Ray node advertises rank 2

    batch = s.generate(6)
    new = s.fleet.launched[2]
    assert s.rollout.engines[2].state is EngineState.LOADED
    assert not any(e[0] == "generate" and e[1] == id(new) for e in s.log)
    assert made_with(batch) == {1}  # it holds no weights yet: no sample of its own

    s.push()  # the join: a new weight-sync group with it, then the current weights
    assert s.rollout.generation == 1
    assert s.rollout.members == (0, 1, 2)
    assert new.joined == ("127.0.0.1", 29600, 1, 4, 3)  # world 1 + 3 engines; rank 2 is sync rank 3
    assert new.holds == s.weights.version == s.rollout.version == 2
    assert s.rollout.engines[2] == Engine(2, EngineState.LIVE, 2)

    batch = s.generate(6)
    assert in_prompt_order(batch, 6)
    assert made_with(batch) == {2}  # one weight version for every engine that generates
    assert sum(1 for e in s.log if e[0] == "generate" and e[1] == id(new)) == 1


def test_an_engine_still_starting_is_left_out_of_the_push() -> None:
    s = Setup()
    s.fleet.ranks.add(2)
    s.fleet.loading = True  # its engine still loads
    s.push()
    assert s.rollout.engines[2].state is EngineState.STARTING
    assert s.rollout.members == (0, 1)
    s.fleet.launched[2].setup_done = True
    s.push()
    assert s.rollout.members == (0, 1, 2)
    assert s.fleet.launched[2].holds == s.rollout.version


def test_a_scale_down_stops_work_for_the_ranks_past_the_wanted_count() -> None:
    s = Setup(initial=3)
    s.fleet.want = 2
    batch = s.generate(6)
    assert in_prompt_order(batch, 6)
    assert not any(e[0] == "generate" and e[1] == id(s.initial[2]) for e in s.log)
    s.push()
    assert s.rollout.members == (0, 1)  # the next group leaves it out
    # Its pod goes: it is dropped.
    s.fleet.ranks.discard(2)
    s.rollout.refresh()
    assert sorted(s.rollout.engines) == [0, 1]


def test_a_share_whose_engine_dies_is_generated_again_on_the_others_with_its_seed() -> None:
    s = Setup(initial=2)
    s.initial[1].alive = False
    batch = s.generate(4)
    assert in_prompt_order(batch, 4)
    assert sorted(s.rollout.engines) == [0]
    # Prompts 2..3 went to rank 1 first, then to rank 0 with the same seed offset (2 × n = 4).
    seeds = [e[3] for e in s.log if e[0] == "generate" and e[1] == id(s.initial[0])]
    assert seeds == [7, 7 + 2 * 2]


def test_an_engine_lost_during_a_push_is_dropped_and_the_group_formed_without_it() -> None:
    s = Setup(initial=2)
    s.fleet.ranks.add(2)
    s.rollout.refresh()
    s.fleet.launched[2].alive = False  # set up, then lost before the push reaches it
    s.push()
    assert s.rollout.members == (0, 1)
    assert sorted(s.rollout.engines) == [0, 1]
    assert made_with(s.generate(2)) == {1}


def test_no_engine_holding_the_current_weights_is_a_clear_error() -> None:
    s = Setup(initial=1)
    s.initial[0].alive = False
    # Names why the last one left (a rank's own error: the one a user can act on).
    with pytest.raises(
        NoRolloutEngine, match=r"every rollout engine holding the current weights was lost.*its node died"
    ):
        s.generate(2)


def test_a_lost_rank_is_named_with_its_remote_error() -> None:
    """Ray's error names the method and process on its first line; the rank's exception below."""
    remote = RuntimeError(
        "ray::Rank.generate() (pid=110, ip=10.0.0.5)\n  File x, line 1\n"
        "torch._inductor.exc.InductorError: InvalidCxxCompiler: No working C++ compiler found\n"
        "Set TORCHDYNAMO_VERBOSE=1 for the internal stack trace"
    )
    lost = RankLost("rollout", 0, "ray::Rank.generate() (pid=110, ip=10.0.0.5)")
    lost.__cause__ = remote
    assert _with_cause(lost).endswith(
        "generate() (pid=110, ip=10.0.0.5): torch._inductor.exc.InductorError: "
        "InvalidCxxCompiler: No working C++ compiler found"
    )
    plain = RankLost("rollout", 0, "its node died")
    assert _with_cause(plain) == "role rollout rank 0 failed: its node died"


def test_close_closes_only_the_engines_that_joined_later() -> None:
    s = Setup()
    s.fleet.ranks.add(2)
    s.push()
    s.rollout.close()
    assert s.fleet.launched[2].closed
    assert not any(engine.closed for engine in s.initial)


# --- partial rollouts: a push into the generation in flight ---------------------------------------


def test_a_push_into_a_generation_pauses_the_live_engines_and_resumes_every_member() -> None:
    """async_training.partial_rollout: the engines that may be generating (live) are paused, the
    push reaches every member (a loaded newcomer too) and all of them resume with the new
    version, so the newcomer counts its first tokens with it."""
    s = Setup()
    s.fleet.ranks.add(2)
    s.generate(4)  # rank 2 launched and set up: loaded, not live
    s.log.clear()
    s.weights.version += 1
    push_into_generation(s.rollout, s.rollout.sync_weights, held=0, pushed=1)
    new = s.fleet.launched[2]
    paused = {e[1] for e in s.log if e[0] == "pause"}
    assert paused == {id(s.initial[0]), id(s.initial[1])}
    resumed = {e[1]: e[2] for e in s.log if e[0] == "resume"}
    assert resumed == {id(s.initial[0]): 1, id(s.initial[1]): 1, id(new): 1}
    assert new.holds == 1 and s.rollout.members == (0, 1, 2)
    assert made_with(s.generate(6)) == {1}


def test_the_fleet_books_stay_still_from_pause_to_resume() -> None:
    """The rollout thread's own calls (a new engine found, a lost one dropped) wait while a push
    is inside the generation in flight: the push decides the members alone."""
    s = Setup()
    s.rollout.pause_generation()
    looked = threading.Event()
    other = threading.Thread(target=lambda: (s.rollout.refresh(), looked.set()))
    other.start()
    assert not looked.wait(0.2)
    s.weights.version += 1
    s.rollout.sync_weights()  # the pausing thread itself goes on (the lock is re-entrant)
    s.rollout.resume_generation(1)
    assert looked.wait(5)
    other.join()


def test_an_engine_lost_while_pausing_is_dropped_and_the_push_goes_on() -> None:
    s = Setup()
    s.initial[1].alive = False  # its node died: the fleet no longer has it
    s.fleet.ranks.discard(1)
    s.weights.version += 1
    push_into_generation(s.rollout, s.rollout.sync_weights, held=0, pushed=1)
    assert sorted(s.rollout.engines) == [0] and s.rollout.members == (0,)
    assert made_with(s.generate(4)) == {1}
    assert s.rollout.lock.acquire(blocking=False)  # released after the resume
    s.rollout.lock.release()


def test_an_engine_past_the_wanted_count_is_neither_paused_nor_waited_for() -> None:
    """A scale-down's engine gets no weights at the push, so it is not paused: its pod may be
    terminating, and a call to it would wait for Ray to give up on it (seen: 21 s, then the run's
    end when its name was taken again)."""
    s = Setup(initial=3)
    s.fleet.want = 2
    s.log.clear()
    s.weights.version += 1
    push_into_generation(s.rollout, s.rollout.sync_weights, held=0, pushed=1)
    touched = {e[1] for e in s.log if e[0] in ("pause", "resume")}
    assert touched == {id(s.initial[0]), id(s.initial[1])}


def test_an_engine_that_does_not_start_is_tried_again_later() -> None:
    s = Setup()
    s.fleet.ranks.add(2)
    launch = s.fleet.launch
    s.fleet.launch = lambda rank: (_ for _ in ()).throw(ValueError("the name rollout-2 is already taken"))  # type: ignore[method-assign]
    s.generate(4)  # the run goes on with the engines it has
    assert sorted(s.rollout.engines) == [0, 1]
    s.fleet.launch = launch  # type: ignore[method-assign]
    s.generate(4)
    assert s.rollout.engines[2].state is EngineState.LOADED
