"""Generates the CustomResourceDefinitions from the pydantic models: the RLJob's, and the
runtimes' (RLJobRuntime, ClusterRLJobRuntime).

`python -m rlkube_api.crd --write` regenerates `crds/rljob.yaml`, `crds/rljobruntimes.yaml`
and the chart's copies; `--check` exits non-zero when a committed file differs (tests run it too).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from rlkube_api import runtime
from rlkube_api.base import ApiModel
from rlkube_api.rljob import GROUP, KIND, PLURAL, SHORT_NAMES, SINGULAR, VERSION, RLJob

REPO = Path(__file__).resolve().parents[2]
CRD_FILES = (REPO / "crds" / "rljob.yaml", REPO / "charts" / "rlkube" / "crds" / "rljob.yaml")
RUNTIME_CRD_FILES = (
    REPO / "crds" / "rljobruntimes.yaml",
    REPO / "charts" / "rlkube" / "crds" / "rljobruntimes.yaml",
)

PRINTER_COLUMNS = [
    {"name": "State", "type": "string", "jsonPath": ".status.state"},
    {"name": "Step", "type": "integer", "jsonPath": ".status.progress.step"},
    {"name": "Total", "type": "integer", "jsonPath": ".status.progress.totalSteps"},
    {"name": "%", "type": "number", "jsonPath": ".status.progress.percentDone"},
    {"name": "ETA", "type": "string", "jsonPath": ".status.progress.timeRemaining", "priority": 1},
    {"name": "Reward", "type": "number", "jsonPath": ".status.progress.rewardMean"},
    {"name": "Val", "type": "number", "jsonPath": ".status.progress.valScore"},
    {"name": "Restarts", "type": "integer", "jsonPath": ".status.restartCount"},
    {"name": "Tokens/s/GPU", "type": "number", "jsonPath": ".status.progress.tokensPerSecondPerGPU", "priority": 1},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]

# Lists whose items are keyed, so server-side apply merges them by key.
_LIST_MAP_KEYS = {
    ("RLJobStatus", "conditions"): "type",
    ("RLJobSpec", "env"): "name",
    ("RuntimeTemplate", "env"): "name",
}
# Defaults the models fill in but the API server must not: fields a runtime's template may
# provide (runtime.py). Stored in every job, a default would override the template's value.
_NO_SERVER_DEFAULT = {("RLJobSpec", "runPolicy")}


def _models(root: type[BaseModel]) -> Iterator[type[ApiModel]]:
    """Every ApiModel class reachable from root's fields."""
    seen: set[type[ApiModel]] = set()
    stack: list[Any] = [root]
    while stack:
        tp = stack.pop()
        if isinstance(tp, type) and issubclass(tp, ApiModel):
            if tp in seen:
                continue
            seen.add(tp)
            yield tp
            stack.extend(f.annotation for f in tp.model_fields.values())
        for arg in getattr(tp, "__args__", ()):
            stack.append(arg)


class _SchemaConverter:
    """Turns pydantic's JSON Schema into a Kubernetes structural schema:
    no $ref, no nullable unions, boolean exclusive bounds, defaults of nested
    objects spelled out, CEL rules attached."""

    def __init__(self, root: type[BaseModel]) -> None:
        raw = root.model_json_schema(by_alias=True, mode="validation")
        self.defs: dict[str, Any] = raw.pop("$defs", {})
        self.root = raw
        self.classes = {cls.__name__: cls for cls in _models(root)}

    def convert(self, node: dict[str, Any], owner: str | None = None) -> dict[str, Any]:
        node = dict(node)
        for key in ("title",):
            node.pop(key, None)
        if "$ref" in node:
            name = node.pop("$ref").rsplit("/", 1)[-1]
            target = self.convert_model(name)
            return {**target, **{k: v for k, v in node.items() if k in ("description", "default")}}
        if "allOf" in node and len(node["allOf"]) == 1:
            inner = node.pop("allOf")[0]
            return {**self.convert(inner), **self.convert(node)}
        if "anyOf" in node:
            options = [o for o in node.pop("anyOf") if o.get("type") != "null"]
            if len(options) != 1:
                raise ValueError(f"unsupported union in schema: {options}")
            node.pop("default", None)  # the None default of Optional fields
            return {**self.convert(options[0]), **self.convert(node)}
        if "const" in node:
            node["enum"] = [node.pop("const")]
            node.setdefault("type", "string")
        for bound, inclusive in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
            if bound in node and not isinstance(node[bound], bool):
                node[inclusive] = node[bound]
                node[bound] = True
        if node.get("type") == "array" and "items" in node:
            node["items"] = self.convert(node["items"])
        if node.get("type") == "object" and "additionalProperties" in node:
            extra = node["additionalProperties"]
            if extra is True or extra == {}:
                node.pop("additionalProperties")
                node["x-kubernetes-preserve-unknown-fields"] = True
            else:
                node["additionalProperties"] = self.convert(extra)
        return node

    def convert_model(self, name: str) -> dict[str, Any]:
        raw = self.defs.get(name, self.root)
        cls = self.classes[name]
        out: dict[str, Any] = {"type": "object"}
        if raw.get("description"):
            out["description"] = raw["description"]
        props: dict[str, Any] = {}
        for field_name, field in cls.model_fields.items():
            alias = field.alias or field_name
            prop = self.convert(raw["properties"][alias])
            if field.default_factory is not None and (name, alias) not in _NO_SERVER_DEFAULT:
                value = field.default_factory()  # type: ignore[call-arg]
                prop["default"] = value.to_wire() if isinstance(value, ApiModel) else value
            key = _LIST_MAP_KEYS.get((name, alias))
            if key:
                prop["x-kubernetes-list-type"] = "map"
                prop["x-kubernetes-list-map-keys"] = [key]
                prop["items"].setdefault("required", [])
                if key not in prop["items"]["required"]:
                    prop["items"]["required"].append(key)
            props[alias] = prop
        out["properties"] = props
        if raw.get("additionalProperties") is True:  # extra="allow": a Kubernetes object passed through
            out["x-kubernetes-preserve-unknown-fields"] = True
        if raw.get("required"):
            out["required"] = raw["required"]
        rules = [r.to_schema() for r in cls.cel_rules]
        if rules:
            out["x-kubernetes-validations"] = rules
        return out


