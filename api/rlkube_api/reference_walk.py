"""The walk behind the RLJob field reference: every field from RLJob down, in declaration
order, as a row (path, type, default, constraints, description), grouped in sections, with the
CEL rules of the objects they are declared on. reference.py renders it as Markdown."""

from __future__ import annotations

import inspect
import json
import types
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import annotated_types
from pydantic.alias_generators import to_camel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from rlkube_api.base import ApiModel, CelRule
from rlkube_api.kube_syntax import KubeString
from rlkube_api.rljob import KIND, RLJob

# Objects at most this deep (spec = 1, spec.model = 2) get a section of their own;
# deeper ones are listed inline in their section's table.
SECTION_DEPTH = 2
# Validated by the API server itself (as in the CRD): one row, no descent.
OPAQUE_FIELDS = frozenset({"metadata"})
# The placeholder for the keys of a map of objects, e.g. status.roles.<name>.ready.
MAP_KEY = "<name>"

_SCALARS: dict[Any, str] = {bool: "boolean", int: "integer", float: "number", str: "string", Any: "any"}


@dataclass(frozen=True)
class Rule:
    """A CEL rule as the reference shows it: declared on `on`, reported at `at`."""

    on: str
    at: str
    message: str
    transition: bool
    immutable: bool


@dataclass
class Row:
    """One field path, as users write it in YAML."""

    path: str
    type: str
    default: str
    required: bool
    constraints: list[str]
    description: str
    section: str | None = None  # the section that lists this object's fields


@dataclass
class Section:
    """An object with its rows (its fields and, inline, their descendants) and rules."""

    path: str
    title: str
    description: str
    rows: list[Row] = field(default_factory=list)
    rules: list[Rule] = field(default_factory=list)


def _strip_none(tp: Any) -> Any:
    """`X | None` -> X (optional fields are omitted, never null, on the wire); Annotated[X, ...] -> X."""
    if get_origin(tp) is Annotated:
        return _strip_none(get_args(tp)[0])
    if get_origin(tp) in (Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0]
        return Union[tuple(args)]  # noqa: UP007 (a runtime union of several types)
    return tp


def _is_model(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, ApiModel)


def type_text(tp: Any) -> str:
    """The JSON type a user writes: string, integer, list of object, map of string to string."""
    tp = _strip_none(tp)
    origin = get_origin(tp)
    if origin is Annotated:
        return type_text(get_args(tp)[0])
    if origin is Literal:
        kinds = sorted({type_text(type(v)) for v in get_args(tp)})
        return " or ".join(kinds)
    if origin in (Union, types.UnionType):
        return " or ".join(type_text(a) for a in get_args(tp))
    if origin is list:
        return f"list of {type_text(get_args(tp)[0])}"
    if origin is dict:
        value = get_args(tp)[1]
        return "object (free-form)" if value is Any else f"map of string to {type_text(value)}"
    if _is_model(tp):
        return "object"
    if tp in _SCALARS:
        return _SCALARS[tp]
    raise TypeError(f"the reference has no JSON type for {tp!r}; teach rlkube_api.reference_walk.type_text")


def _descent(tp: Any) -> tuple[str, type[ApiModel]] | None:
    """The path step from a field to the fields of the model it holds ('' for the model
    itself, '[]' for list items, '.<name>' for map values), or None for a leaf."""
    tp = _strip_none(tp)
    if _is_model(tp):
        return "", tp
    origin = get_origin(tp)
    if origin is list:
        inner = _descent(get_args(tp)[0])
        return None if inner is None else ("[]" + inner[0], inner[1])
    if origin is dict:
        inner = _descent(get_args(tp)[1])
        return None if inner is None else (f".{MAP_KEY}" + inner[0], inner[1])
    return None


def _enum(tp: Any) -> str | None:
    tp = _strip_none(tp)
    if get_origin(tp) is Literal:
        return "one of " + ", ".join(f"`{_value(v)}`" for v in get_args(tp))
    if get_origin(tp) is list:
        inner = _enum(get_args(tp)[0])
        return None if inner is None else f"each {inner}"
    return None


