"""Reading a verl config: Hydra's `${a.b}` interpolations resolved against the same file, and
the error that names every key a config cannot be converted for."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any


class VerlConfigError(ValueError):
    """A verl config that cannot be converted; `errors` name each key."""

    def __init__(self, source: str, errors: list[str]) -> None:
        self.source = source
        self.errors = errors
        super().__init__(f"{source}: cannot convert:\n" + "\n".join(f"  {e}" for e in errors))


_REF_PATTERN = re.compile(r"\$\{([^}]*)\}")


def _lookup(root: Mapping[str, Any], dotted: str) -> Any:
    node: Any = root
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            raise KeyError(dotted)
        node = node[part]
    return node


def resolve(root: Mapping[str, Any]) -> dict[str, Any]:
    """`${a.b}` references replaced by their values (a whole-value reference keeps its
    type); resolvers such as `${oc.env:X}` are refused by name."""
    errors: list[str] = []

    def value(node: Any, key: str, depth: int = 0) -> Any:
        if isinstance(node, Mapping):
            return {k: value(v, f"{key}.{k}" if key else str(k), depth) for k, v in node.items()}
        if isinstance(node, list):
            return [value(v, f"{key}[{i}]", depth) for i, v in enumerate(node)]
        if not isinstance(node, str) or "${" not in node:
            return node
        if depth > 10:
            errors.append(f"{key}: interpolation loops")
            return None
        refs = _REF_PATTERN.findall(node)
        for ref in refs:
            if ":" in ref:
                errors.append(f"{key}: Hydra resolver ${{{ref}}} is not supported; write the value")
                return None
        try:
            whole = _REF_PATTERN.fullmatch(node)
            if whole:
                return value(_lookup(root, whole.group(1)), key, depth + 1)
            return _REF_PATTERN.sub(lambda m: str(value(_lookup(root, m.group(1)), key, depth + 1)), node)
        except KeyError as missing:
            errors.append(f"{key}: ${{{missing.args[0]}}} names no key of this config")
            return None

    out = value(root, "")
    if errors:
        raise VerlConfigError("config", errors)
    assert isinstance(out, dict)
    return out
