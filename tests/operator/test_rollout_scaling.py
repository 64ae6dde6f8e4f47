"""Elastic rollout capacity (rollout_scaling.py): the pure rules that tell a rollout scaling
from a gang failure, and compute_status driven through a scale-up and a scale-down, pass
after pass, with fixed times and pod dicts (no cluster).

The fault the ordinal rule fixes: a rollout pod that died while no operator watched is
replaced by its StatefulSet at the same ordinal; a scale-up adds one at an ordinal the gang
never had. Only the second is a new engine; the first restarts the gang."""

from __future__ import annotations

import pytest

from rlkube_api.rljob import RLJob, RLJobStatus, RoleStatus
from rlkube_operator.observed import PodView, view_pod
from rlkube_operator.plan import Plan
from rlkube_operator.rollout_scaling import (
    ROLLOUT_SCALED,
    elastic_rollout,
    gang_rollout_replicas,
    new_engine,
    rollout_scaled,
    rollout_starting,
    scaled_away,
    scaled_away_in_spec,
)
from rlkube_operator.status import Observed, compute_status
from rlkube_operator.status.starting import stateful_sets_to_explain
from rlkube_operator.status.writes import is_transition
from tests.operator.helpers import CPU, Obj, at, gang_pods, load_job, pod, replace_pod, set_path
from tests.operator.test_status import after, cond, events, run, running

NAME = "tiny-cpu"
# Parsed once per replica count (parsing evaluates the CEL rules): rollout separate, tensorParallelSize 1.
_REPLICAS = {n: set_path("spec.roles.rollout.replicas", n) for n in range(1, 5)}
ONE = load_job(CPU)  # controller 1 + actor 2 + rollout 1
TWO = load_job(CPU, _REPLICAS[2])
# Not elastic: one engine spans both rollout pods (without GPUs, one process per pod).
TP2 = load_job(CPU, _REPLICAS[2], set_path("spec.roles.rollout.tensorParallelSize", 2))
SIGTERM = (143, "Error")


def scaled(job: RLJob, replicas: int) -> RLJob:
    """`job` after a patch of spec.roles.rollout.replicas: the next generation, its status kept."""
    generation = (job.metadata.generation or 1) + 1
    return load_job(CPU, _REPLICAS[replicas], generation=generation).model_copy(update={"status": job.status})


def rollout_pod(index: int, at_seconds: float, **kwargs: object) -> Obj:
    return pod(NAME, "rollout", index, created=at(at_seconds), **kwargs)  # type: ignore[arg-type]


def view(role: str, index: int, name: str = NAME) -> PodView:
    return view_pod(pod(name, role, index))


def status_of(job: RLJob) -> RLJobStatus:
    assert job.status is not None
    return job.status


def no_restart(d: Plan) -> None:
    assert (d.status.restart_count, d.restart_gang) == (0, False)
    assert d.status.state == "Running"
    assert not any(c.type == "Restarting" for c in d.status.conditions)


# --- the pure rules -------------------------------------------------------------------------------


def test_only_separate_rollout_pods_with_one_process_engines_scale_in_place() -> None:
    assert elastic_rollout(ONE)
    assert elastic_rollout(TWO)
    assert not elastic_rollout(TP2)
    colocated = load_job(
        CPU,
        set_path("spec.roles.rollout", {"placement": "colocated"}),
    )
    assert not elastic_rollout(colocated)


@pytest.mark.parametrize(
    ("job", "role", "index", "away"),
    [
        (ONE, "rollout", 0, False),
        (ONE, "rollout", 1, True),  # past the wanted replicas: removed on purpose
        (ONE, "rollout", 3, True),
        (TWO, "rollout", 1, False),
        (ONE, "actor", 1, False),  # only the rollout scales
        (ONE, "actor", 5, False),
        (TP2, "rollout", 2, False),  # not elastic: the API refuses the change, a pod there is no scaling
    ],
)
def test_scaled_away_is_a_rollout_pod_past_the_wanted_replicas(job: RLJob, role: str, index: int, away: bool) -> None:
    assert scaled_away(job, view(role, index)) is away
    # The pod watch asks the same of the stored spec (camelCase, defaults applied).
    spec = job.model_dump(by_alias=True, mode="json")["spec"]
    assert scaled_away_in_spec(spec, role, index) is away


