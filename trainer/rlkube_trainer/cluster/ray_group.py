"""`RankGroup` over Ray: one Ray actor per rank, placed on the pod (Ray node) that
advertises its group and pod index (ray_node.py). A rank that dies fails the call
at once with the role and rank named: results are collected with ray.wait, so one
dead rank is seen even while the others are blocked in a collective waiting for it.

A Ray actor runs one call at a time unless its calls go to concurrency groups (threads of
their own). The asynchronous schedule needs what the ranks in one process get from the
driver's threads (rank_group.LocalRankGroup): a generation in flight on the rollout thread
while the same rank updates the actor (colocate_async) or takes a weight push, paused at a
step boundary (async_training.partial_rollout). So `generate` runs in a group of its own and
pausing and resuming it in another; everything else keeps the actor's default thread, in the
order the driver calls it.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import ray
import yaml

from rlkube_api.event_message import fit_event_message
from rlkube_api.exit_codes import TERMINATION_MESSAGE_LIMIT
from rlkube_api.placement import Group, Role
from rlkube_trainer.cluster.config_errors import config_errors
from rlkube_trainer.cluster.rank_group import Pending, RankGroup, RankLost
from rlkube_trainer.cluster.ray_resources import pod_of_resource, resource_name
from rlkube_trainer.workers.rank import Rank, RankSpec

log = logging.getLogger("rlkube.trainer")
# How long the driver waits for a rank's answer before declaring it lost.
CALL_TIMEOUT = 1800.0
# How much of a failed rank's traceback reaches the driver: its last lines, where the error is.
TRACEBACK_LINES = 20
# The most of a rank's error a RankLost carries (UTF-8 bytes): with the exit record's words
# around it, it stays within the termination message the kubelet keeps.
ERROR_LIMIT = TERMINATION_MESSAGE_LIMIT * 3 // 4
_TERMINAL_COLOUR = re.compile(r"\x1b\[[0-9;]*m")
# A line of a traceback that only marks the expression above it (or is empty).
_MARKS = re.compile(r"^[\s^~]*$")


# The rank's calls that leave its default thread, and the thread (concurrency group) each takes.
GENERATION = "generation"
CONTROL = "control"
GENERATION_CALLS = {"generate": GENERATION}
CONTROL_CALLS = {"pause_generation": CONTROL, "resume_generation": CONTROL}


def concurrency_of(specs: Sequence[RankSpec]) -> dict[str, str]:
    """Which calls of these ranks run off the default thread. A rollout engine of one process
    generates beside the rank's other calls; a tensor-parallel engine's generation is a chain
    of collectives across its ranks, so it stays in call order with the rank's other
    collectives (an FSDP update beside it could interleave two groups' collectives differently
    on different ranks and hang both): it keeps the default thread, where it cannot be paused."""
    if any(Role.ROLLOUT not in spec.hosts for spec in specs):
        return {}
    if all(spec.tensor_parallel_size == 1 for spec in specs):
        return GENERATION_CALLS | CONTROL_CALLS
    return {}


class RayRankGroup(RankGroup):
    def __init__(
        self,
        role: Role,
        handles: list[Any],
        timeout: float = CALL_TIMEOUT,
        concurrency: dict[str, str] | None = None,
    ) -> None:
        self.role = role
        self.handles = handles
        self.timeout = timeout
        self.concurrency = concurrency or {}

    def __len__(self) -> int:
        return len(self.handles)

    def submit(self, method: str, args: Sequence[tuple[Any, ...]], ranks: Sequence[int] | None = None) -> Pending:
        ranks = list(ranks) if ranks is not None else list(range(len(args)))
        refs = [self._method(r, method).remote(*a) for r, a in zip(ranks, args, strict=True)]
        return Pending(ranks, refs, method)

    def wait(self, pending: Pending) -> list[Any]:
        """Results in the order submitted; the first failure raises RankLost naming its rank."""
        rank_of = dict(zip(pending.handles, pending.ranks, strict=True))
        left_refs = list(pending.handles)
        deadline = time.monotonic() + self.timeout
        while left_refs:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RankLost(self.role, rank_of[left_refs[0]], f"no answer within {self.timeout:.0f} s")
            done, left_refs = ray.wait(left_refs, num_returns=1, timeout=min(left, 5.0))
            for ref in done:
                try:
                    ray.get(ref)
                except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError) as exc:
                    # A configuration error in a rank is the run's, not the rank's: no restart helps.
                    cause = getattr(exc, "cause", None)
                    if isinstance(cause, config_errors()):
                        raise cause from None
                    raise RankLost(self.role, rank_of[ref], rank_error(exc, pending.method)) from exc
        return list(ray.get(list(pending.handles)))

    def _method(self, rank: int, method: str) -> Any:
        bound = getattr(self.handles[rank], method)
        group = self.concurrency.get(method)
        return bound.options(concurrency_group=group) if group is not None else bound

    def done(self, pending: Pending) -> bool:
        refs = list(pending.handles)
        finished, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        return len(finished) == len(refs)

    def only(self, rank: int) -> RayRankGroup:
        return RayRankGroup(self.role, [self.handles[rank]], self.timeout, self.concurrency)


def rank_error(exc: BaseException, method: str = "") -> str:
    """What a rank's failure in `method` says, for the driver's error, the exit record, the
    job's status and its Events: the rank's own exception (Ray's task error unwrapped to its
    cause), its type and message first, then the last lines of the rank's traceback, whose end
    names the error again; at most ERROR_LIMIT bytes, cut in the middle (`fit_event_message`)
    so that both ends survive."""
    call = f"{method}()" if method else "the call"
    cause = exc.cause if isinstance(exc, ray.exceptions.RayTaskError) else None
    own = cause if isinstance(cause, BaseException) else exc
    message = str(own).strip()
    if own is exc:
        # No cause to unwrap (an actor that died, a task error whose cause did not unpickle):
        # Ray's own text, whose first line names the call and the process.
        said = f"{call}: {message or type(exc).__name__}"
    else:
        said = f"{call} raised {type(own).__name__}" + (f": {message}" if message else "")
        # Ray's text of a task error is the rank's traceback (its first line the call and the
        # process, in terminal colours; carets under the failing expressions).
        lines = [line for line in _TERMINAL_COLOUR.sub("", str(exc)).splitlines()[1:] if not _MARKS.match(line)]
        if lines:
            said += "\n" + "\n".join(lines[-TRACEBACK_LINES:])
    return fit_event_message(said, ERROR_LIMIT)


def launch_ray_group(group: Group, specs: list[RankSpec], config: dict[str, Any]) -> RayRankGroup:
    """A Ray actor per rank on its pod's Ray node, one GPU each where the group has GPUs."""
    concurrency = concurrency_of(specs)
    # Ray takes concurrency groups only where the actor class is made remote, not in .options().
    groups = dict.fromkeys(sorted(set(concurrency.values())), 1)
    # ray.remote's typed overloads leave out its actor options; concurrency_groups is one.
    remote = ray.remote(concurrency_groups=groups)(Rank) if groups else ray.remote(Rank)  # type: ignore[call-overload]
    handles = [
        remote.options(
            name=f"{group.name}-{spec.rank}",
            resources={resource_name(group.name, group.pod_of(spec.rank)): 1},
            num_cpus=0,
            num_gpus=1 if group.uses_gpus else 0,
            max_restarts=0,
        ).remote(config, spec)
        for spec in specs
    ]
    return RayRankGroup(group.name, handles, concurrency=concurrency)


