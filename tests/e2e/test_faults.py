"""A role pod of a real training job killed at many points of its life: the tiny CPU job
(tests/e2e/test_tiny_job.py) from the trainer image on the package's real nodes, with the
operator as its own process.
Each kill deletes one pod of the gang (the driver, an actor rank or the rollout engine,
each in turn, in a seeded order) at a point of its life: while the new gang starts up
(0 steps past its resume point) or 1 to 6 steps past it, each distance in turn. Each kill must give one gang restart.
A kill while the gang trains loses no step: the deleted pod's loss restarts the gang, the
driver's SIGTERM stops it after the step in progress with a checkpoint (the deleted pod
serves it until then), and the next gang resumes from there. A kill while it starts up
resumes from the last checkpoint, with no more than `saveFreq` steps trained again. The
job must still succeed with a right history: every step in metrics.jsonl once, in order,
the restart count equal to the kills, one PodFailed Event per kill.

`make test` kills RLKUBE_FAULT_POD_KILLS=2 times (the driver and an actor rank, one while the
new gang starts up, one past its resume point: the suite's time); `make faults` 10 times (the counts in
docs/reliability.md). RLKUBE_FAULT_SEED picks the points and the pods.
"""

from __future__ import annotations

import os
import random
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from rlkube_api.rljob import RunPolicy
from rlkube_e2e import tinyjob
from rlkube_e2e.testing import Kubectl, wait_for
from tests.e2e.real_node_kit import PodLogs
from tests.operator.cluster_kit import OperatorProcess

if TYPE_CHECKING:
    from tests.e2e.real_node_kit import RealCluster

pytestmark = [pytest.mark.cluster, pytest.mark.e2e, pytest.mark.slow]

KILLS = int(os.environ.get("RLKUBE_FAULT_POD_KILLS", "2"))
SEED = int(os.environ.get("RLKUBE_FAULT_SEED", "18"))
SAVE_FREQ = 5
# New steps after a resume before the kill: 0 kills the gang while it starts up.
MOST_STEPS_BETWEEN_KILLS = 6
STEPS = 3 * SAVE_FREQ + (MOST_STEPS_BETWEEN_KILLS + 1) * KILLS + 4
ROLE_PODS = ("controller-0", "actor-0", "actor-1", "rollout-0")
TIMEOUT = 1200.0
# runPolicy.terminationGracePeriodSeconds's default: what the operator gives every pod.
GRACE_SECONDS = RunPolicy.model_fields["termination_grace_period_seconds"].default
RESUMED = re.compile(r"resumed from \S+ \(step (\d+)\)")


@dataclass(frozen=True)
class Kill:
    pod: str
    step: int  # the last step trained when it was killed
    checkpoint: int  # the latest complete checkpoint then (0: none)
    extra: int  # steps past the resume point it waited for
    resumes_before: int  # the driver log's resumes at the kill: the next one is this kill's


def _latest_checkpoint(job: tinyjob.TinyJob) -> int:
    latest = job.checkpoints / "latest"
    return int(latest.read_text().strip().rsplit("_", 1)[-1]) if latest.exists() else 0


def _where_the_job_stands(kubectl: Kubectl, namespace: str, name: str) -> str:
    """The job's status, its pods' phases and containers, and the namespace's Events: what a
    failed wait needs to say which side (operator, kubelet, trainer) did not do its part."""
    status = kubectl("-n", namespace, "get", "rljob", name, "-o", "jsonpath={.status}", check=False).stdout
    pods = kubectl(
        "-n",
        namespace,
        "get",
        "pods",
        "-o",
        "custom-columns=NAME:.metadata.name,UID:.metadata.uid,PHASE:.status.phase,"
        "DELETING:.metadata.deletionTimestamp,ATTEMPT:.metadata.annotations.rlkube\\.dev/attempt,"
        "RESTARTS:.status.containerStatuses[*].restartCount,"
        "LAST:.status.containerStatuses[*].lastState.terminated.exitCode",
        check=False,
    ).stdout
    events = kubectl("-n", namespace, "get", "events", "--sort-by=.lastTimestamp", check=False).stdout
    return f"job status: {status}\npods:\n{pods}\nevents (last 40):\n" + "\n".join(events.splitlines()[-40:])


def _steps(job: tinyjob.TinyJob) -> list[int]:
    return [int(row["step"]) for row in job.metrics()]


def test_role_pods_killed_at_many_points_restart_and_resume_each_time(
    real_cluster: RealCluster,
    watching_operator: OperatorProcess,
    real_kubectl: Kubectl,
    real_namespace: str,
    tmp_path: Path,
) -> None:
    rng = random.Random(SEED)
    kubectl, namespace = real_kubectl, real_namespace
    job = tinyjob.prepare(tmp_path / "work", name="tiny-faults", steps=STEPS, save_freq=SAVE_FREQ, pool="real")
    tinyjob.from_image(job, real_cluster.images["trainer-cpu"].ref)
    job.manifest["spec"]["runPolicy"].update(backoffLimit=KILLS + 2, activeDeadlineSeconds=3600)
    with PodLogs(real_cluster.cluster.kubeconfig, namespace, f"{job.name}-controller-0") as driver_log:
        tinyjob.apply(kubectl, namespace, job)
        _kill_and_check(job, kubectl, namespace, driver_log, watching_operator, rng)


