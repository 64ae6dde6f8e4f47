"""model.uri and data.uri in the operator, without a cluster: the controller pod's init
containers fetch (with the source's credentials, and no trainer container gets them), every role
pod's wait for that fetch; the Initialized condition follows the controller pod's fetch, and a
fetch that cannot succeed (a permanent exit class) fails the job naming the uri."""

from __future__ import annotations

from typing import Any

import pydantic
import pytest

from rlkube_api.exit_codes import ExitCode
from rlkube_api.validation import parse_rljob
from rlkube_operator.children.fetch import WAIT_SECONDS
from rlkube_operator.children.references import job_references
from rlkube_operator.initialization import FETCH_FAILED, FETCHED, FETCHING
from rlkube_operator.observed import view_pod
from rlkube_operator.status import Observed, compute_status
from tests.operator.helpers import CPU, Obj, at, children_of, example, gang_pods, load_job, set_path

MODEL_URI = "s3://models/qwen/tiny"
DATA_URI = "hf://org/tiny-rows@v1"
FETCHING_JOB = load_job(
    CPU,
    set_path("spec.model.uri", MODEL_URI),
    set_path("spec.model.endpointUrl", "http://object-store.storage:9000"),
    set_path("spec.model.credentialsSecret", "models-s3"),
    set_path("spec.data.uri", DATA_URI),
    set_path("spec.data.dir", "/rlkube/tiny/data"),
)


def pod_specs(job: Any) -> dict[str, Obj]:
    return {
        c["metadata"]["labels"]["rlkube.dev/role"]: c["spec"]["template"]["spec"]
        for c in children_of(job)
        if c["kind"] == "StatefulSet"
    }


def test_the_controller_fetches_and_every_role_pod_waits_for_it() -> None:
    specs = pod_specs(FETCHING_JOB)
    fetch_model, fetch_data = specs["controller"]["initContainers"]
    assert fetch_model["command"] == [
        "rlkube-trainer",
        "fetch",
        MODEL_URI,
        "/rlkube/tiny/model",
        "--endpoint-url",
        "http://object-store.storage:9000",
    ]
    assert fetch_model["envFrom"] == [{"secretRef": {"name": "models-s3"}}]
    assert fetch_data["command"] == ["rlkube-trainer", "fetch", DATA_URI, "/rlkube/tiny/data", "--dataset"]
    assert "envFrom" not in fetch_data
    trainer = specs["controller"]["containers"][0]
    assert fetch_model["image"] == trainer["image"] and fetch_model["volumeMounts"] == trainer["volumeMounts"]
    # The trainer's HF_HUB_OFFLINE stays out of the fetch; the credentials out of the trainer.
    assert "HF_HUB_OFFLINE" not in {e["name"] for e in fetch_model["env"]}
    assert "envFrom" not in trainer
    for role, spec in specs.items():
        if role == "controller":
            continue
        assert [c["command"] for c in spec["initContainers"]] == [
            ["rlkube-trainer", "fetch", MODEL_URI, "/rlkube/tiny/model", "--wait", str(WAIT_SECONDS)],
            ["rlkube-trainer", "fetch", DATA_URI, "/rlkube/tiny/data", "--wait", str(WAIT_SECONDS)],
        ], role
        assert all("envFrom" not in c and "resources" not in c for c in spec["initContainers"]), role
    assert all("initContainers" not in spec for spec in pod_specs(load_job(CPU)).values())
    # A missing credentials Secret holds the job before any pod, naming it (references.py).
    assert str(next(r for r in job_references(FETCHING_JOB) if r.name == "models-s3")) == (
        "Secret models-s3 (envFrom of container fetch-model)"
    )


def refused(*changes: tuple[str, Any]) -> str:
    obj = example(CPU)
    for path, value in changes:
        set_path(path, value)(obj)
    with pytest.raises((pydantic.ValidationError, ValueError)) as caught:
        parse_rljob(obj)
    return str(caught.value)


def test_a_uri_and_the_folder_it_fills_must_agree() -> None:
    assert "spec.model.uri" in refused(("spec.model.uri", "ftp://models/x"))
    assert "spec.model.uri" in refused(("spec.model.uri", "hf://no-org"))
    assert "endpointUrl needs uri" in refused(("spec.model.endpointUrl", "http://s3:9000"))
    assert "credentialsSecret needs uri" in refused(("spec.data.credentialsSecret", "hub"))
    assert "data.uri and data.dir go together" in refused(("spec.data.uri", DATA_URI))
    assert "files under data.dir" in refused(("spec.data.uri", DATA_URI), ("spec.data.dir", "/rlkube/other"))
    read_only = [{"name": "work", "mountPath": "/rlkube", "readOnly": True, "source": {"hostPath": {"path": "/x"}}}]
    said = refused(("spec.model.uri", MODEL_URI), ("spec.volumes", read_only))
    assert "model.path must lie under a writable mountPath" in said
    # The trainer's config holds the folders only.
    config = FETCHING_JOB.spec.trainer_config().to_config()
    assert "uri" not in config["model"] and "dir" not in config["data"] and "uri" not in config["data"]


def fetch_state(name: str, state: str, exit_code: int | None = None, message: str = "") -> Obj:
    ended = {"terminated": {"exitCode": exit_code, "message": message}} if exit_code is not None else {}
    return {
        "name": name,
        "state": ended if state == "terminated" else {state: {}},
        "lastState": ended if state != "terminated" else {},
    }


def status_with(controller_inits: list[Obj]) -> Any:
    pods = gang_pods(FETCHING_JOB, ready=False)
    for pod in pods:
        if pod["metadata"]["labels"]["rlkube.dev/role"] == "controller":
            pod["status"]["initContainerStatuses"] = controller_inits
            pod["status"]["containerStatuses"][0]["state"] = {"waiting": {"reason": "PodInitializing"}}
    return compute_status(FETCHING_JOB, Observed([view_pod(p) for p in pods], at(10)))


def condition(plan: Any, type_: str) -> Any:
    return next(c for c in plan.status.conditions if c.type == type_)


def test_the_initialized_condition_follows_the_controllers_fetch() -> None:
    fetching = status_with([fetch_state("fetch-model", "running"), fetch_state("fetch-data", "waiting")])
    found = condition(fetching, "Initialized")
    assert (found.status, found.reason) == ("False", FETCHING)
    assert found.message == f"fetching model.uri {MODEL_URI} into /rlkube/tiny/model"

    retrying = status_with([fetch_state("fetch-model", "running", int(ExitCode.UNEXPECTED), "connection reset")])
    assert "fetching again after model.uri" in condition(retrying, "Initialized").message
    assert retrying.status.state != "Failed"

    done = status_with([fetch_state("fetch-model", "terminated", 0), fetch_state("fetch-data", "terminated", 0)])
    found = condition(done, "Initialized")
    assert (found.status, found.reason) == ("True", FETCHED)
    assert DATA_URI in found.message


@pytest.mark.parametrize("code", [ExitCode.CONFIG, ExitCode.STORAGE_FULL])
def test_a_fetch_that_cannot_succeed_fails_the_job_naming_the_uri(code: ExitCode) -> None:
    said = f"exit code {int(code)} ({code.name}): {MODEL_URI}: no object under this prefix (NoSuchKey)"
    failed = status_with([fetch_state("fetch-model", "waiting", int(code), said)])
    assert failed.status.state == "Failed"
    found = condition(failed, "Failed")
    assert found.reason == FETCH_FAILED
    assert found.message.startswith(f"the fetch of model.uri {MODEL_URI}: exit code {int(code)}")
    assert said in found.message