def _length(low: int | None, high: int | None, unit: str) -> str:
    plural = unit + ("" if unit.endswith("s") else "s")
    if low is not None and low == high:
        return f"exactly {low} {unit if low == 1 else plural}"
    if low is not None and high is not None:
        return f"{low}–{high} {plural}"
    if high is not None:
        return f"at most {high} {unit if high == 1 else plural}"
    if low == 1 and unit == "character":
        return "non-empty"
    return f"at least {low} {unit if low == 1 else plural}"


def _formats(tp: Any) -> list[KubeString]:
    """Formats of an optional field (`Annotated[str, FORMAT] | None`): pydantic keeps them in
    the annotation, not in the field's metadata."""
    if get_origin(tp) in (Union, types.UnionType):
        return [f for arg in get_args(tp) for f in _formats(arg)]
    if get_origin(tp) is Annotated:
        return [m for m in get_args(tp)[1:] if isinstance(m, KubeString)]
    return []


def constraints(info: FieldInfo) -> list[str]:
    """Bounds, lengths and enum values of a field, in words."""
    tp = _strip_none(info.annotation)
    out = []
    enum = _enum(tp)
    if enum:
        out.append(enum)
    for kube_format in _formats(info.annotation):
        out.append(kube_format.describe())
    unit = "item" if get_origin(tp) is list else "entry" if get_origin(tp) is dict else "character"
    low_len: int | None = None
    high_len: int | None = None
    for meta in info.metadata:
        if isinstance(meta, annotated_types.Ge):
            out.append(f"min {json.dumps(meta.ge)}")
        elif isinstance(meta, annotated_types.Gt):
            out.append(f"> {json.dumps(meta.gt)}")
        elif isinstance(meta, annotated_types.Le):
            out.append(f"max {json.dumps(meta.le)}")
        elif isinstance(meta, annotated_types.Lt):
            out.append(f"< {json.dumps(meta.lt)}")
        elif isinstance(meta, annotated_types.MultipleOf):
            out.append(f"multiple of {json.dumps(meta.multiple_of)}")
        elif isinstance(meta, annotated_types.MinLen):
            low_len = meta.min_length
        elif isinstance(meta, annotated_types.MaxLen):
            high_len = meta.max_length
        elif isinstance(meta, KubeString):
            out.append(meta.describe())
        elif getattr(meta, "pattern", None) is not None:
            out.append(f"matches `{meta.pattern}`")
        else:
            raise TypeError(
                f"the reference cannot describe the constraint {meta!r}; teach rlkube_api.reference_walk.constraints"
            )
    if low_len is not None or high_len is not None:
        out.append(_length(low_len, high_len, unit))
    return out


def _value(value: Any) -> str:
    """A value as it reads in YAML: strings bare (quoted when empty), the rest as JSON."""
    if isinstance(value, ApiModel):
        value = value.to_wire()
    if isinstance(value, str):
        return value if value else '""'
    return json.dumps(value, sort_keys=True)


def _default(info: FieldInfo) -> Any:
    if info.is_required():
        return PydanticUndefined
    return info.get_default(call_default_factory=True, validated_data={})


def _default_text(info: FieldInfo, effective: Any, parent: str) -> str:
    """The field's default and, where the enclosing object's own default sets another
    value, that one too: it is what a job gets that leaves the object out."""
    tp = _strip_none(info.annotation)
    own = _default(info)
    if own is PydanticUndefined or own is None or _is_model(tp):
        return ""
    text = f"`{_value(own)}`"
    if effective is not PydanticUndefined and _value(effective) != _value(own):
        text += f" (`{_value(effective)}` when `{parent}` is omitted)"
    return text


def _doc(cls: type[ApiModel]) -> str:
    doc = cls.__dict__.get("__doc__") or ""
    return " ".join(inspect.cleandoc(doc).split())


