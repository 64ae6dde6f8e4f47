"""The generated RLJob field reference: committed copies up to date, every field of
the CRD documented, aliases, defaults and CEL messages rendered where they belong."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import Field

from rlkube_api import crd, exit_codes, reference
from rlkube_api.base import ApiModel
from rlkube_api.crd import _models
from rlkube_api.rljob import RLJob


def test_committed_reference_matches_the_models(capsys: pytest.CaptureFixture[str]) -> None:
    code = reference.main(["--check"])
    assert code == 0, capsys.readouterr().err


def _schema_paths(node: dict[str, Any], path: str = "") -> Iterator[tuple[str, bool]]:
    """(path, is_leaf) for every node of a structural schema, spelled as the reference
    spells it: `[]` for list items, `.<name>` for map values."""
    if "properties" in node:
        if path:
            yield path, False
        for key, child in node["properties"].items():
            yield from _schema_paths(child, f"{path}.{key}" if path else key)
    elif "properties" in node.get("items", {}):
        yield path, False
        yield from _schema_paths(node["items"], path + "[]")
    elif isinstance(node.get("additionalProperties"), dict) and "properties" in node["additionalProperties"]:
        yield path, False
        yield from _schema_paths(node["additionalProperties"], f"{path}.{reference.MAP_KEY}")
    else:
        yield path, True


def _crd_paths() -> tuple[set[str], set[str]]:
    # The CRD as `make crd` generates it (test_crd.py holds the committed copy to that),
    # so a model change that is not yet in crds/rljob.yaml fails only one test.
    schema = yaml.safe_load(crd.render())["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    paths = list(_schema_paths(schema))
    return {p for p, leaf in paths if leaf}, {p for p, _ in paths}


def test_every_field_of_the_crd_has_a_row_and_nothing_else_does() -> None:
    leaves, nodes = _crd_paths()
    rows = reference.field_paths()
    assert len(rows) == len(set(rows)), "a field path appears twice"
    assert leaves - set(rows) == set(), "fields of the CRD missing from the reference"
    assert set(rows) - nodes == set(), "reference rows that are not fields of the CRD"


def _rows() -> dict[str, reference.Row]:
    return {row.path: row for section in reference.walk() for row in section.rows}


def test_paths_use_wire_names() -> None:
    rows = _rows()
    samples = rows["spec.rollout.samplesPerPrompt"]
    assert "spec.rollout.n" not in rows
    assert (samples.type, samples.default, samples.required) == ("integer", "`1`", False)
    assert samples.constraints == ["min 1", "max 1024"]
    assert "Trainer YAML: `rollout.n`" in samples.description
    assert "status.progress.tokensPerSecondPerGPU" in rows
    assert "spec.actor.ppoMiniBatchSize" in rows
    assert rows["spec.actor.optim.lr"].default == "`1e-06`"
    assert rows["spec.roles.actor.pool.tolerations[].key"].type == "string"
    assert rows["status.roles.<name>.ready"].type == "integer"
    snake = [p for p in rows if "_" in p]
    assert snake == [], f"snake_case paths: {snake}"


def test_constraints_enums_and_requiredness() -> None:
    rows = _rows()
    estimator = rows["spec.algorithm.advEstimator"]
    assert estimator.constraints[0] == (
        "one of `gae`, `grpo`, `rloo`, `reinforce_plus_plus`, `reinforce_plus_plus_baseline`, `remax`, `opo`, "
        "`grpo_passk`, `gpg`, `gdpo`, `optimal_token_baseline`, `tir_optimal_token_baseline`, `grpo_vectorized`, "
        "`rloo_vectorized`"
    )
    assert estimator.default == "`grpo`"
    assert rows["spec.data.trainFiles"].required
    assert rows["spec.data.trainFiles"].constraints == ["1–256 items"]
    assert rows["spec.actor.optim.betas"].constraints == ["exactly 2 items"]
    assert rows["spec.image"].constraints == [
        "must be an image reference: [registry[:port]/]repository[:tag][@digest], the repository in lower case",
        "1–1024 characters",
    ]
    assert rows["spec.serviceAccountName"].constraints[0].startswith("format `k8s-long-name`: a DNS-1123 subdomain")
    assert rows["spec.rollout.topP"].constraints == ["> 0", "max 1"]
    assert rows["spec.trainer.logger"].constraints == [
        "each one of `console`, `tensorboard`, `mlflow`, `wandb`",
        "at most 4 items",
    ]
    assert rows["spec.roles.actor"].required and not rows["spec.roles.critic"].required


class _Inner(ApiModel):
    """An object with a default of its own."""

    size: int = Field(1, description="Its own default is 1.")


class _Outer(ApiModel):
    """An object whose default for the inner one sets another value."""

    inner: _Inner = Field(default_factory=lambda: _Inner(size=2), description="Defaults to size 2.")


def test_a_default_set_by_the_enclosing_object_is_shown() -> None:
    rows = {row.path: row for section in reference.walk(_Outer) for row in section.rows}
    assert rows["inner.size"].default == "`1` (`2` when `inner` is omitted)"


def test_the_critics_learning_rate_default_is_its_own() -> None:
    # The critic's optimizer declares verl's critic rate on its lr field, not on the enclosing default.
    assert _rows()["spec.critic.optim.lr"].default == "`1e-05`"
    assert _rows()["spec.actor.optim.lr"].default == "`1e-06`"


def test_cel_rules_are_listed_on_the_object_that_declares_them() -> None:
    sections = {s.path: s for s in reference.walk()}
    roles = sections["spec.roles"]
    assert (
        reference.Rule(
            on="spec.roles.rollout",
            at="spec.roles.rollout.tensorParallelSize",
            message="tensorParallelSize must divide gpusPerReplica (without GPUs: replicas, one process per pod)",
            transition=False,
            immutable=False,
        )
        in roles.rules
    )
    assert reference.Rule("spec.model", "spec.model", "model is immutable", True, True) in sections["spec.model"].rules
    # Rollout replicas change in place with one-process engines: a rule on update, not immutability.
    replicas = [r for r in roles.rules if r.at == "spec.roles.rollout.replicas" and r.transition]
    assert replicas and not any(r.immutable for r in replicas)
    assert any(r.on == "RLJob" and "metadata.name" in r.message for r in sections[""].rules)
    text = reference.render_reference()
    assert (
        "| `spec.roles.rollout` | `spec.roles.rollout.placement` | placement is immutable "
        "| on update (**immutable**) |" in text
    )


def test_every_cel_message_appears() -> None:
    text = reference.render_reference()
    models: list[type[ApiModel]] = list(_models(RLJob))
    messages = {rule.message for model in models for rule in model.cel_rules}
    missing = [m for m in messages if reference._cell(m) not in text]
    assert missing == []


def test_immutable_fields_are_called_out() -> None:
    rows = _rows()
    for path in ("spec.model", "spec.roles.actor.gpusPerReplica", "spec.roles.rollout.placement"):
        assert "**immutable**" in rows[path].constraints, path
    assert "**immutable**" in rows["spec.roles.rollout.tensorParallelSize"].constraints
    assert "**immutable**" not in rows["spec.roles.rollout.replicas"].constraints  # elastic rollout
    summary = reference.render_summary()
    assert "Immutable once the job exists: `spec.model`;" in summary
    assert "`gpusPerReplica`, `placement`, `tensorParallelSize` of `spec.roles.rollout`" in summary


def test_output_is_deterministic() -> None:
    assert reference.render_reference() == reference.render_reference()
    assert reference.render_summary() == reference.render_summary()


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of the generated files, up to date."""
    for rel in (reference.README_FILE, reference.REFERENCE_FILE, reference.RELIABILITY_FILE):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(reference.REPO / rel, tmp_path / rel)
    assert reference.stale(tmp_path) == []
    return tmp_path