def test_scaled_away_in_spec_reads_the_defaults_the_api_server_applies() -> None:
    # A stored spec without rollout replicas or placement: 1 replica, colocated (no pods to scale).
    assert not scaled_away_in_spec({"roles": {}}, "rollout", 1)
    assert scaled_away_in_spec({"roles": {"rollout": {"placement": "separate"}}}, "rollout", 1)
    assert not scaled_away_in_spec({"roles": {"rollout": {"placement": "separate"}}}, "rollout", 0)
    assert not scaled_away_in_spec({"roles": {"rollout": {"placement": "separate"}}}, "rollout", None)
    separate_tp2 = {"roles": {"rollout": {"placement": "separate", "replicas": 2, "tensorParallelSize": 2}}}
    assert not scaled_away_in_spec(separate_tp2, "rollout", 3)


def _pods(*named: tuple[str, int]) -> list[PodView]:
    return [view(role, index) for role, index in named]


@pytest.mark.parametrize(
    ("job", "gang", "before", "recorded"),
    [
        (TWO, _pods(("actor", 0), ("rollout", 0), ("rollout", 1)), 1, 2),
        (TWO, _pods(("actor", 0), ("rollout", 0)), 1, 1),  # a scale-up's pod not there yet
        # A scale-down's pod not gone yet: at most the wanted replicas (it is on its way out).
        (ONE, _pods(("rollout", 0), ("rollout", 1)), 2, 1),
        (TWO, _pods(("actor", 0)), None, 0),
        # A scale-up's higher pod first: ordinal 1 is still to come, as a new engine.
        (load_job(CPU, _REPLICAS[3]), _pods(("rollout", 0), ("rollout", 2)), 1, 1),
        # A member gone unseen: the gang keeps its ordinal, so its replacement is told.
        (load_job(CPU, _REPLICAS[3]), _pods(("rollout", 0), ("rollout", 2)), 3, 3),
        (TWO, _pods(("rollout", 1)), None, 0),
        (TP2, _pods(("rollout", 0), ("rollout", 1)), 2, None),  # not elastic: nothing to record
    ],
)
def test_the_gang_records_its_rollout_ordinals(
    job: RLJob, gang: list[PodView], before: int | None, recorded: int | None
) -> None:
    assert gang_rollout_replicas(job, gang, before) == recorded


@pytest.mark.parametrize(
    ("job", "known", "wanted_before", "role", "index", "new"),
    [
        # The gang had rollout ordinals 0 and 1: a pod there replaced a member that died.
        (TWO, 2, 2, "rollout", 0, False),
        (TWO, 2, 2, "rollout", 1, False),
        # Ordinals it never had: a scale-up's new engines.
        (TWO, 1, 2, "rollout", 1, True),
        (load_job(CPU, _REPLICAS[3]), 1, 3, "rollout", 2, True),
        # The wanted replicas were written at the scale-up's first pass, before its pod came:
        # what counts is the gang's ordinals, not the wanted count.
        (TWO, 1, 2, "rollout", 0, False),
        # A status from before the ordinals were recorded: the wanted replicas stand in.
        (TWO, None, 2, "rollout", 1, False),
        (TWO, None, 1, "rollout", 1, True),
        # Other roles never gain pods in place; a rollout that does not scale neither.
        (TWO, 1, 2, "actor", 1, False),
        (TP2, 1, 2, "rollout", 1, False),
    ],
)
def test_a_new_engine_is_a_rollout_pod_at_an_ordinal_the_gang_never_had(
    job: RLJob, known: int | None, wanted_before: int, role: str, index: int, new: bool
) -> None:
    prev = RLJobStatus(
        state="Running",
        gang_pod_uids=["someone"],
        gang_rollout_replicas=known,
        roles={"rollout": RoleStatus(replicas=wanted_before)},
    )
    assert new_engine(job, prev, view(role, index)) is new


