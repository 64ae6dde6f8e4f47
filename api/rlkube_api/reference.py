"""Generates the RLJob field reference (spec and status) as Markdown from the
pydantic models, the same source the CRD is generated from.

`python -m rlkube_api.reference --write` writes `docs/rljob-reference.md` (every
field: type, default, required, constraints, description, and the CEL rules of
the object they are declared on) and the summary between the
`<!-- rljob-reference:begin -->` / `<!-- rljob-reference:end -->` markers in
README.md; `--check` exits non-zero when either is stale (tests run it too);
without an option the reference is printed.
"""

from __future__ import annotations

import argparse
import inspect
import json
import re
import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import annotated_types
from pydantic.alias_generators import to_camel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from rlkube_api import exit_codes
from rlkube_api.base import ApiModel, CelRule
from rlkube_api.config import TrainerConfig
from rlkube_api.kube_syntax import KubeString
from rlkube_api.rljob import API_VERSION, KIND, SHORT_NAMES, RLJob

REPO = Path(__file__).resolve().parents[2]
REFERENCE_FILE = Path("docs") / "rljob-reference.md"
README_FILE = Path("README.md")
BEGIN = "<!-- rljob-reference:begin -->"
END = "<!-- rljob-reference:end -->"
COMMAND = "python -m rlkube_api.reference --write"
# The exit-code table (exit_codes.EXIT_CLASSES) goes between these in docs/reliability.md.
RELIABILITY_FILE = Path("docs") / "reliability.md"
EXIT_CODES_BEGIN = "<!-- exit-codes:begin -->"
EXIT_CODES_END = "<!-- exit-codes:end -->"

# Objects at most this deep (spec = 1, spec.model = 2) get a section of their own;
# deeper ones are listed inline in their section's table.
SECTION_DEPTH = 2
# Validated by the API server itself (as in the CRD): one row, no descent.
OPAQUE_FIELDS = frozenset({"metadata"})
# The placeholder for the keys of a map of objects, e.g. status.roles.<name>.ready.
MAP_KEY = "<name>"

_SCALARS: dict[Any, str] = {bool: "boolean", int: "integer", float: "number", str: "string", Any: "any"}


# --- the model walk -------------------------------------------------------------------------------


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
    raise TypeError(f"the reference has no JSON type for {tp!r}; teach rlkube_api.reference.type_text")


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
            raise TypeError(f"the reference cannot describe the constraint {meta!r}; teach rlkube_api.reference")
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
    value (critic.optim.lr), that one too: it is what a job gets that leaves the object out."""
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


def _cell(text: str) -> str:
    """Text for a table cell: one line, pipes escaped, and '<' outside `code` too
    (Markdown would take '<role>' for an HTML tag and drop it)."""
    parts = " ".join(text.split()).replace("|", "\\|").split("`")
    for i in range(0, len(parts), 2):
        parts[i] = parts[i].replace("<", "&lt;")
    return "`".join(parts)


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


# --- Markdown -------------------------------------------------------------------------------------


def anchor(title: str) -> str:
    """GitHub's heading anchor: lower case, punctuation dropped, spaces to dashes."""
    return re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")


def _code(text: str) -> str:
    return f"`{text}`"


def _immutable(sections: list[Section]) -> list[str]:
    """Immutable fields, objects with the same ones on one line, e.g.
    '`gpusPerReplica`, `replicas` of `spec.roles.actor`, `spec.roles.critic`'."""
    fields_of: dict[str, list[str]] = {}  # object -> its immutable fields ("" = the whole object)
    for rule in (r for s in sections for r in s.rules if r.immutable):
        fields_of.setdefault(rule.on, []).append("" if rule.at == rule.on else rule.at.removeprefix(rule.on + "."))
    objects_of: dict[tuple[str, ...], list[str]] = {}
    for obj, fields in fields_of.items():
        objects_of.setdefault(tuple(fields), []).append(obj)
    out = []
    for immutable, objects in objects_of.items():
        where = ", ".join(_code(o) for o in objects)
        named = [_code(f) for f in immutable if f]
        out.append(f"{', '.join(named)} of {where}" if named else where)
    return out