def test_check_names_the_stale_file_and_the_command(tree: Path) -> None:
    doc = tree / reference.REFERENCE_FILE
    doc.write_text(doc.read_text().replace("Peak learning rate.", "Learning rate."))
    assert reference.stale(tree) == [f"docs/rljob-reference.md is stale: run `{reference.COMMAND}`"]
    reference.write(tree)
    assert reference.stale(tree) == []


def test_readme_summary_is_checked_and_text_around_it_kept(tree: Path) -> None:
    readme = tree / reference.README_FILE
    original = readme.read_text()
    head, rest = original.split(reference.BEGIN)
    _, tail = rest.split(reference.END)
    readme.write_text(f"{head}{reference.BEGIN}\nold table\n{reference.END}{tail}")
    assert reference.stale(tree) == [f"README.md is stale: run `{reference.COMMAND}`"]
    assert reference.write(tree) == [reference.README_FILE]
    assert readme.read_text() == original


def test_missing_markers_are_reported(tree: Path) -> None:
    (tree / reference.README_FILE).write_text("# rlkube\n")
    [message] = reference.stale(tree)
    assert "README.md has no `<!-- rljob-reference:begin -->`" in message
    with pytest.raises(reference.MarkersMissing):
        reference.write(tree)


def test_the_exit_code_table_is_generated_from_exit_classes(tree: Path) -> None:
    doc = tree / reference.RELIABILITY_FILE
    assert exit_codes.render_table() in doc.read_text()
    doc.write_text(doc.read_text().replace("| 81 |", "| 82 |"))
    assert reference.stale(tree) == [f"docs/reliability.md is stale: run `{reference.COMMAND}`"]