def _join(prefix: str, step: str) -> str:
    if not prefix:
        return step
    return prefix + step if step.startswith(("[", ".")) else f"{prefix}.{step}"


def _rules(cls: type[ApiModel], path: str) -> list[Rule]:
    return [_rule(r, path) for r in cls.cel_rules]


def _rule(rule: CelRule, path: str) -> Rule:
    at = _join(path, rule.field_path.lstrip(".")) if rule.field_path else path
    # A transition rule that allows some changes (rollout replicas) is a rule on update, not immutability.
    return Rule(
        path or KIND, at or KIND, rule.message, rule.transition, rule.transition and "immutable" in rule.message
    )


@dataclass(frozen=True)
class _Child:
    """The model whose fields follow a row: where they live and their defaults."""

    model: type[ApiModel]
    path: str
    defaults: ApiModel | None


class _Walker:
    """Walks the models from RLJob down, in field declaration order (deterministic)."""

    def __init__(self) -> None:
        self.sections: list[Section] = []

    def section(self, cls: type[ApiModel], path: str, description: str, defaults: ApiModel | None) -> None:
        section = Section(path, path or KIND, description)
        self.sections.append(section)
        section.rules += _rules(cls, path)
        later: list[tuple[Row, _Child]] = []
        for row, child in self.rows(cls, path, defaults, section):
            if child.path == row.path and child.path.count(".") < SECTION_DEPTH:
                row.section = child.path
                later.append((row, child))
            else:
                self.inline(child, section)
        for row, child in later:
            self.section(child.model, child.path, _doc(child.model) or row.description, child.defaults)

    def inline(self, child: _Child, section: Section) -> None:
        section.rules += _rules(child.model, child.path)
        for _row, grandchild in self.rows(child.model, child.path, child.defaults, section):
            self.inline(grandchild, section)

    def rows(
        self, cls: type[ApiModel], path: str, defaults: ApiModel | None, section: Section
    ) -> Iterator[tuple[Row, _Child]]:
        """Adds a row per field of cls to the section; yields those whose value holds a
        model (directly, as list items or as map values) with that model. Lazy on purpose:
        what the caller adds for a yielded row lands right after it."""
        for name, info in cls.model_fields.items():
            row_path = _join(path, info.alias or name)
            effective = getattr(defaults, name) if defaults is not None else PydanticUndefined
            description = info.description or ""
            if info.alias and info.alias != to_camel(name) and path.startswith("spec"):
                trainer_key = ".".join([*row_path.split(".")[1:-1], name])
                description += f" Trainer YAML: `{trainer_key}`."
            row = Row(
                path=row_path,
                type=type_text(info.annotation),
                default=_default_text(info, effective, path),
                required=info.is_required(),
                constraints=constraints(info),
                description=description,
            )
            section.rows.append(row)
            descent = None if not path and name in OPAQUE_FIELDS else _descent(info.annotation)
            if descent is None:
                continue
            step, model = descent
            child_defaults = None
            if not step:  # list items and map values have no defaults of their own
                value = effective if effective is not PydanticUndefined else _default(info)
                child_defaults = value if isinstance(value, ApiModel) else None
            yield row, _Child(model, row_path + step, child_defaults)


def walk(root: type[ApiModel] = RLJob) -> list[Section]:
    walker = _Walker()
    walker.section(root, "", _doc(root), None)
    _mark_immutable(walker.sections)
    return walker.sections


def _mark_immutable(sections: list[Section]) -> None:
    targets = {r.at for s in sections for r in s.rules if r.immutable}
    for section in sections:
        for row in section.rows:
            if row.path in targets:
                row.constraints.append("**immutable**")


def field_paths(root: type[ApiModel] = RLJob) -> list[str]:
    """Every row's path, in document order (the tests compare them with the CRD)."""
    return [row.path for s in walk(root) for row in s.rows]