def _row_cells(row: Row) -> str:
    name = f"[{_code(row.path)}](#{anchor(row.section)})" if row.section else _code(row.path)
    cells = [
        name,
        row.type,
        row.default,
        "yes" if row.required else "",
        "; ".join(row.constraints),
        row.description,
    ]
    return "| " + " | ".join(_cell(c) for c in cells) + " |"


def _section_markdown(section: Section) -> list[str]:
    level = "#" * (2 + section.path.count("."))
    out = [f"{level} {_code(section.title)}", ""]
    if section.description:
        out += [_cell(section.description), ""]
    out += [
        "| Field | Type | Default | Required | Constraints | Description |",
        "|---|---|---|---|---|---|",
    ]
    out += [_row_cells(row) for row in section.rows]
    out.append("")
    if section.rules:
        out += [f"Rules on these fields: [{RULES_TITLE}](#{anchor(RULES_TITLE)}).", ""]
    return out


RULES_TITLE = "Rules checked at admission"


def _rules_markdown(sections: list[Section]) -> list[str]:
    """Every CEL rule in one table, in the order of the fields they are declared on."""
    out = [
        f"## {RULES_TITLE}",
        "",
        "The CEL rules of the CRD, in one table. The API server evaluates them on `kubectl apply` and "
        "reports a failure at the field named, with this message; the models evaluate the same rules "
        "(all but the update-time ones) in the operator and the trainer. Syntax checks on single fields "
        "(names, label values, image references, lengths, bounds) are in the Constraints column of each "
        "field instead.",
        "",
        "| Declared on | Reported at | Message | Checked |",
        "|---|---|---|---|",
    ]
    for rule in (r for s in sections for r in s.rules):
        when = (
            "on update (**immutable**)"
            if rule.immutable
            else "on update"
            if rule.transition
            else "on create and update"
        )
        out.append(f"| {_code(rule.on)} | {_code(rule.at)} | {_cell(rule.message)} | {when} |")
    out.append("")
    return out


def render_reference(root: type[ApiModel] = RLJob) -> str:
    sections = walk(root)
    trainer_sections = ", ".join(_code(f.alias or n) for n, f in TrainerConfig.model_fields.items())
    out = [
        f"<!-- Generated from the pydantic models in api/rlkube_api by `{COMMAND}`. Do not edit. -->",
        "",
        "# RLJob field reference",
        "",
        f"`apiVersion: {API_VERSION}`, `kind: {KIND}` (short name `{SHORT_NAMES[0]}`). Every field below comes "
        "from the pydantic models in `api/rlkube_api/`, the same models the CRD (`crds/rljob.yaml`) is "
        "generated from, so this page, the API server and the trainer agree.",
        "",
        "- Paths are spelled as in YAML (camelCase); `[]` marks the items of a list, "
        f"`{MAP_KEY}` the keys of a map. A required field is required whenever the object holding it is present.",
        "- Constraints and rules are checked by the API server on `kubectl apply` (OpenAPI schema and CEL), "
        "and all but the update-time rules again by the models in the operator and the trainer; an error "
        "names the field.",
        f"- The sections {trainer_sections} are also the trainer's own YAML (`rlkube-trainer run config.yaml`), "
        "with verl's snake_case keys: `spec.actor.ppoMiniBatchSize` there is `actor.ppo_mini_batch_size`.",
        "",
        "Sections: "
        + ", ".join(f"[{_code(s.title)}](#{anchor(s.title)})" for s in sections)
        + f"; all rules: [{RULES_TITLE}](#{anchor(RULES_TITLE)}).",
        "",
        "## Immutable fields",
        "",
        "Changing these on an existing RLJob is refused by the API server; delete and recreate the job instead.",
        "",
    ]
    out += [f"- {line}" for line in _immutable(sections)]
    out.append("")
    out += _rules_markdown(sections)
    for section in sections:
        out += _section_markdown(section)
    return "\n".join(out).rstrip("\n") + "\n"


