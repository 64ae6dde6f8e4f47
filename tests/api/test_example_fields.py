"""Every field an example RLJob sets takes effect: the trainer or the operator reads it, or the
operator hands it to the pods as written (Kubernetes fields of pools and pod templates). A field
the API accepts and nothing reads would make an example promise what does not happen.

"Reads it" is an attribute access `.<python_name>` in operator/ or trainer/ code (and
placement.py), taken from the syntax tree: stricter than the shared `unread-fields` tool, which
also counts a quoted name (vLLM's keyword `"tensor_parallel_size"` is not the RLJob field)."""

from __future__ import annotations

import ast
import json
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from rlkube_api.rljob import RLJobSpec
from rlkube_api.validation import parse_rljob
from rlkube_operator.desired import desired_children

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(p for p in (ROOT / "examples").glob("*.yaml") if yaml.safe_load(p.read_text()).get("kind") == "RLJob")
# placement.py decides which roles get pods: both the operator and the trainer call it.
SOURCES = [*(ROOT / "operator").rglob("*.py"), *(ROOT / "trainer").rglob("*.py"), ROOT / "api/rlkube_api/placement.py"]
# Attribute names the code reads (`x.fsdp_size`), from the syntax tree: a dotted path in a string
# (verl_config's "roles.rollout.tensor_parallel_size") or a keyword is not a read of the field.
READ = {
    node.attr for path in SOURCES for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.Attribute)
}


def _models(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation holds (X, X | None, list[X], dict[str, X])."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType, list, dict, typing.Annotated):
        return [m for arg in typing.get_args(annotation) for m in _models(arg)]
    return []


def _field_by_key(model: type[BaseModel], key: str) -> str | None:
    for name, info in model.model_fields.items():
        if key in (name, info.alias, info.serialization_alias):
            return name
    return None


def _leaves(model: type[BaseModel], value: Any, path: str) -> Iterator[tuple[str, type[BaseModel], str | None, Any]]:
    """(path, model, python field name, value) for each field set, down to values that are not
    models (a Kubernetes volume source: passed through whole). The name is None for a key of a
    Kubernetes object the model passes through as written (a sidecar's image)."""
    items = value if isinstance(value, list) else [value]
    for item in items:
        for key, child in item.items():
            name = _field_by_key(model, key)
            if name is None:
                assert model.model_config.get("extra") == "allow", f"{path}.{key}: not a field of {model.__name__}"
                yield f"{path}.{key}", model, None, child
                continue
            yield f"{path}.{key}", model, name, child
            inner = _models(model.model_fields[name].annotation)
            if inner and isinstance(child, dict | list) and all(isinstance(c, dict) for c in _as_list(child)):
                yield from _leaves(inner[0], child, f"{path}.{key}")


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _passed_to_pods(children: str, key: str, value: Any) -> bool:
    return f'"{key}": {json.dumps(value)}' in children


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_every_field_an_example_sets_is_read_or_passed_to_the_pods(example: Path) -> None:
    raw = yaml.safe_load(example.read_text())
    job = parse_rljob({**raw, "metadata": {**raw["metadata"], "namespace": "ml", "uid": "u"}})
    children = json.dumps(desired_children(job, "u", 0, True, "token"))
    unread = []
    for path, _model, name, value in _leaves(RLJobSpec, raw["spec"], "spec"):
        key = path.rsplit(".", 1)[1]
        if name is not None and name in READ:
            continue
        if not isinstance(value, dict | list) and _passed_to_pods(children, key, value):
            continue
        if isinstance(value, dict | list):
            continue  # a section: its own fields are checked one by one
        unread.append(path)
    assert not unread, f"{example.name} sets fields nothing reads: {unread}"


def test_the_walk_finds_the_fields_it_should() -> None:
    """The check above sees nested fields (a role's fsdpSize, a pool's toleration effect)."""
    raw = yaml.safe_load((ROOT / "examples" / "gpu-multipool.yaml").read_text())
    paths = {path for path, *_ in _leaves(RLJobSpec, raw["spec"], "spec")}
    assert {"spec.roles.actor.fsdpSize", "spec.roles.actor.pool.tolerations.effect", "spec.data.valFiles"} <= paths
