"""The base of every API model: camelCase on the wire, snake_case in Python and in
the trainer's YAML, unknown keys refused, and CEL rules that both the API server
(through the generated CRD) and pydantic evaluate, so both give the same verdict.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Any, ClassVar, Self

import celpy
from celpy.adapter import json_to_cel
from pydantic import BaseModel, ConfigDict, ValidationInfo, model_validator
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError

from rlkube_api.kube_syntax import CEL_FUNCTIONS


@dataclass(frozen=True)
class CelRule:
    """A CEL rule placed on a model's schema as `x-kubernetes-validations`.

    `field_path` (relative, e.g. ".tensorParallelSize") makes the API server report
    the error at that field; `transition` rules compare with `oldSelf` and only run
    on updates.
    """

    rule: str
    message: str
    field_path: str | None = None
    reason: str | None = None
    transition: bool = False

    def to_schema(self) -> dict[str, str]:
        out = {"rule": self.rule, "message": self.message}
        if self.field_path:
            out["fieldPath"] = self.field_path
        if self.reason:
            out["reason"] = self.reason
        return out


@functools.cache
def _program(rule: str) -> Any:
    env = celpy.Environment()
    return env.program(env.compile(rule), functions=CEL_FUNCTIONS)


def evaluate_rule(rule: CelRule, self_value: Any, old_value: Any = None) -> bool:
    """Evaluates one rule on JSON-like data, as the API server would."""
    activation = {"self": json_to_cel(self_value)}
    if rule.transition:
        activation["oldSelf"] = json_to_cel(old_value)
    result = _program(rule.rule).evaluate(activation)
    if isinstance(result, Exception):  # celpy returns evaluation errors as values
        raise result
    return bool(result)


def first_failing_rule(rules: list[CelRule], self_value: Any) -> CelRule | None:
    """The first of `rules` (none a transition rule) that `self_value` fails; the value is
    converted to CEL once for all of them (the conversion costs more than most rules)."""
    activation = {"self": json_to_cel(self_value)}
    for rule in rules:
        result = _program(rule.rule).evaluate(activation)
        if isinstance(result, Exception):
            raise result
        if not result:
            return rule
    return None


def remembered_failing_rule(rules: tuple[CelRule, ...], self_value: Any) -> CelRule | None:
    """`first_failing_rule`, remembered per distinct value. Validating a job evaluates every
    nested model's rules, and celpy walking the rule trees is most of a validation's time; the
    operator, `kubectl rlkube` and the API's own checks validate the same sub-objects again and
    again (a pool, a role's layout, an unchanged section of a changed job), and a rule's verdict
    depends on the value alone. Bounded, as the operator runs for weeks."""
    return _remembered(rules, json.dumps(self_value, sort_keys=True, separators=(",", ":")))


@functools.lru_cache(maxsize=4096)
def _remembered(rules: tuple[CelRule, ...], wire: str) -> CelRule | None:
    return first_failing_rule(list(rules), json.loads(wire))


# Validation context key: the object was read back from the API server, which enforced the
# CRD's CEL rules when it was written; evaluating them again in Python is skipped (it was
# most of the operator's CPU time per reconcile pass). Types and bounds are still checked.
ADMITTED = "admitted"


class ApiModel(BaseModel):
    """Base for all RLJob / trainer-config models."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        validate_default=True,
    )

    # Rules on this model's own object; see CelRule.
    cel_rules: ClassVar[tuple[CelRule, ...]] = ()

    @model_validator(mode="after")
    def _check_cel_rules(self, info: ValidationInfo) -> Self:
        if info.context and info.context.get(ADMITTED):
            return self
        rules = tuple(r for r in type(self).cel_rules if not r.transition)
        if not rules:
            return self
        failed = remembered_failing_rule(rules, self.to_wire())
        if failed is not None:
            raise PydanticCustomError("cel", "{field}: {message}", _cel_context(failed))
        return self

    def to_wire(self) -> dict[str, Any]:
        """The object as the API server stores it (camelCase, unset optionals absent)."""
        return self.model_dump(by_alias=True, mode="json", exclude_none=True)

    def to_config(self) -> dict[str, Any]:
        """The object as the trainer's YAML writes it (verl-style snake_case keys)."""
        return self.model_dump(by_alias=False, mode="json", exclude_none=True)


def _cel_context(rule: CelRule) -> dict[str, str]:
    field = rule.field_path.lstrip(".") if rule.field_path else "(object)"
    return {"field": field, "message": rule.message}


def check_transition(old: ApiModel, new: ApiModel) -> list[str]:
    """Evaluates the transition (update-time) rules of `new` against `old`, walking
    nested models present in both, as the API server does for `oldSelf` rules.
    Returns the messages of the rules that fail, with their paths."""
    return _check_transition(old, new, "")


def _check_transition(old: ApiModel, new: ApiModel, path: str) -> list[str]:
    failures = []
    for rule in type(new).cel_rules:
        if rule.transition and not evaluate_rule(rule, new.to_wire(), old.to_wire()):
            where = path + (rule.field_path or "")
            failures.append(f"{where.lstrip('.')}: {rule.message}")
    for name, field in type(new).model_fields.items():
        old_child, new_child = getattr(old, name), getattr(new, name)
        if isinstance(old_child, ApiModel) and isinstance(new_child, ApiModel):
            alias = field.alias or name
            failures += _check_transition(old_child, new_child, f"{path}.{alias}")
    return failures