class RayRolloutFleet:
    """The rollout engines' Ray side (elastic_rollout.Fleet): the rollout pods are the alive Ray
    nodes advertising the rollout group's resource, and the job wants as many as the mounted
    config says now (the operator re-renders it when `spec.roles.rollout.replicas` changes;
    the kubelet refreshes the file within about a minute)."""

    def __init__(
        self, group: Group, spec_of: Callable[[int], RankSpec], config: dict[str, Any], config_path: Path | None
    ) -> None:
        self.group = group
        self.spec_of = spec_of
        self.config = config
        self.config_path = config_path

    def present(self) -> set[int]:
        procs = self.group.procs_per_pod
        ranks: set[int] = set()
        for node in ray.nodes():  # type: ignore[no-untyped-call]
            if not node.get("Alive"):
                continue
            for name in node.get("Resources") or {}:
                pod = pod_of_resource(self.group.name, name)
                if pod is not None:
                    ranks |= set(range(pod * procs, (pod + 1) * procs))
        return ranks

    def wanted(self) -> int | None:
        from rlkube_trainer.cluster.elastic_rollout import wanted_ranks  # noqa: PLC0415

        if self.config_path is None:
            return None
        try:
            config = yaml.safe_load(self.config_path.read_text())
        except (OSError, yaml.YAMLError) as error:
            log.warning("rollout replicas unknown (%s): every present engine is used", error)
            return None
        return wanted_ranks(config if isinstance(config, dict) else {}, self.group.procs_per_pod)

    def launch(self, rank: int) -> RayRankGroup:
        # An engine dropped while its pod was still there (its actor unreachable, not yet dead)
        # keeps its name: that actor is gone for the run, so the name is taken back.
        try:
            stale = ray.get_actor(f"{self.group.name}-{rank}")
        except ValueError:
            pass
        else:
            ray.kill(stale)
        return launch_ray_group(self.group, [self.spec_of(rank)], self.config)
