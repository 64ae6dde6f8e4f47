"""The generated CRD: committed copy up to date, and the real API server gives the
same verdict as the pydantic models on every example and every invalid case."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from rlkube_api import crd
from rlkube_api.validation import InvalidSpec, check_rljob_update, parse_rljob
from tests.api.cases import EXAMPLES, IMMUTABLE, INVALID, ROLLOUT_TRANSITIONS, VALID, Case, Transition, base_job

Kubectl = Callable[..., subprocess.CompletedProcess[str]]

# Spec fields whose default depends on the trainer mode (section, wire name).
MODE_DEFAULTS = (("rollout", "freeCacheEngine"),)
# Spec fields a runtime's template may provide: the models default them, the server does not
# (a default stored in every job would override the template's value).
RUNTIME_PROVIDED_DEFAULTS = ("runPolicy",)


def test_committed_crd_matches_the_models() -> None:
    assert crd.main(["--check"]) == 0, "crds/rljob.yaml is stale: run `make crd`"


def test_crd_has_the_names_users_type() -> None:
    spec = crd.crd()["spec"]
    assert spec["names"]["shortNames"] == ["rlj"]
    version = spec["versions"][0]
    assert version["subresources"] == {"status": {}}
    columns = {c["name"] for c in version["additionalPrinterColumns"]}
    assert {"State", "Step", "Reward", "Val", "Age"} <= columns


def _server_verdict(kubectl: Kubectl, namespace: str, job: dict[str, Any], verb: str = "create") -> str | None:
    """None when the API server accepts the object (dry run), else its error text."""
    # JSON, not YAML: the server's YAML 1.1 parser reads strings such as "1e2" as numbers.
    result = kubectl(verb, "--dry-run=server", "-n", namespace, "-f", "-", input=json.dumps(job), check=False)
    return None if result.returncode == 0 else result.stderr


@pytest.mark.cluster
@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_examples_pass_server_dry_run(kubectl: Kubectl, rljob_crd: None, namespace: str, path: Path) -> None:
    result = kubectl("apply", "--dry-run=server", "-n", namespace, "-f", str(path), check=False)
    assert result.returncode == 0, result.stderr
    assert "created (server dry run)" in result.stdout


@pytest.mark.cluster
@pytest.mark.parametrize("case", INVALID, ids=lambda c: c.id)
def test_server_refuses_what_the_models_refuse(kubectl: Kubectl, rljob_crd: None, namespace: str, case: Case) -> None:
    job = case.job()
    server = _server_verdict(kubectl, namespace, job)
    assert server is not None, f"{case.id}: the API server accepted an invalid RLJob"
    for field in case.fields:
        assert field in server, f"{case.id}: expected {field!r} in the server's message:\n{server}"
    with pytest.raises(InvalidSpec):
        parse_rljob(job)


@pytest.mark.cluster
@pytest.mark.parametrize("case", VALID, ids=lambda c: c.id)
def test_server_accepts_what_the_models_accept(kubectl: Kubectl, rljob_crd: None, namespace: str, case: Case) -> None:
    job = case.job()
    parse_rljob(job)
    server = _server_verdict(kubectl, namespace, job)
    assert server is None, f"{case.id}: the API server refused a valid RLJob:\n{server}"


@pytest.mark.cluster
def test_server_applies_schema_defaults(kubectl: Kubectl, rljob_crd: None, namespace: str) -> None:
    job = base_job()
    result = kubectl("create", "--dry-run=server", "-n", namespace, "-o", "json", "-f", "-", input=yaml.safe_dump(job))
    stored = json.loads(result.stdout)
    # The server's defaults equal the models' defaults, except those that depend on another
    # field (TrainerConfig._mode_defaults): no schema default can hold them, the models fill them
    # in when they read the stored RLJob.
    expected = parse_rljob(job).to_wire()["spec"]
    for section, field in MODE_DEFAULTS:
        assert field not in stored["spec"].get(section, {}), (section, field)
        del expected[section][field]
    assert stored["spec"] == expected
    for field in RUNTIME_PROVIDED_DEFAULTS:  # written, they are stored with their defaults (above)
        job["spec"].pop(field, None)
        bare = kubectl(
            "create", "--dry-run=server", "-n", namespace, "-o", "json", "-f", "-", input=yaml.safe_dump(job)
        )
        assert field not in json.loads(bare.stdout)["spec"], field


@pytest.mark.cluster
@pytest.mark.parametrize("case", IMMUTABLE, ids=lambda c: c.id)
def test_immutable_fields_are_refused_on_update(kubectl: Kubectl, rljob_crd: None, namespace: str, case: Case) -> None:
    kubectl("create", "-n", namespace, "-f", "-", input=yaml.safe_dump(base_job()))
    changed = case.job()
    server = _server_verdict(kubectl, namespace, changed, verb="apply")
    assert server is not None, f"{case.id}: the API server accepted a change to an immutable field"
    for field in case.fields:
        assert field in server, f"{case.id}: expected {field!r} in:\n{server}"
    old = parse_rljob(base_job())
    with pytest.raises(InvalidSpec):
        check_rljob_update(old, parse_rljob(changed)) if _valid(changed) else parse_rljob(changed)


@pytest.mark.cluster
@pytest.mark.parametrize("case", ROLLOUT_TRANSITIONS, ids=lambda c: c.id)
def test_server_gives_the_models_verdict_on_rollout_transitions(
    kubectl: Kubectl, rljob_crd: None, namespace: str, case: Transition
) -> None:
    old, new = case.jobs()
    kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(old))
    server = _server_verdict(kubectl, namespace, new, verb="apply")
    if not case.fields:
        assert server is None, f"{case.id}: the API server refused the update:\n{server}"
        return
    assert server is not None, f"{case.id}: the API server accepted the update"
    for field in case.fields:
        assert field in server, f"{case.id}: expected {field!r} in:\n{server}"


def _valid(job: dict[str, Any]) -> bool:
    try:
        parse_rljob(job)
    except InvalidSpec:
        return False
    return True