@pytest.mark.parametrize(
    ("prev", "job", "told"),
    [
        (RLJobStatus(state="Running", roles={"rollout": RoleStatus(replicas=1)}), TWO, "rollout replicas 1 -> 2"),
        (RLJobStatus(state="Running", roles={"rollout": RoleStatus(replicas=2)}), ONE, "rollout replicas 2 -> 1"),
        (RLJobStatus(state="Restarting", roles={"rollout": RoleStatus(replicas=2)}), ONE, "rollout replicas 2 -> 1"),
        (RLJobStatus(state="Running", roles={"rollout": RoleStatus(replicas=2)}), TWO, None),  # told already
        (RLJobStatus(roles={"rollout": RoleStatus(replicas=1)}), TWO, None),  # the first pass: nothing changed
        (RLJobStatus(state="Running"), TWO, None),  # no rollout counted yet
        (RLJobStatus(state="Running", roles={"rollout": RoleStatus(replicas=1)}), TP2, None),
    ],
)
def test_rollout_scaled_tells_each_change_of_the_wanted_replicas_once(
    prev: RLJobStatus, job: RLJob, told: str | None
) -> None:
    event = rollout_scaled(job, prev)
    if told is None:
        assert event is None
        return
    assert event is not None
    assert (event.type, event.reason) == ("Normal", ROLLOUT_SCALED)
    assert event.message.startswith(told)
    assert ("adds" if "1 -> 2" in told else "removes") in event.message


def _roles(actor: tuple[int, int], rollout: tuple[int, int] | None) -> dict[str, RoleStatus]:
    roles = {"controller": RoleStatus(replicas=1, ready=1), "actor": RoleStatus(replicas=actor[0], ready=actor[1])}
    if rollout is not None:
        roles["rollout"] = RoleStatus(replicas=rollout[0], ready=rollout[1])
    return roles


@pytest.mark.parametrize(
    ("roles", "starting"),
    [
        (_roles((2, 2), (3, 1)), True),  # new engines start; the gang trains with the one it has
        (_roles((2, 2), (3, 3)), True),
        (_roles((2, 2), (3, 0)), False),  # no engine at all: the gang cannot train
        (_roles((2, 1), (3, 2)), False),  # an actor pod is missing: no scaling explains that
        (_roles((2, 2), None), False),
    ],
)
def test_rollout_starting(roles: dict[str, RoleStatus], starting: bool) -> None:
    assert rollout_starting(roles) is starting


def test_a_change_of_wanted_replicas_is_written_at_once_but_counts_alone_may_wait() -> None:
    prev = RLJobStatus(state="Running", roles={"rollout": RoleStatus(replicas=1, ready=1)})
    wanted = prev.model_copy(update={"roles": {"rollout": RoleStatus(replicas=2, ready=1)}})
    counts = prev.model_copy(update={"roles": {"rollout": RoleStatus(replicas=1, ready=0)}})
    assert is_transition(prev, wanted)
    assert not is_transition(prev, counts)


# --- compute_status, pass after pass ------------------------------------------------------------


