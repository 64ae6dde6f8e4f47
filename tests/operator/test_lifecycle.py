"""The RLJob lifecycle against the real API server, with the operator running
in-process: children, conditions, Events, printer columns, missing references,
gang restarts, deadlines, unschedulable pools, suspend, success with TTL cleanup,
progress and garbage collection. kwok plays the kubelet (tests/operator/cluster_kit.py)."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from rlkube_api.names import ANNOTATION_ATTEMPT, LABEL_JOB
from rlkube_api.rljob import API_VERSION, KIND
from rlkube_e2e.testing import Kubectl, wait_for
from tests.operator.cluster_kit import (
    TINY_PODS,
    TINY_ROLES,
    Jobs,
    attempt,
    condition,
    is_true,
    roles_of,
    tiny_job,
)

pytestmark = pytest.mark.cluster

JOB = "tiny"


def test_a_new_job_gets_its_children_and_runs(jobs: Jobs) -> None:
    created = jobs.create(tiny_job(JOB, jobs.namespace))
    uid = created["metadata"]["uid"]

    job = jobs.wait_running(JOB)
    pods = jobs.wait_pods(JOB, TINY_PODS)
    assert roles_of(pods) == TINY_ROLES
    assert all(attempt(p) == 0 for p in pods)

    # One StatefulSet and one headless Service per role, the ConfigMap, the RBAC for progress.
    children = jobs.children(JOB)
    sets = {k.split("/", 1)[1]: v for k, v in children.items() if k.startswith("StatefulSet/")}
    assert {name: s["spec"]["replicas"] for name, s in sets.items()} == {
        f"{JOB}-{role}": n for role, n in TINY_ROLES.items()
    }
    services = [v for k, v in children.items() if k.startswith("Service/")]
    assert sorted(s["metadata"]["name"] for s in services) == sorted(f"{JOB}-{role}" for role in TINY_ROLES)
    assert all(s["spec"]["clusterIP"] == "None" for s in services)
    assert f"ConfigMap/{JOB}-config" in children
    assert f"ConfigMap/{JOB}-exits" in children  # the trainers' exit records
    assert f"ServiceAccount/{JOB}-trainer" in children
    assert f"Role/{JOB}-progress" in children
    assert f"RoleBinding/{JOB}-progress" in children
    for key, child in children.items():
        refs = child["metadata"].get("ownerReferences") or []
        assert [(r["apiVersion"], r["kind"], r["name"], r["uid"], r.get("controller")) for r in refs] == [
            (API_VERSION, KIND, JOB, uid, True)
        ], key
        assert child["metadata"]["labels"][LABEL_JOB] == JOB, key

    status = job["status"]
    generation = job["metadata"]["generation"]
    assert status["observedGeneration"] == generation
    for type_ in ("Created", "Running"):
        cond = condition(job, type_)
        assert cond is not None and cond["status"] == "True", cond
        assert cond["observedGeneration"] == generation
        assert cond["lastTransitionTime"]
    assert condition(job, "Running")["reason"] == "AllPodsReady"  # type: ignore[index]
    assert status["startTime"]
    assert status.get("restartCount", 0) == 0
    assert {role: (r["replicas"], r["ready"], r["active"]) for role, r in status["roles"].items()} == {
        role: (n, n, n) for role, n in TINY_ROLES.items()
    }

    assert jobs.table("rljobs", JOB)["STATE"] == "Running"
    event = jobs.wait_event(JOB, "AllPodsReady")
    assert event["type"] == "Normal"
    assert f"all {TINY_PODS} pods are ready" in event["message"]


def test_a_missing_config_map_holds_the_pods_back_until_it_exists(jobs: Jobs) -> None:
    """The reward ConfigMap the job names does not exist. No pod is created
    (none sits scheduled holding GPUs); the job says which object is missing within seconds,
    and starts by itself once it is created."""
    body = tiny_job(JOB, jobs.namespace)
    jobs.create(body, reward=False)

    def missing(job: dict[str, Any]) -> bool:
        created = condition(job, "Created")
        return created is not None and created["reason"] == "MissingReference"

    job = jobs.wait(JOB, missing, "Created=False/MissingReference", timeout=10)
    created = condition(job, "Created")
    assert created is not None and created["status"] == "False"
    assert "ConfigMap tiny-reward (volume reward) does not exist" in created["message"], created
    assert job["status"]["state"] == "Pending"
    event = jobs.wait_event(JOB, "MissingReference", timeout=10)
    assert event["type"] == "Warning" and "ConfigMap tiny-reward" in event["message"]
    assert jobs.table("rljobs", JOB)["STATE"] == "Pending"
    time.sleep(3)  # a few passes later: still no pod, the StatefulSets at zero
    assert not jobs.pods(JOB, include_deleting=True)
    assert {name: s["spec"]["replicas"] for name, s in jobs.statefulsets(JOB).items()} == {
        f"{JOB}-{role}": 0 for role in TINY_ROLES
    }

    jobs.create_reward_config_map(body)
    job = jobs.wait_running(JOB)
    created = condition(job, "Created")
    assert created is not None and (created["status"], created["reason"]) == ("True", "ChildrenCreated")
    assert job["status"].get("restartCount", 0) == 0
    assert not is_true(job, "Failed")


def test_a_reference_that_never_appears_fails_the_job_after_the_pending_timeout(jobs: Jobs) -> None:
    """A claim and a pull Secret that never exist (looked up as metadata only): Failed, naming
    both, after pendingTimeoutSeconds; no pod was ever created."""
    body = tiny_job(
        JOB,
        jobs.namespace,
        {
            "spec.checkpoint.volume": {"persistentVolumeClaim": {"claimName": "rl-ckpt"}},
            "spec.imagePullSecrets": [{"name": "regcred"}],
            "spec.runPolicy.pendingTimeoutSeconds": 3,
        },
    )
    jobs.create(body)
    job = jobs.wait_state(JOB, "Failed", timeout=30)
    failed = condition(job, "Failed")
    assert failed is not None and failed["reason"] == "MissingReference", failed
    assert "PersistentVolumeClaim rl-ckpt (volume checkpoints)" in failed["message"], failed
    assert "Secret regcred (imagePullSecrets)" in failed["message"], failed
    assert "pendingTimeoutSeconds=3" in failed["message"], failed
    assert jobs.wait_event(JOB, "MissingReference")["type"] == "Warning"
    assert not jobs.pods(JOB, include_deleting=True)
    assert all(s["spec"]["replicas"] == 0 for s in jobs.statefulsets(JOB).values())


def test_a_failed_pod_restarts_the_gang_until_the_backoff_limit(jobs: Jobs) -> None:
    jobs.create(tiny_job(JOB, jobs.namespace, {"spec.runPolicy.backoffLimit": 1}))
    jobs.wait_running(JOB)
    old = {p["metadata"]["uid"] for p in jobs.wait_pods(JOB, TINY_PODS)}

    jobs.fail_pod(f"{JOB}-actor-1")
    job = jobs.wait(JOB, lambda j: j["status"].get("restartCount") == 1, "restartCount 1")
    restarting = condition(job, "Restarting")
    assert restarting is not None
    # The replacement gang can be up within one poll; then the condition already reads Resumed.
    if restarting["status"] == "True":
        assert restarting["reason"] == "PodFailed"
        assert f"{JOB}-actor-1" in restarting["message"] and "role actor" in restarting["message"]
    else:
        assert restarting["reason"] == "Resumed"
    event = jobs.wait_event(JOB, "PodFailed")
    assert event["type"] == "Warning"
    assert f"{JOB}-actor-1" in event["message"] and "role actor" in event["message"]

    # The whole gang is replaced by pods of attempt 1, and the job runs again.
    pods = jobs.wait_pods(JOB, TINY_PODS, at_attempt=1)
    assert not {p["metadata"]["uid"] for p in pods} & old
    assert all(p["metadata"]["annotations"][ANNOTATION_ATTEMPT] == "1" for p in pods)
    job = jobs.wait_running(JOB, restarts=1)
    assert not is_true(job, "Restarting")
    assert jobs.table("rljobs", JOB)["RESTARTS"] == "1"

    # A second failure is past backoffLimit=1: Failed, everything scaled away for good.
    jobs.fail_pod(f"{JOB}-rollout-0")
    job = jobs.wait_state(JOB, "Failed")
    failed = condition(job, "Failed")
    assert failed is not None and failed["status"] == "True"
    assert failed["reason"] == "BackoffLimitExceeded"
    assert f"{JOB}-rollout-0" in failed["message"]
    assert job["status"]["restartCount"] == 1
    assert job["status"]["completionTime"]
    assert not is_true(job, "Running")
    jobs.wait_no_pods(JOB)
    assert {name: s["spec"]["replicas"] for name, s in jobs.statefulsets(JOB).items()} == {
        f"{JOB}-{role}": 0 for role in TINY_ROLES
    }
    jobs.wait_event(JOB, "BackoffLimitExceeded")
    time.sleep(3)  # nothing comes back
    assert not jobs.pods(JOB, include_deleting=True)
    assert all(s["spec"]["replicas"] == 0 for s in jobs.statefulsets(JOB).values())
    assert jobs.get(JOB)["status"]["state"] == "Failed"


def test_backoff_limit_zero_fails_on_the_first_failure(jobs: Jobs) -> None:
    jobs.create(tiny_job(JOB, jobs.namespace, {"spec.runPolicy.backoffLimit": 0}))
    jobs.wait_running(JOB)
    jobs.wait_pods(JOB, TINY_PODS)

    jobs.fail_pod(f"{JOB}-controller-0")
    job = jobs.wait_state(JOB, "Failed")
    assert condition(job, "Failed")["reason"] == "BackoffLimitExceeded"  # type: ignore[index]
    assert job["status"].get("restartCount", 0) == 0
    jobs.wait_no_pods(JOB)
    time.sleep(2)
    assert not jobs.pods(JOB, include_deleting=True)


def test_a_container_crash_restarted_in_place_restarts_the_gang(jobs: Jobs) -> None:
    """What a kubelet really reports for a StatefulSet pod (restartPolicy Always) whose
    trainer crashes: the pod stays Running, the container restarts in place with the
    exit code in lastState."""
    jobs.create(tiny_job(JOB, jobs.namespace))
    jobs.wait_running(JOB)
    old = {p["metadata"]["uid"] for p in jobs.wait_pods(JOB, TINY_PODS)}

    jobs.crash_container(f"{JOB}-actor-1", exit_code=137, reason="OOMKilled")
    jobs.wait(JOB, lambda j: j["status"].get("restartCount") == 1, "restartCount 1")
    # OOMKilled is named as the reason.
    message = jobs.wait_event(JOB, "OOMKilled")["message"]
    assert f"{JOB}-actor-1" in message and "OOMKilled (exit code 137)" in message
    pods = jobs.wait_pods(JOB, TINY_PODS, at_attempt=1)
    assert not {p["metadata"]["uid"] for p in pods} & old
    jobs.wait_running(JOB, restarts=1)


def test_a_deleted_pod_restarts_the_gang(jobs: Jobs) -> None:
    jobs.create(tiny_job(JOB, jobs.namespace))
    jobs.wait_running(JOB)
    jobs.wait_pods(JOB, TINY_PODS)

    jobs.kubectl("delete", "pod", f"{JOB}-actor-0", "-n", jobs.namespace)
    jobs.wait(JOB, lambda j: j["status"].get("restartCount") == 1, "restartCount 1", timeout=10)
    # The Event keeps the cause (the condition may already read "Resumed").
    assert f"pod {JOB}-actor-0 (role actor) failed" in jobs.wait_event(JOB, "PodFailed")["message"]
    jobs.wait_pods(JOB, TINY_PODS, at_attempt=1)
    jobs.wait_running(JOB, restarts=1)


def test_a_deleted_pod_that_is_still_stopping_restarts_the_gang_at_once(jobs: Jobs) -> None:
    """A real role pod deleted while it trains keeps running through its grace period (it
    serves its driver until the driver has saved). A finalizer holds the deleted pod here as
    that grace period would: the gang restarts while it is still there, not once it is gone
    (by then the driver may have finished the job without it)."""
    jobs.create(tiny_job(JOB, jobs.namespace))
    jobs.wait_running(JOB)
    jobs.wait_pods(JOB, TINY_PODS)
    pod = f"{JOB}-actor-0"
    hold = '{"metadata":{"finalizers":["rlkube.dev/test-hold"]}}'
    jobs.kubectl("patch", "pod", pod, "-n", jobs.namespace, "--type=merge", "-p", hold)
    try:
        jobs.kubectl("delete", "pod", pod, "-n", jobs.namespace, "--wait=false")
        jobs.wait(JOB, lambda j: j["status"].get("restartCount") == 1, "restartCount 1", timeout=10)
        stopping = json.loads(jobs.kubectl("get", "pod", pod, "-n", jobs.namespace, "-o", "json").stdout)
        assert stopping["metadata"].get("deletionTimestamp") and attempt(stopping) == 0, stopping["metadata"]
        assert "the pod was deleted while the job ran" in jobs.wait_event(JOB, "PodFailed")["message"]
    finally:
        release = '{"metadata":{"finalizers":null}}'
        jobs.kubectl("patch", "pod", pod, "-n", jobs.namespace, "--type=merge", "-p", release, check=False)
    jobs.wait_pods(JOB, TINY_PODS, at_attempt=1)
    jobs.wait_running(JOB, restarts=1)


def test_a_deleted_statefulset_is_recreated_without_restarting_the_gang(jobs: Jobs) -> None:
    """Deleted with its pods orphaned: the operator is woken by the deletion (no waiting for
    the idle pass, minutes away) and applies it again; the new StatefulSet adopts the pods."""
    jobs.create(tiny_job(JOB, jobs.namespace))
    jobs.wait_running(JOB)
    pods = {p["metadata"]["uid"] for p in jobs.wait_pods(JOB, TINY_PODS)}
    old = jobs.statefulsets(JOB)[f"{JOB}-actor"]["metadata"]["uid"]

    jobs.kubectl("delete", "statefulset", f"{JOB}-actor", "-n", jobs.namespace, "--cascade=orphan")
    wait_for(
        lambda: (sts := jobs.statefulsets(JOB).get(f"{JOB}-actor")) is not None and sts["metadata"]["uid"] != old,
        "the actor StatefulSet to be recreated",
        timeout=15,
    )
    job = jobs.wait_running(JOB)
    assert job["status"].get("restartCount", 0) == 0
    assert {p["metadata"]["uid"] for p in jobs.wait_pods(JOB, TINY_PODS)} == pods


def env(pod: dict[str, Any], name: str) -> str | None:
    return next((e.get("value") for e in pod["spec"]["containers"][0]["env"] if e["name"] == name), None)


@pytest.mark.parametrize("replicas", [3, 1], ids=["scale-up", "scale-down"])
def test_resizing_a_running_role_is_refused(jobs: Jobs, kubectl: Kubectl, replicas: int) -> None:
    """Every rank of a gang shares one world size: replicas cannot change under a running job."""
    jobs.create(tiny_job(JOB, jobs.namespace))
    jobs.wait_running(JOB)
    patch = json.dumps({"spec": {"roles": {"actor": {"replicas": replicas}}}})
    result = kubectl("-n", jobs.namespace, "patch", "rljob", JOB, "--type=merge", "-p", patch, check=False)
    assert result.returncode != 0
    assert "spec.roles.actor.replicas" in result.stderr and "immutable" in result.stderr


def test_rollout_replicas_scale_in_place_without_restarting_the_gang(jobs: Jobs) -> None:
    """Elastic rollout capacity (rollout_scaling.py): separate one-process rollout engines are
    added and removed by patching spec.roles.rollout.replicas; the gang keeps running."""
    jobs.create(tiny_job(JOB, jobs.namespace))
    jobs.wait_running(JOB)
    before = {p["metadata"]["name"]: p["metadata"]["uid"] for p in jobs.wait_pods(JOB, TINY_PODS)}
    rollout = TINY_ROLES["rollout"]

    def scaled_to(replicas: int) -> dict[str, str]:
        jobs.patch(JOB, {"spec": {"roles": {"rollout": {"replicas": replicas}}}})
        told = f"rollout replicas {rollout if replicas > rollout else rollout + 2} -> {replicas}"
        wait_for(
            lambda: any(e.get("reason") == "RolloutScaled" and told in e["message"] for e in jobs.events(JOB)),
            f"the Event RolloutScaled {told}",
            timeout=15,
        )
        sets = jobs.statefulsets(JOB)
        assert sets[f"{JOB}-rollout"]["spec"]["replicas"] == replicas
        pods = jobs.wait_pods(JOB, TINY_PODS - rollout + replicas, timeout=30)
        job = jobs.wait(
            JOB,
            lambda j: is_true(j, "Running") and (j["status"]["roles"]["rollout"].get("ready") == replicas),
            f"{replicas} rollout pods ready",
        )
        # No gang restart: the count, the attempt, and every pod that was there is the same pod.
        assert job["status"]["state"] == "Running"
        # A scale-up's pods come in no order (the StatefulSet is Parallel): ordinal 1 seen after
        # ordinal 2 must not be judged a replaced member (test_rollout_scaling.py pins the rule).
        # The message (read only on failure) carries the Events.
        assert job["status"].get("restartCount", 0) == 0, (
            f"the gang restarted while scaling to {replicas}: "
            f"{[(e.get('reason'), e.get('message')) for e in jobs.events(JOB)]}"
        )
        assert all(attempt(p) == 0 for p in pods)
        assert job["status"]["gangRolloutReplicas"] == replicas
        return {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods}

    grown = scaled_to(rollout + 2)
    assert {name: grown[name] for name in before} == before
    assert sorted(set(grown) - set(before)) == [f"{JOB}-rollout-{i}" for i in range(rollout, rollout + 2)]
    assert scaled_to(rollout) == before
    assert not any(e.get("reason") in ("PodFailed", "Restarting") for e in jobs.events(JOB))


def test_active_deadline_fails_the_job(jobs: Jobs) -> None:
    jobs.create(tiny_job(JOB, jobs.namespace, {"spec.runPolicy.activeDeadlineSeconds": 5}))
    jobs.wait_running(JOB)
    job = jobs.wait_state(JOB, "Failed", timeout=30)
    failed = condition(job, "Failed")
    assert failed is not None and failed["reason"] == "DeadlineExceeded"
    assert "activeDeadlineSeconds=5" in failed["message"]
    jobs.wait_no_pods(JOB)
    jobs.wait_event(JOB, "DeadlineExceeded")


def test_a_role_that_fits_no_node_is_unschedulable(jobs: Jobs) -> None:
    body = tiny_job(
        JOB,
        jobs.namespace,
        {
            # 16 GPUs per pod: more than any node has (8 at most).
            "spec.roles.actor": {"replicas": 1, "gpusPerReplica": 16},
            # 128 samples per mini-batch over 16 ranks: 8 each.
            "spec.actor.ppoMicroBatchSizePerGpu": 8,
            "spec.runPolicy.pendingTimeoutSeconds": 3,
        },
    )
    jobs.create(body)

    job = jobs.wait(JOB, lambda j: is_true(j, "Unschedulable"), "condition Unschedulable", timeout=30)
    cond = condition(job, "Unschedulable")
    assert cond is not None
    assert "role actor" in cond["message"]
    assert f"{JOB}-actor-0" in cond["message"]
    assert "nvidia.com/gpu" in cond["message"]
    assert job["status"]["state"] not in ("Failed", "Running")
    assert not is_true(job, "Failed")
    jobs.wait_event(JOB, "Unschedulable")
    time.sleep(2)
    assert jobs.get(JOB)["status"]["state"] != "Failed"


def test_suspend_removes_the_pods_and_resume_brings_them_back(jobs: Jobs) -> None:
    jobs.create(tiny_job(JOB, jobs.namespace))
    jobs.wait_running(JOB)
    jobs.wait_pods(JOB, TINY_PODS)

    jobs.patch(JOB, {"spec": {"suspend": True}})
    job = jobs.wait_state(JOB, "Suspended")
    assert is_true(job, "Suspended")
    assert not is_true(job, "Running")
    jobs.wait_no_pods(JOB)
    assert all(s["spec"]["replicas"] == 0 for s in jobs.statefulsets(JOB).values())
    assert len(jobs.statefulsets(JOB)) == len(TINY_ROLES)

    jobs.patch(JOB, {"spec": {"suspend": False}})
    jobs.wait_pods(JOB, TINY_PODS)
    job = jobs.wait_running(JOB)
    assert not is_true(job, "Suspended")
    assert job["status"].get("restartCount", 0) == 0
    assert {name: s["spec"]["replicas"] for name, s in jobs.statefulsets(JOB).items()} == {
        f"{JOB}-{role}": n for role, n in TINY_ROLES.items()
    }


def test_the_driver_finishing_succeeds_and_the_ttl_cleans_up(jobs: Jobs) -> None:
    jobs.create(tiny_job(JOB, jobs.namespace, {"spec.runPolicy.ttlSecondsAfterFinished": 3}))
    jobs.wait_running(JOB)
    jobs.wait_pods(JOB, TINY_PODS)

    jobs.finish_driver(JOB)
    job = jobs.wait_state(JOB, "Succeeded")
    succeeded = condition(job, "Succeeded")
    assert succeeded is not None and succeeded["status"] == "True"
    assert succeeded["reason"] == "DriverSucceeded"
    assert job["status"]["completionTime"]
    assert not is_true(job, "Running")
    jobs.wait_event(JOB, "DriverSucceeded")

    # After ttlSecondsAfterFinished the children go; the RLJob stays, Succeeded.
    jobs.wait_no_pods(JOB)
    wait_for(lambda: not jobs.children(JOB), "the children to be deleted after the TTL", timeout=30)
    time.sleep(4)  # and nothing recreates them
    assert not jobs.children(JOB)
    assert not jobs.pods(JOB, include_deleting=True)
    job = jobs.get(JOB)
    assert job["status"]["state"] == "Succeeded"
    assert job["metadata"].get("deletionTimestamp") is None


def test_driver_progress_is_mirrored_into_the_status(jobs: Jobs) -> None:
    jobs.create(tiny_job(JOB, jobs.namespace))
    jobs.wait_running(JOB)
    jobs.wait_pods(JOB, TINY_PODS)

    progress = {
        "step": 3,
        "totalSteps": 30,
        "percentDone": 10.0,
        "estimatedCompletionTime": "2026-12-01T12:00:00Z",
        "timeRemaining": "2h5m",
        "rewardMean": 0.5,
        "tokensPerSecondPerGPU": 123.0,
        "lastCheckpointStep": 0,
    }
    jobs.report_progress(JOB, progress)
    job = jobs.wait(JOB, lambda j: (j["status"].get("progress") or {}).get("step") == 3, "progress step 3")
    assert job["status"]["progress"] == progress
    row = jobs.table("rlj", JOB)
    assert (row["STATE"], row["STEP"], row["TOTAL"], row["%"], row["REWARD"]) == ("Running", "3", "30", "10", "0.5")
    wide = jobs.table("rlj", JOB, "-o", "wide")
    assert wide["TOKENS/S/GPU"] == "123"
    assert wide["ETA"] == "2h5m"

    # A later report replaces it.
    jobs.report_progress(JOB, {**progress, "step": 4, "lastCheckpointStep": 4})
    job = jobs.wait(JOB, lambda j: j["status"]["progress"]["step"] == 4, "progress step 4")
    assert job["status"]["progress"]["lastCheckpointStep"] == 4

    # An ended job has no time remaining: the stored status loses the driver's last estimate
    # (a merge patch that only left the fields out would keep it), and the ETA column is empty.
    jobs.finish_driver(JOB)
    job = jobs.wait_state(JOB, "Succeeded")
    ended = job["status"]["progress"]
    assert "timeRemaining" not in ended and "estimatedCompletionTime" not in ended, ended
    assert ended["step"] == 4
    assert jobs.table("rlj", JOB, "-o", "wide")["ETA"] in ("", "<none>")


def test_deleting_the_job_collects_every_child(jobs: Jobs) -> None:
    jobs.create(tiny_job(JOB, jobs.namespace))
    jobs.wait_running(JOB)
    jobs.wait_pods(JOB, TINY_PODS)
    assert jobs.children(JOB)

    jobs.delete(JOB)
    wait_for(lambda: not jobs.exists(JOB), "the RLJob to be gone (the operator releases its finalizer)", 30)
    wait_for(lambda: not jobs.children(JOB), "every child to be garbage-collected", timeout=60)
    jobs.wait_no_pods(JOB, timeout=60)
