"""reconcile(): carries the plan out, in order, against a fake Kube that records the calls.
No cluster: the pods and the RLJob body are dicts as the API server returns them."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from kubernetes.client.exceptions import ApiException

from rlkube_api.conditions import State
from rlkube_api.rljob import Condition, Progress, RLJobStatus, RoleStatus, RunPolicy
from rlkube_operator.job_state import TrackedJob
from rlkube_operator.reconcile import Reconciler, ReconcileResult, status_patch
from rlkube_operator.status.before_pods import REFERENCE_RECHECK_SECONDS
from rlkube_operator.status.compute import FINISHED_GRACE_SECONDS
from rlkube_operator.status.starting import CREATE_FAILURE_GRACE_SECONDS, name_volume_source
from tests.operator.helpers import CPU, NAMESPACE, T0, UID, Obj, at, example, gang_pods, iso, load_job, pod, replace_pod

JOB = load_job(CPU)
NAME = "tiny-cpu"
SETS = {"tiny-cpu-controller", "tiny-cpu-actor", "tiny-cpu-rollout"}
Call = tuple[Any, ...]


INVALID_MESSAGE = (
    'StatefulSet.apps "tiny-cpu-actor" is invalid: spec.template.spec.volumes[2].emptyDir.sizeLimit: '
    "Invalid value: quantities must be positive"
)


class FakeKube:
    """Records every call; `refuse` holds 'Kind/name' the API server turns away (403),
    `invalid` those it refuses as invalid (422), `missing` the objects pods name that it
    does not have (every other one exists)."""

    def __init__(
        self,
        refuse: Iterable[str] = (),
        secret_exists: bool = False,
        invalid: Iterable[str] = (),
        missing: Iterable[str] = (),
    ) -> None:
        self.calls: list[Call] = []
        self.refuse = set(refuse)
        self.invalid = set(invalid)
        self.missing = set(missing)
        self.warnings: dict[str, str] = {}
        self.create_failures: dict[str, tuple[datetime, str]] = {}
        self.events: dict[str, list[dict[str, Any]]] = {}  # by the pod UID they are about
        self.exits: dict[str, dict[str, Any]] = {}  # the job's exit records, by pod UID
        self.secret_exists = secret_exists
        self.version = 100
        self.manifests: dict[str, dict[str, Any]] = {}

    def apply(self, manifest: dict[str, Any], dry_run: bool = False) -> None:
        key = f"{manifest['kind']}/{manifest['metadata']['name']}"
        self.calls.append(("dry_run_apply" if dry_run else "apply", key))
        if key in self.refuse:
            raise ApiException(status=403, reason="Forbidden")
        if key in self.invalid:
            error = ApiException(status=422, reason="Unprocessable Entity")
            error.body = json.dumps({"message": INVALID_MESSAGE})
            raise error
        if not dry_run:
            self.manifests[key] = manifest

    def create(self, manifest: dict[str, Any]) -> bool:
        key = f"{manifest['kind']}/{manifest['metadata']['name']}"
        self.calls.append(("create", key))
        if self.secret_exists:
            return False
        self.manifests[key] = manifest
        return True

    def delete_pods(self, namespace: str, pods: Iterable[tuple[str, str]], grace_period_seconds: int = 0) -> None:
        self.calls.append(("delete_pods", namespace, tuple(sorted(pods)), grace_period_seconds))

    def scale_to_zero(self, namespace: str, stateful_sets: Iterable[str]) -> None:
        self.calls.append(("scale_to_zero", namespace, tuple(sorted(stateful_sets))))

    def delete_children(self, namespace: str, job: str) -> None:
        self.calls.append(("delete_children", namespace, job))

    def exists(self, namespace: str, kind: str, name: str) -> bool:
        self.calls.append(("exists", namespace, f"{kind}/{name}"))
        return f"{kind}/{name}" not in self.missing

    def node_labels(self) -> list[dict[str, str]]:
        self.calls.append(("node_labels", "", ""))
        return []

    def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> dict[str, Any]:
        self.calls.append(("patch_status", namespace, name, json.dumps(status, sort_keys=True)))
        self.version += 1
        body = body_of()
        body["metadata"]["resourceVersion"] = str(self.version)
        body["status"] = status
        return body

    def pod_warning(self, namespace: str, uid: str) -> str | None:
        self.calls.append(("pod_warning", namespace, uid))
        return self.warnings.get(uid)

    def pod_events(self, namespace: str, uid: str) -> list[dict[str, Any]]:
        self.calls.append(("pod_events", namespace, uid))
        return self.events.get(uid, [])

    def exit_records(self, namespace: str, job: str) -> dict[str, dict[str, Any]]:
        self.calls.append(("exit_records", namespace, job))
        return self.exits

    def create_failure(self, namespace: str, stateful_set: str) -> tuple[datetime, str] | None:
        self.calls.append(("create_failure", namespace, stateful_set))
        return self.create_failures.get(stateful_set)

    def kinds(self) -> list[str]:
        return [c[0] for c in self.calls]

    def written(self) -> dict[str, Any]:
        patches = [c for c in self.calls if c[0] == "patch_status"]
        assert patches, self.calls
        status: dict[str, Any] = json.loads(patches[-1][3])
        return status


def body_of(status: dict[str, Any] | None = None, **spec: Any) -> Obj:
    body = example(CPU)
    body["metadata"].update(namespace=NAMESPACE, uid=UID, generation=1, resourceVersion="1", creationTimestamp=iso(T0))
    body["spec"].update(spec)
    if status is not None:
        body["status"] = copy.deepcopy(status)
    return body


def reconcile(
    kube: FakeKube, tracked: TrackedJob, body: Obj, pods: list[Obj], seconds: float, sets: set[str] = SETS
) -> ReconcileResult:
    return Reconciler(kube).reconcile(tracked, body, pods, sets, now=at(seconds))


def test_a_new_job_applies_every_child_then_writes_its_status() -> None:
    kube, tracked = FakeKube(), TrackedJob(NAMESPACE, NAME)
    result = reconcile(kube, tracked, body_of(), [], 0, sets=set())
    applied = [c[1] for c in kube.calls if c[0] == "apply"]
    assert "ConfigMap/tiny-cpu-config" in applied
    assert {a for a in applied if a.startswith("StatefulSet/")} == {f"StatefulSet/{s}" for s in SETS}
    # A new job's Secret is created with a new token, never applied; the status goes last.
    assert ("create", "Secret/tiny-cpu-ray") in kube.calls
    assert ("apply", "Secret/tiny-cpu-ray") not in kube.calls
    assert kube.kinds()[-1] == "patch_status"
    assert kube.written()["state"] == State.CREATED
    assert result.state == State.CREATED
    assert result.written is not None
    assert [e.reason for e in result.events] == ["ChildrenCreated"]


def test_an_unchanged_pass_sends_nothing() -> None:
    kube, tracked = FakeKube(), TrackedJob(NAMESPACE, NAME)
    first = reconcile(kube, tracked, body_of(), [], 0)
    assert first.written is not None
    kube.calls.clear()
    second = reconcile(kube, tracked, first.written, [], 0.5)
    assert kube.calls == []
    assert second.written is None


def test_a_missing_reference_is_looked_up_before_any_pod_and_holds_the_pods_back() -> None:
    kube, tracked = FakeKube(missing={"ConfigMap/tiny-reward"}), TrackedJob(NAMESPACE, NAME)
    first = reconcile(kube, tracked, body_of(), [], 0, sets=set())
    # Looked up before anything is applied; the StatefulSets go in at zero replicas.
    assert kube.calls[0] == ("exists", NAMESPACE, "ConfigMap/tiny-reward")
    assert "exists" not in kube.kinds()[1:]
    assert {kube.manifests[f"StatefulSet/{s}"]["spec"]["replicas"] for s in SETS} == {0}
    assert first.state == State.PENDING and first.requeue_after == REFERENCE_RECHECK_SECONDS
    assert [(e.type, e.reason) for e in first.events] == [("Warning", "MissingReference")]
    assert "ConfigMap tiny-reward (volume reward) does not exist" in first.events[0].message
    assert first.written is not None

    # Still missing: looked up again, nothing else sent.
    kube.calls.clear()
    again = reconcile(kube, tracked, first.written, [], 5)
    assert kube.calls == [("exists", NAMESPACE, "ConfigMap/tiny-reward")]
    assert again.written is None and again.events == []

    # Created by the user: the StatefulSets get their replicas.
    kube.missing.clear()
    kube.calls.clear()
    found = reconcile(kube, tracked, first.written, [], 10)
    assert found.state == State.CREATED
    assert [e.reason for e in found.events] == ["ChildrenCreated"]
    assert {kube.manifests[f"StatefulSet/{s}"]["spec"]["replicas"] for s in SETS} == {1, 2}
    assert found.written is not None

    # Pods exist: nothing is looked up any more.
    kube.calls.clear()
    reconcile(kube, tracked, found.written, gang_pods(JOB), 20)
    assert "exists" not in kube.kinds()


def test_a_failed_pod_restarts_the_gang_new_templates_first() -> None:
    kube, tracked = FakeKube(), TrackedJob(NAMESPACE, NAME)
    first = reconcile(kube, tracked, body_of(), [], 0)
    assert first.written is not None
    up = reconcile(kube, tracked, first.written, gang_pods(JOB), 10)
    assert up.state == State.RUNNING and up.written is not None
    kube.calls.clear()
    failed = pod(NAME, "actor", 1, phase="Failed", ready=False, terminated=(137, "OOMKilled"))
    pods = replace_pod(gang_pods(JOB), failed)
    result = reconcile(kube, tracked, up.written, pods, 100)

    kinds = kube.kinds()
    # The StatefulSets get the new attempt, then the old gang goes (each pod by its UID: the
    # failed one at once, the running ones with the grace period to save), then the status.
    assert kinds == ["apply"] * kinds.count("apply") + ["delete_pods", "delete_pods", "patch_status"]
    assert {c[1] for c in kube.calls if c[0] == "apply"} >= {f"StatefulSet/{s}" for s in SETS}
    ended, running = (c for c in kube.calls if c[0] == "delete_pods")
    assert (ended[2], ended[3]) == (((failed["metadata"]["name"], failed["metadata"]["uid"]),), 0)
    assert running[3] == RunPolicy().termination_grace_period_seconds
    assert tuple(sorted(ended[2] + running[2])) == tuple(
        sorted((p["metadata"]["name"], p["metadata"]["uid"]) for p in pods)
    )
    assert kube.written()["restartCount"] == 1
    assert result.state == State.RESTARTING


def test_finishing_writes_the_end_then_deletes_the_pods_and_scales_to_zero_without_applying() -> None:
    kube, tracked = FakeKube(), TrackedJob(NAMESPACE, NAME)
    first = reconcile(kube, tracked, body_of(), [], 0)
    assert first.written is not None
    kube.calls.clear()
    pods = gang_pods(JOB)
    result = reconcile(kube, tracked, first.written, pods, 1800)  # activeDeadlineSeconds
    assert kube.kinds() == ["patch_status", "delete_pods", "scale_to_zero"]
    assert kube.calls[2] == ("scale_to_zero", NAMESPACE, tuple(sorted(SETS)))
    deleted = kube.calls[1]
    assert sorted(deleted[2]) == sorted((p["metadata"]["name"], p["metadata"]["uid"]) for p in pods)
    assert deleted[3] == FINISHED_GRACE_SECONDS
    assert result.state == State.FAILED
    # Finished: what was kept to apply children is dropped.
    assert tracked.child_keys == [] and tracked.applied == {}


def test_the_ttl_deletes_the_children_of_a_finished_job() -> None:
    status = {"state": "Succeeded", "completionTime": iso(T0), "restartCount": 0}
    kube, tracked = FakeKube(), TrackedJob(NAMESPACE, NAME)
    body = body_of(status, runPolicy={**example(CPU)["spec"]["runPolicy"], "ttlSecondsAfterFinished": 60})
    early = reconcile(kube, tracked, body, [], 30)
    assert "delete_children" not in kube.kinds()
    assert early.requeue_after == 30
    reconcile(kube, tracked, body, [], 61)
    assert ("delete_children", NAMESPACE, NAME) in kube.calls
    assert "apply" not in kube.kinds()


def test_a_refused_child_is_reported_by_the_next_pass_without_a_false_created() -> None:
    kube, tracked = FakeKube(refuse={"ConfigMap/tiny-cpu-config"}), TrackedJob(NAMESPACE, NAME)
    first = reconcile(kube, tracked, body_of(), [], 0)
    # The plan assumed everything would go in: it is not written, and the next pass comes at once.
    assert "patch_status" not in kube.kinds()
    assert (first.written, first.events, first.requeue_after, first.replan) == (None, [], 0.0, True)
    second = reconcile(kube, tracked, body_of(), [], 0.2)
    created = next(c for c in kube.written()["conditions"] if c["type"] == "Created")
    assert (created["status"], created["reason"]) == ("False", "CreateFailed")
    assert "ConfigMap/tiny-cpu-config" in created["message"]
    assert ("Warning", "CreateFailed") in [(e.type, e.reason) for e in second.events]


def test_a_secret_an_earlier_operator_made_keeps_its_token() -> None:
    """An operator that died in a job's first pass may have made the Secret, and pods that
    take the token from it: the Secret is only ever created, so the one there is left as it
    is, and nothing reads it back (the operator holds no Secret read)."""
    kube, tracked = FakeKube(secret_exists=True), TrackedJob(NAMESPACE, NAME)
    result = reconcile(kube, tracked, body_of(), [], 0)
    assert result.written is not None
    assert ("create", "Secret/tiny-cpu-ray") in kube.calls
    assert "Secret/tiny-cpu-ray" not in kube.manifests  # the earlier one stands
    assert not [c for c in kube.calls if c[0] in ("apply", "dry_run_apply") and c[1].startswith("Secret/")]
    # The pods take the token from the Secret by reference, never by value.
    assert tracked.ray_token is not None
    for key, manifest in kube.manifests.items():
        assert tracked.ray_token not in json.dumps(manifest), key


def test_a_known_job_after_an_operator_restart_leaves_its_secret_as_it_is() -> None:
    kube, tracked = FakeKube(secret_exists=True), TrackedJob(NAMESPACE, NAME)
    reconcile(kube, tracked, body_of({"state": "Running", "restartCount": 0}), [], 0)
    assert [c for c in kube.calls if c[1:] == ("Secret/tiny-cpu-ray",)] == [("create", "Secret/tiny-cpu-ray")]
    assert "Secret/tiny-cpu-ray" not in kube.manifests


def test_a_job_created_again_under_the_same_name_starts_afresh() -> None:
    kube, tracked = FakeKube(), TrackedJob(NAMESPACE, NAME)
    reconcile(kube, tracked, body_of(), [], 0)
    first_token = tracked.ray_token
    again = body_of()
    again["metadata"]["uid"] = "another-uid"
    kube.calls.clear()
    reconcile(kube, tracked, again, [], 5)
    assert ("create", "Secret/tiny-cpu-ray") in kube.calls  # its own Secret, its own token
    assert tracked.ray_token != first_token
    assert kube.kinds().count("apply") > 3  # every child applied again, owned by the new uid
    assert tracked.uid == "another-uid"


def test_time_flows_only_through_now() -> None:
    """Two reconcilers over the same inputs plan the same (no clock read inside the plan)."""
    outcomes = []
    for _ in range(2):
        kube, tracked = FakeKube(), TrackedJob(NAMESPACE, NAME)
        reconcile(kube, tracked, body_of(), [], 0)
        outcomes.append(kube.calls)
    assert outcomes[0] == outcomes[1]


def test_a_child_refused_as_invalid_starts_no_pod_and_fails_the_job_until_the_spec_changes() -> None:
    """All or nothing: the StatefulSets are tried as a dry run first; one refused means none is
    created, and the job fails naming the RLJob field. A new generation tries again."""
    kube, tracked = FakeKube(invalid={"StatefulSet/tiny-cpu-actor"}), TrackedJob(NAMESPACE, NAME)
    first = reconcile(kube, tracked, body_of(), [], 0, sets=set())
    assert first.replan
    assert not [c for c in kube.calls if c[0] == "apply" and c[1].startswith("StatefulSet/")]
    assert ("dry_run_apply", "StatefulSet/tiny-cpu-actor") in kube.calls
    second = reconcile(kube, tracked, body_of(), [], 0.2, sets=set())
    assert second.state == "Failed"
    failed = next(c for c in kube.written()["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "InvalidChild"
    assert "StatefulSet/tiny-cpu-actor (from RLJob field spec.volumes[0] (work))" in failed["message"]
    assert "sizeLimit" in failed["message"]
    assert ("Warning", "InvalidChild") in [(e.type, e.reason) for e in second.events]
    assert not [c for c in kube.calls if c[0] == "apply" and c[1].startswith("StatefulSet/")]
    # The same spec again: nothing is applied, the job stays Failed.
    failed_status = kube.written()
    failed_body = body_of(status=failed_status)
    kube.calls.clear()
    reconcile(kube, tracked, failed_body, [], 10, sets=set())
    assert "apply" not in kube.kinds() and "dry_run_apply" not in kube.kinds()
    # A new generation (the spec fixed) is applied: the StatefulSets go in, the job starts again.
    kube.invalid.clear()
    fixed = body_of(status=failed_status)
    fixed["metadata"]["generation"] = 2
    result = reconcile(kube, tracked, fixed, [], 20, sets=set())
    result = reconcile(kube, tracked, fixed, [], 20.2, sets=set()) if result.replan else result
    assert {c[1] for c in kube.calls if c[0] == "apply" and c[1].startswith("StatefulSet/")} == {
        f"StatefulSet/{s}" for s in SETS
    }
    assert result.state == "Created"
    failed = next(c for c in kube.written()["conditions"] if c["type"] == "Failed")
    assert (failed["status"], failed["reason"]) == ("False", "SpecChanged")


MOUNT_FAILED = 'FailedMount: MountVolume.SetUp failed for volume "reward" : configmap "tiny-reward" not found'


def test_a_pod_whose_containers_never_start_fails_the_job_with_the_kubelets_event() -> None:
    """The kubelet says why only in a Warning Event; it is read once the timeout has passed."""
    kube, tracked = FakeKube(), TrackedJob(NAMESPACE, NAME)
    reconcile(kube, tracked, body_of(), [], 0)
    body = body_of(status=kube.written())
    stuck = pod("tiny-cpu", "actor", 1, phase="Pending", ready=False, waiting=("ContainerCreating", ""))
    stuck["status"]["conditions"][0]["lastTransitionTime"] = iso(T0)
    pods = replace_pod(gang_pods(load_job(CPU)), stuck)
    early = reconcile(kube, tracked, body, pods, 100)
    assert "pod_warning" not in kube.kinds()  # not before pendingTimeoutSeconds (300)
    assert early.state != "Failed"
    # Past the timeout with nothing reported: an image still pulling; looked at again later.
    kube.calls.clear()
    pulling = reconcile(kube, tracked, body, pods, 301)
    assert ("pod_warning", NAMESPACE, stuck["metadata"]["uid"]) in kube.calls
    assert pulling.state != "Failed" and pulling.requeue_after is not None and pulling.requeue_after <= 30
    kube.warnings[stuck["metadata"]["uid"]] = MOUNT_FAILED
    failed = reconcile(kube, tracked, body, pods, 331)
    assert failed.state == "Failed"
    condition = next(c for c in kube.written()["conditions"] if c["type"] == "Failed")
    assert condition["reason"] == "ContainersNotStarted"
    assert "pod tiny-cpu-actor-1 (role actor)" in condition["message"] and MOUNT_FAILED in condition["message"]


def test_a_mount_error_names_the_volumes_configmap() -> None:
    """A kubelet's FailedMount names the pod's volume and the missing key, not the ConfigMap
    the user wrote: the condition adds it."""
    job = load_job(CPU)
    kubelet = 'FailedMount: MountVolume.SetUp failed for volume "reward" : configmap references non-existent config key: reward.py'
    named = name_volume_source(job, kubelet)
    reward = job.spec.reward.function
    assert reward is not None and reward.config_map is not None
    assert named == f"{kubelet} (volume reward: ConfigMap {reward.config_map.name})"
    assert name_volume_source(job, "ErrImagePull: not found") == "ErrImagePull: not found"


NO_SERVICE_ACCOUNT = (
    'create Pod tiny-cpu-rollout-0 in StatefulSet tiny-cpu-rollout failed error: pods "tiny-cpu-rollout-0" is '
    'forbidden: error looking up service account demo/missing: serviceaccount "missing" not found'
)


def test_a_stateful_set_that_cannot_create_its_pods_says_so_then_fails_the_job_after_the_timeout() -> None:
    """The rollout's StatefulSet cannot create its pod (a missing ServiceAccount): the other
    roles' pods run meanwhile. Its FailedCreate Event, read once the StatefulSet is short of pods
    past a short grace, shows at once in the Running condition, and ends the job after
    pendingTimeoutSeconds."""
    kube, tracked = FakeKube(), TrackedJob(NAMESPACE, NAME)
    created = reconcile(kube, tracked, body_of(), [], 0)
    # The pass that creates the StatefulSets comes back after the grace: a StatefulSet that
    # cannot create pods may never change, so no watch event would bring it.
    assert created.requeue_after == CREATE_FAILURE_GRACE_SECONDS
    body = body_of(status=kube.written())
    pods = [p for p in gang_pods(load_job(CPU)) if "rollout" not in p["metadata"]["name"]]
    kube.calls.clear()
    everyone = reconcile(kube, tracked, body, gang_pods(load_job(CPU)), 10)
    assert "create_failure" not in kube.kinds()  # every pod there: nothing to ask
    assert everyone.state != "Failed"
    on_its_way = reconcile(kube, tracked, body, pods, 3)
    assert "create_failure" not in kube.kinds()  # within the grace, the pod is on its way
    assert on_its_way.requeue_after is not None and on_its_way.requeue_after <= 2
    unexplained = reconcile(kube, tracked, body, pods, 6)
    assert ("create_failure", NAMESPACE, "tiny-cpu-rollout") in kube.calls
    assert unexplained.state == "Created"  # its Event may still be on its way: ask again soon
    assert unexplained.requeue_after is not None and unexplained.requeue_after <= 5
    kube.calls.clear()
    kube.create_failures["tiny-cpu-rollout"] = (at(6), NO_SERVICE_ACCOUNT)
    woken = reconcile(kube, tracked, body, pods, 8)
    assert "create_failure" not in kube.kinds()  # read 2 s ago: however often pods wake the job
    assert woken.events == [] and woken.state == "Created"
    told = reconcile(kube, tracked, body, pods, 11)
    assert ("create_failure", NAMESPACE, "tiny-cpu-rollout") in kube.calls
    assert told.state == "Created"
    running = next(c for c in kube.written()["conditions"] if c["type"] == "Running")
    assert (running["status"], running["reason"]) == ("False", "PodsNotCreated")
    assert running["message"].startswith("StatefulSet tiny-cpu-rollout cannot create its pods: ")
    assert NO_SERVICE_ACCOUNT in running["message"]
    assert [(e.type, e.reason) for e in told.events] == [("Warning", "PodsNotCreated")]
    assert told.requeue_after == 300 - 11
    body = body_of(status=kube.written())
    failed = reconcile(kube, tracked, body, pods, 306)
    assert failed.state == "Failed"
    condition = next(c for c in kube.written()["conditions"] if c["type"] == "Failed")
    assert condition["reason"] == "PodsNotCreated"
    assert 'serviceaccount "missing" not found' in condition["message"]
    assert "StatefulSet tiny-cpu-rollout" in condition["message"]


def _merge(stored: Any, patch: Any) -> Any:
    """RFC 7386, as the API server applies a merge patch."""
    if not isinstance(patch, dict):
        return patch
    merged = dict(stored) if isinstance(stored, dict) else {}
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = _merge(merged.get(key), value)
    return merged


def test_the_status_patch_leaves_the_stored_status_equal_to_the_new_one() -> None:
    """Every field the new status leaves unset goes, nested ones too: an ended job's progress
    loses the driver's last time remaining (kubectl's ETA column empties)."""
    running = Condition(type="Running", status="True", reason="AllPodsReady", last_transition_time=iso(T0))
    stored = RLJobStatus(
        state=State.RUNNING,
        conditions=[running.model_copy(update={"observed_generation": 1})],
        roles={"actor": RoleStatus(replicas=2, active=2, ready=2)},
        progress=Progress(step=59, total_steps=60, time_remaining="5s", estimated_completion_time=iso(T0)),
        uncounted_restarts=1,
        start_time=iso(T0),
        gang_pod_uids=["a", "b"],
    ).to_wire()
    ended = RLJobStatus(
        state=State.SUCCEEDED,
        conditions=[running],
        roles={"actor": RoleStatus(replicas=2)},
        progress=Progress(step=60, total_steps=60),
        start_time=iso(T0),
        completion_time=iso(T0),
    )
    patch = status_patch(ended)
    assert _merge(stored, patch) == ended.to_wire()
    assert "timeRemaining" not in _merge(stored, patch)["progress"]
    assert "observedGeneration" not in patch["conditions"][0]  # a list's items hold no nulls