def test_a_scale_up_adds_engines_without_restarting_the_gang() -> None:
    job = running(ONE)
    assert status_of(job).gang_rollout_replicas == 1
    pods = gang_pods(ONE)

    # The patch: the Event, the wanted replicas written at once; the gang runs on.
    up = scaled(job, 2)
    d = run(up, pods, 20)
    no_restart(d)
    assert events(d) == [("Normal", ROLLOUT_SCALED)]
    assert d.events[0].message.startswith("rollout replicas 1 -> 2")
    assert d.status.roles["rollout"] == RoleStatus(replicas=2, active=1, ready=1, layout="dp2")
    running_cond = cond(d.status, "Running")
    assert (running_cond.status, running_cond.reason) == ("True", "AllPodsReady")
    assert "1/2 rollout pods are ready" in running_cond.message
    assert d.written is not None
    assert d.pods_wanted

    # The new pod starts at an ordinal the gang never had: a new engine, not a replacement.
    starting = [*pods, rollout_pod(1, 21, phase="Pending", ready=False)]
    d = run(after(up, d), starting, 22)
    no_restart(d)
    assert events(d) == []  # told once
    assert d.status.gang_rollout_replicas == 2
    assert view_pod(starting[-1]).uid in (d.status.gang_pod_uids or [])

    # It turns ready: the whole gang is.
    ready = replace_pod(starting, rollout_pod(1, 21))
    d = run(after(up, d), ready, 30)
    no_restart(d)
    assert cond(d.status, "Running").message == "all 5 pods are ready"


def test_a_scale_up_whose_new_pods_cannot_be_created_keeps_the_gang_training() -> None:
    """A quota (say) refuses the scale-up's pod: the job's wait for its pods began with the gang,
    long past pendingTimeoutSeconds, yet the gang needs no new engine, so the job runs on, and
    the Running condition says why the new engine is not coming."""
    job = running(ONE)
    up = scaled(job, 2)
    pods = gang_pods(ONE)
    views = [view_pod(p) for p in pods]
    d = run(up, pods, 20)
    up = after(up, d)
    assert stateful_sets_to_explain(up, views, at(400)) == [f"{NAME}-rollout"]  # its Events are read
    quota = 'pods "tiny-cpu-rollout-1" is forbidden: exceeded quota: gpus'
    for seconds in (400, 1000):
        d = compute_status(up, Observed(views, at(seconds), create_failures={f"{NAME}-rollout": (at(30), quota)}))
        no_restart(d)
        assert not any(c.type == "Failed" for c in d.status.conditions)
        message = cond(d.status, "Running").message
        assert message.startswith("the gang is running; the rollout is scaling: 1/2 rollout pods are ready; ")
        assert f"StatefulSet {NAME}-rollout cannot create the new ones: {quota}" in message
    # A gang member's StatefulSet failing still fails the job (an actor pod gone and not recreated).
    no_actor = [p for p in pods if p["metadata"]["name"] != f"{NAME}-actor-1"]
    assert f"{NAME}-actor" in stateful_sets_to_explain(up, [view_pod(p) for p in no_actor], at(400))


def test_a_new_engine_replaced_before_the_gang_recorded_it_is_still_new() -> None:
    """The scale-up's pod failed and its StatefulSet recreated it between two passes."""
    up = scaled(running(ONE), 2)
    d = run(up, gang_pods(ONE), 20)
    d = run(after(up, d), [*gang_pods(ONE), rollout_pod(1, 25)], 30)
    no_restart(d)


def test_a_scale_down_is_no_failure() -> None:
    job = running(TWO)
    assert status_of(job).gang_rollout_replicas == 2
    pods = gang_pods(TWO)

    down = scaled(job, 1)
    # The StatefulSet stops the highest ordinal: its SIGTERM exit ends it, phase Failed.
    stopping = replace_pod(pods, rollout_pod(1, 0, phase="Failed", ready=False, terminated=SIGTERM))
    d = run(down, stopping, 20)
    no_restart(d)
    assert events(d) == [("Normal", ROLLOUT_SCALED)]
    assert "removes" in d.events[0].message

    gone = [p for p in pods if p["metadata"]["name"] != f"{NAME}-rollout-1"]
    d = run(after(down, d), gone, 25)
    no_restart(d)
    assert cond(d.status, "Running").message == "all 4 pods are ready"
    assert d.status.gang_rollout_replicas == 1

    # Up again: the new pod at ordinal 1 is a new engine (the gang recorded 1 since).
    up = scaled(after(down, d), 2)
    d = run(up, [*gone, rollout_pod(1, 40, phase="Pending", ready=False)], 41)
    no_restart(d)
    assert events(d) == [("Normal", ROLLOUT_SCALED)]


