"""Generates the RLJob field reference (spec and status) as Markdown from the
pydantic models, the same source the CRD is generated from.

`python -m rlkube_api.reference --write` writes `docs/rljob-reference.md` (every
field: type, default, required, constraints, description, and the CEL rules of
the object they are declared on) and the summary between the
`<!-- rljob-reference:begin -->` / `<!-- rljob-reference:end -->` markers in
README.md; `--check` exits non-zero when either is stale (tests run it too);
without an option the reference is printed. The rows come from the model walk in
reference_walk.py; this module renders and writes them.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from rlkube_api import exit_codes
from rlkube_api.base import ApiModel
from rlkube_api.config import TrainerConfig
from rlkube_api.reference_walk import MAP_KEY, Row, Rule, Section, constraints, field_paths, type_text, walk
from rlkube_api.rljob import API_VERSION, KIND, SHORT_NAMES, RLJob

# The walk's names are re-exported: the reference is one thing to its readers and tests.
__all__ = [
    "BEGIN",
    "COMMAND",
    "END",
    "EXIT_CODES_BEGIN",
    "EXIT_CODES_END",
    "MAP_KEY",
    "README_FILE",
    "REFERENCE_FILE",
    "RELIABILITY_FILE",
    "REPO",
    "RULES_TITLE",
    "MarkersMissing",
    "Row",
    "Rule",
    "Section",
    "anchor",
    "constraints",
    "expected_files",
    "field_paths",
    "main",
    "render_reference",
    "render_summary",
    "stale",
    "type_text",
    "walk",
    "with_summary",
    "write",
]

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


def _cell(text: str) -> str:
    """Text for a table cell: one line, pipes escaped, and '<' outside `code` too
    (Markdown would take '<role>' for an HTML tag and drop it)."""
    parts = " ".join(text.split()).replace("|", "\\|").split("`")
    for i in range(0, len(parts), 2):
        parts[i] = parts[i].replace("<", "&lt;")
    return "`".join(parts)


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
