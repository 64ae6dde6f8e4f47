"""Turning user input into models, with errors that name the file and the field.

An RLJob is written in camelCase (`spec.roles.actor.replicas`), the trainer's
YAML in verl's snake_case (`actor.ppo_mini_batch_size`); errors use the
spelling of the input they came from.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import ValidationError
from pydantic.alias_generators import to_snake

from rlkube_api.base import ADMITTED, check_transition
from rlkube_api.config import TrainerConfig
from rlkube_api.rljob import RLJob

Style = Literal["wire", "config"]


class InvalidSpec(ValueError):
    """A spec or config the models refuse; `errors` are 'field.path: message' lines."""

    def __init__(self, source: str, errors: list[str]) -> None:
        self.source = source
        self.errors = errors
        super().__init__(f"{source} is invalid:\n" + "\n".join(f"  {e}" for e in errors))


def describe(exc: ValidationError, style: Style = "wire") -> list[str]:
    """One 'path: message' line per error, the path spelled as the input spells it."""
    lines = []
    for err in exc.errors(include_url=False):
        parts = [str(p) for p in err["loc"]]
        ctx = err.get("ctx") or {}
        if err["type"] == "cel":
            if ctx.get("field") and ctx["field"] != "(object)":
                parts += ctx["field"].split(".")
            message = str(ctx.get("message", err["msg"]))
        else:
            message = err["msg"]
        if style == "config":
            parts = [to_snake(p) for p in parts]
        lines.append(f"{'.'.join(parts) or '(root)'}: {message}")
    return lines


def parse_rljob(obj: dict[str, Any], source: str = "RLJob", admitted: bool = False) -> RLJob:
    """`admitted`: obj comes from the API server, whose CEL rules it already passed.

    Strict, as the API server's schema is: "5" is no integer and "true" no boolean there. (The
    trainer's YAML stays lax: PyYAML reads `lr: 1e-6` as a string.)"""
    try:
        return RLJob.model_validate(obj, strict=True, context={ADMITTED: True} if admitted else None)
    except ValidationError as exc:
        raise InvalidSpec(source, describe(exc, "wire")) from None


def check_rljob_update(old: RLJob, new: RLJob) -> None:
    """Refuses changes to immutable fields, as the CRD's transition rules do."""
    failures = check_transition(old.spec, new.spec)
    if failures:
        raise InvalidSpec(new.metadata.name or "RLJob", [f"spec.{f}" for f in failures])


def parse_trainer_config(obj: Any, source: str = "config") -> TrainerConfig:
    if not isinstance(obj, dict):
        raise InvalidSpec(source, [f"(root): expected a mapping of sections, got {type(obj).__name__}"])
    try:
        return TrainerConfig.model_validate(obj)
    except ValidationError as exc:
        raise InvalidSpec(source, describe(exc, "config")) from None


def load_trainer_config(path: Path) -> TrainerConfig:
    """Reads a trainer YAML; a missing file, bad YAML or a wrong key names the file."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise InvalidSpec(str(path), [f"cannot read: {exc.strerror}"]) from None
    try:
        obj = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise InvalidSpec(str(path), [f"not valid YAML: {exc}"]) from None
    return parse_trainer_config(obj, str(path))