@pytest.mark.parametrize("index", [0, 1])
def test_a_rollout_pod_replaced_while_no_operator_watched_restarts_the_gang(index: int) -> None:
    """The fault test's case (test_faults.py): a member died unseen and its StatefulSet put a
    new pod at its ordinal. The gang lost an engine mid-step: it restarts."""
    job = running(TWO)
    d = run(job, replace_pod(gang_pods(TWO), rollout_pod(index, 50)), 100)
    assert d.status.restart_count == 1
    assert d.restart_gang
    assert f"pod {NAME}-rollout-{index} (role rollout)" in cond(d.status, "Restarting").message
    assert d.status.gang_pod_uids is None
    assert d.status.gang_rollout_replicas is None


def test_a_replacement_is_told_from_an_older_operators_status() -> None:
    """A status written before gangRolloutReplicas existed: the wanted replicas stand in."""
    job = running(TWO)
    older = job.model_copy(update={"status": status_of(job).model_copy(update={"gang_rollout_replicas": None})})
    d = run(older, replace_pod(gang_pods(TWO), rollout_pod(1, 50)), 100)
    assert d.status.restart_count == 1


def test_a_rollout_pod_failing_in_the_gang_still_restarts_it() -> None:
    job = running(TWO)
    d = run(
        job, replace_pod(gang_pods(TWO), rollout_pod(1, 0, phase="Failed", ready=False, terminated=(1, "Error"))), 50
    )
    assert d.status.restart_count == 1
    assert d.restart_gang


def test_a_rollout_that_does_not_scale_records_no_ordinals_and_restarts_on_a_replacement() -> None:
    job = running(TP2)
    assert status_of(job).gang_rollout_replicas is None
    d = run(job, replace_pod(gang_pods(TP2), rollout_pod(1, 50)), 100)
    assert d.status.restart_count == 1


def test_a_scale_up_whose_higher_pod_comes_first_adds_both_as_engines() -> None:
    """The StatefulSet (podManagementPolicy Parallel) creates a scale-up's pods at once, in no
    order: a pass may see ordinal 2 before ordinal 1. The gang then has ordinals 0 and 2, not
    0 up to 2; ordinal 1 arriving next is still a new engine, not a replacement (the spurious
    gang restart that test_lifecycle's in-place scaling saw in 2 of 11 runs)."""
    up = scaled(running(ONE), 3)
    pods = gang_pods(ONE)
    d = run(up, pods, 20)
    no_restart(d)
    higher_first = [*pods, rollout_pod(2, 21, phase="Pending", ready=False)]
    d = run(after(up, d), higher_first, 22)
    no_restart(d)
    assert d.status.gang_rollout_replicas == 1  # the ordinals 0 up to a gap
    both = [*higher_first, rollout_pod(1, 22, phase="Pending", ready=False)]
    d = run(after(up, d), both, 23)
    no_restart(d)
    assert d.status.gang_rollout_replicas == 3


def test_a_member_gone_unseen_after_a_scale_up_still_restarts_the_gang() -> None:
    """The gang had rollout ordinals 0 to 2; ordinal 1 was deleted while no pass saw it fail. A
    pass in between sees 0 and 2 only: the gang keeps ordinal 1 on record, so the pod its
    StatefulSet puts there is a replacement."""
    three = load_job(CPU, _REPLICAS[3])
    job = running(three)
    assert status_of(job).gang_rollout_replicas == 3
    pods = gang_pods(three)
    gap = [p for p in pods if p["metadata"]["name"] != f"{NAME}-rollout-1"]
    d = run(job, gap, 50)
    assert d.status.restart_count == 0
    assert d.status.gang_rollout_replicas == 3
    d = run(after(job, d), [*gap, rollout_pod(1, 55)], 60)
    assert d.status.restart_count == 1
    assert f"pod {NAME}-rollout-1 (role rollout)" in cond(d.status, "Restarting").message