def openapi_schema(root: type[ApiModel] = RLJob) -> dict[str, Any]:
    converter = _SchemaConverter(root)
    obj = converter.convert_model(root.__name__)
    props = obj["properties"]
    # metadata is validated by the API server itself; apiVersion/kind are plain strings there.
    props["apiVersion"] = {"type": "string", "description": props["apiVersion"]["description"]}
    props["kind"] = {"type": "string", "description": props["kind"]["description"]}
    props["metadata"] = {"type": "object"}
    obj["required"] = ["spec"]
    return obj


def _crd(
    root: type[ApiModel],
    names: dict[str, Any],
    scope: str,
    version: dict[str, Any],
) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{names['plural']}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "names": {**names, "listKind": f"{names['kind']}List", "categories": ["rlkube"]},
            "scope": scope,
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    **version,
                    "schema": {"openAPIV3Schema": openapi_schema(root)},
                }
            ],
        },
    }


def crd() -> dict[str, Any]:
    names = {"kind": KIND, "plural": PLURAL, "singular": SINGULAR, "shortNames": list(SHORT_NAMES)}
    out = _crd(
        RLJob, names, "Namespaced", {"subresources": {"status": {}}, "additionalPrinterColumns": PRINTER_COLUMNS}
    )
    out["spec"]["names"]["categories"] = ["all", "rlkube"]
    return out


_RUNTIME_COLUMNS = [
    {"name": "Image", "type": "string", "jsonPath": ".spec.template.image"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def runtime_crds() -> list[dict[str, Any]]:
    """The runtimes' CRDs: no status (nothing observes a runtime), printer columns for the image."""
    columns = {"additionalPrinterColumns": _RUNTIME_COLUMNS}
    return [
        _crd(
            runtime.RLJobRuntime,
            {"kind": runtime.KIND, "plural": runtime.PLURAL, "singular": runtime.KIND.lower(), "shortNames": ["rljr"]},
            "Namespaced",
            columns,
        ),
        _crd(
            runtime.ClusterRLJobRuntime,
            {
                "kind": runtime.CLUSTER_KIND,
                "plural": runtime.CLUSTER_PLURAL,
                "singular": runtime.CLUSTER_KIND.lower(),
                "shortNames": ["crljr"],
            },
            "Cluster",
            columns,
        ),
    ]


class _Dumper(yaml.SafeDumper):
    """Quotes strings that YAML 1.1 parsers (Kubernetes' among them) read as booleans."""


_YAML11_BOOLS = frozenset(
    ["y", "Y", "yes", "Yes", "YES", "n", "N", "no", "No", "NO", "on", "On", "ON", "off", "Off", "OFF"]
)


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "'" if value in _YAML11_BOOLS else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


_HEADER = "# Generated from the pydantic models in api/rlkube_api by `make crd`. Do not edit.\n"


def render() -> str:
    return _HEADER + yaml.dump(crd(), Dumper=_Dumper, sort_keys=False, width=120)


def render_runtimes() -> str:
    return _HEADER + yaml.dump_all(runtime_crds(), Dumper=_Dumper, sort_keys=False, width=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--write", action="store_true", help="write the CRD files")
    parser.add_argument("--check", action="store_true", help="fail when a committed CRD file is stale")
    args = parser.parse_args(argv)
    files = [(path, render()) for path in CRD_FILES] + [(path, render_runtimes()) for path in RUNTIME_CRD_FILES]
    if args.write:
        for path, text in files:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(f"wrote {path.relative_to(REPO)}")
        return 0
    if args.check:
        stale = [p for p, text in files if not p.exists() or p.read_text() != text]
        for path in stale:
            print(f"{path.relative_to(REPO)} is stale: run `make crd`", file=sys.stderr)
        return 1 if stale else 0
    sys.stdout.write(render() + "---\n" + render_runtimes())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