def render_summary(root: type[ApiModel] = RLJob) -> str:
    """The README's part: the fields directly under spec, and status, each linking to
    its place in the reference."""
    sections = walk(root)
    link = REFERENCE_FILE.as_posix()
    described = {s.path: s.description for s in sections}
    top = [row for s in sections if s.path == "" for row in s.rows if row.path == "status"]
    spec = [row for s in sections if s.path == "spec" for row in s.rows if row.path.count(".") == 1]
    out = [
        f"<!-- Generated by `{COMMAND}` from the pydantic models. Do not edit. -->",
        "",
        "| Field | Type | Required | What it holds |",
        "|---|---|---|---|",
    ]
    for row in spec + top:
        name = f"[{_code(row.path)}]({link}#{anchor(row.section)})" if row.section else _code(row.path)
        description = described[row.section] if row.section else row.description
        cells = [name, row.type, "yes" if row.required else "", description]
        out.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    out += [
        "",
        "Immutable once the job exists: " + "; ".join(_immutable(sections)) + ".",
        "",
        f"Every field with its type, default, constraints and CEL rules: [{link}]({link}).",
    ]
    return "\n".join(out) + "\n"


# --- files ----------------------------------------------------------------------------------------


class MarkersMissing(ValueError):
    """README.md lacks the begin/end markers the summary goes between."""


def with_summary(readme: str, summary: str, begin: str = BEGIN, end_marker: str = END, file: Path = README_FILE) -> str:
    start, end = readme.find(begin), readme.find(end_marker)
    if start < 0 or end < start:
        raise MarkersMissing(f"{file} has no `{begin}` ... `{end_marker}` markers to put the generated text between")
    return readme[: start + len(begin)] + "\n" + summary + readme[end:]


def expected_files(root: Path) -> dict[Path, str]:
    """Each generated file (relative to root) with the text it must have."""
    readme = (root / README_FILE).read_text() if (root / README_FILE).exists() else ""
    reliability = (root / RELIABILITY_FILE).read_text() if (root / RELIABILITY_FILE).exists() else ""
    return {
        REFERENCE_FILE: render_reference(),
        README_FILE: with_summary(readme, render_summary()),
        RELIABILITY_FILE: with_summary(
            reliability, exit_codes.render_table(), EXIT_CODES_BEGIN, EXIT_CODES_END, RELIABILITY_FILE
        ),
    }


def write(root: Path = REPO) -> list[Path]:
    written = []
    for rel, text in expected_files(root).items():
        path = root / rel
        if not path.exists() or path.read_text() != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            written.append(rel)
    return written


def stale(root: Path = REPO) -> list[str]:
    """One message per stale file, naming it and the command that fixes it."""
    try:
        files = expected_files(root)
    except MarkersMissing as exc:
        return [f"{exc}: add them where the summary belongs, then run `{COMMAND}`"]
    return [
        f"{rel} is stale: run `{COMMAND}`"
        for rel, text in files.items()
        if not (root / rel).exists() or (root / rel).read_text() != text
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help=f"write {REFERENCE_FILE} and the summary in {README_FILE}")
    mode.add_argument("--check", action="store_true", help="fail when a generated file is stale")
    args = parser.parse_args(argv)
    if args.write:
        try:
            written = write()
        except MarkersMissing as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        for rel in written:
            print(f"wrote {rel}")
        return 0
    if args.check:
        problems = stale()
        for message in problems:
            print(message, file=sys.stderr)
        return 1 if problems else 0
    sys.stdout.write(render_reference())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