def _kill_and_check(
    job: tinyjob.TinyJob,
    kubectl: Kubectl,
    namespace: str,
    driver_log: PodLogs,
    watching_operator: OperatorProcess,
    rng: random.Random,
) -> None:
    """Kills a role pod KILLS times, each at its drawn point, and checks the history each time
    and at the end."""
    kills: list[Kill] = []
    stopped: list[float] = []  # seconds from each kill's delete to its pod's end

    def resumes() -> list[int]:
        return [int(m) for m in RESUMED.findall(driver_log.text())]

    resumed_before = 0
    # Every role pod and every distance from the resume point (0: while the gang starts up)
    # in turn, in a seeded order.
    victims = [ROLE_PODS[i % len(ROLE_PODS)] for i in range(KILLS)]
    extras = [i % (MOST_STEPS_BETWEEN_KILLS + 1) for i in range(KILLS)]
    rng.shuffle(victims)
    rng.shuffle(extras)
    try:
        for k in range(KILLS):
            # The gang of attempt k runs (the operator says so), then `extra` steps past its resume point.
            tinyjob.wait_state(kubectl, namespace, job.name, ("Running",), TIMEOUT)
            status = tinyjob.status(kubectl, namespace, job.name)
            assert status.get("restartCount", 0) == k, status
            # Running again only once the new gang's driver has reported a step of its own.
            assert k == 0 or (status.get("progress") or {}).get("attempt") == k, status
            extra = extras[k]
            # The first kill comes after the first checkpoint, so every kill is followed by a resume.
            target = SAVE_FREQ + max(extra, 1) if k == 0 else 0
            if k and extra > 0:
                # The old gang's rows stay in metrics.jsonl until the new driver resumes and rewinds them.
                wait_for(
                    lambda before=resumed_before: len(resumes()) > before, f"the resume after kill {k}", timeout=TIMEOUT
                )
                target = resumes()[resumed_before] + extra

            def reached(target: int = target) -> bool:
                steps = _steps(job)
                return (max(steps) if steps else 0) >= target

            wait_for(reached, f"step {target} (kill {k + 1})", timeout=TIMEOUT, interval=0.25)
            victim = victims[k]
            pod = f"{job.name}-{victim}"
            uid = kubectl("-n", namespace, "get", "pod", pod, "-o", "jsonpath={.metadata.uid}").stdout
            deleted = time.monotonic()
            kubectl("-n", namespace, "delete", "pod", pod, "--wait=false")
            steps, checkpoint = _steps(job), _latest_checkpoint(job)
            done = max(steps) if steps else 0
            # A right history at every point: each step once, in order (a resume drops the redone rows).
            assert steps == list(range(1, done + 1)), steps
            kills.append(Kill(victim, done, checkpoint, extra, len(resumes())))
            assert done - checkpoint <= SAVE_FREQ, kills[-1]
            resumed_before = kills[-1].resumes_before
            # SIGTERM reached the trainer and it ended once its driver had saved: the pod went
            # well within its grace period, not killed at its end (a trainer ignoring SIGTERM
            # as PID 1 would be, or a role pod waiting for a driver that never stops, takes the
            # whole period). A fifth of it is left for a loaded machine's slow teardown.
            wait_for(
                lambda pod=pod, uid=uid: (
                    kubectl("-n", namespace, "get", "pod", pod, "-o", "jsonpath={.metadata.uid}", check=False).stdout
                    != uid
                ),
                f"pod {pod} (uid {uid}) gone",
                timeout=GRACE_SECONDS + 30,
            )
            stopped.append(time.monotonic() - deleted)
            assert stopped[-1] < GRACE_SECONDS * 0.8, f"{pod} took {stopped[-1]:.0f} s to stop"
            wait_for(
                lambda k=k: tinyjob.status(kubectl, namespace, job.name).get("restartCount", 0) == k + 1,
                f"the gang restart after kill {k + 1}",
                timeout=120,
            )
        final = tinyjob.wait_state(kubectl, namespace, job.name, ("Succeeded", "Failed"), TIMEOUT)
    except (TimeoutError, AssertionError) as error:
        log = driver_log.text()[-3000:] or "(no driver log)"
        raise AssertionError(
            f"{error}\nkills so far {kills}\n{_where_the_job_stands(kubectl, namespace, job.name)}"
            f"\ndriver log:\n{log}\noperator log:\n{watching_operator.log()[-3000:]}"
        ) from error
    assert final["state"] == "Succeeded", final
    assert final["restartCount"] == KILLS
    assert final["progress"]["step"] == STEPS
    assert _steps(job) == list(range(1, STEPS + 1))
    # Every resume was from a complete checkpoint, never from one older than an earlier
    # resume's. The resume after a kill while the gang trained is from at least the step
    # trained at the kill (saved on SIGTERM: no work thrown away); after a kill while it
    # started up, from at least the checkpoint there was then.
    resumed = resumes()
    assert len(resumed) == KILLS, (resumed, kills, driver_log.errors)
    assert resumed == sorted(resumed) and all(r > 0 for r in resumed), (resumed, kills)
    assert all(kill.checkpoint > 0 for kill in kills), kills  # every restart resumed
    for kill in kills:
        kept = kill.step if kill.extra > 0 else kill.checkpoint
        assert resumed[kill.resumes_before] >= kept, (kill, resumed)
    events = kubectl("-n", namespace, "get", "events", "--field-selector", f"involvedObject.name={job.name}").stdout
    assert events.count("PodFailed") == KILLS, events
    redone = sum(max(kill.step - resumed[kill.resumes_before], 0) for kill in kills)
    print(
        f"faults: {KILLS} role pods killed {[(kill.pod, kill.step, kill.extra) for kill in kills]}, "
        f"each gone {[round(s, 1) for s in stopped]} s after its delete, "
        f"{KILLS} gang restarts, resumes from steps {resumed}, steps trained again {redone} "
        f"(none after a kill while training), {STEPS} steps each once in metrics.jsonl"
    )
