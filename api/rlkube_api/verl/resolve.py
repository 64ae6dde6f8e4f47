"""Reading a verl config as Hydra saves it: its interpolations (`${a.b}`, `${.sibling}`,
`${oc.select:a.b,default}`) resolved by OmegaConf, the library verl and Hydra resolve them
with; and the error that names every key a config cannot be converted for."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue, OmegaConfBaseException

# OmegaConf's mandatory value (`???`): verl's yaml leaves a few for the user to fill in.
MISSING = "???"


class VerlConfigError(ValueError):
    """A verl config that cannot be converted; `errors` name each key."""

    def __init__(self, source: str, errors: list[str]) -> None:
        self.source = source
        self.errors = errors
        super().__init__(f"{source}: cannot convert:\n" + "\n".join(f"  {e}" for e in errors))


def _reason(error: OmegaConfBaseException) -> str:
    message = getattr(error, "msg", None) or str(error)
    return str(message).splitlines()[0]


class ComposedConfig:
    """A verl config as written (`written`), resolved (`resolved`), and with a value put in
    one key's place (`evaluate`): verl's default there is often an interpolation, whose value
    depends on the rest of the config."""

    def __init__(self, root: Mapping[str, Any]) -> None:
        errors = [
            f"{key}: ${{oc.env:...}} would read the environment of the machine that converts, "
            "not the job's: write the value"
            for key, value in _leaves(dict(root))
            if isinstance(value, str) and "${oc.env:" in value
        ]
        if errors:
            raise VerlConfigError("config", errors)
        try:
            self._config = OmegaConf.create(dict(root))
        except OmegaConfBaseException as error:
            raise VerlConfigError("config", [_reason(error)]) from None
        self.written = dict(root)
        self._probe: DictConfig | None = None

    def resolved(self) -> dict[str, Any]:
        """Every interpolation replaced by its value; an unset mandatory value stays `???`.
        Every key whose interpolation fails is named."""
        errors: list[str] = []
        out = _resolve(self._config, "", errors)
        if errors:
            raise VerlConfigError("config", errors)
        assert isinstance(out, dict)
        return out

    def evaluate(self, dotted: str, value: Any) -> Any:
        """What `value` (an interpolation, say) would resolve to if written at `dotted`, the rest
        of the config as it is."""
        if self._probe is None:
            self._probe = copy.deepcopy(self._config)
        try:
            OmegaConf.update(self._probe, dotted, value, merge=False, force_add=True)
            found = OmegaConf.select(self._probe, dotted, throw_on_missing=False)
            if isinstance(found, DictConfig | ListConfig):
                found = OmegaConf.to_container(found, resolve=True)
        except OmegaConfBaseException:
            found = None
        # One copy serves every evaluation: the key gets back what the config holds after each
        # (or, where that fails, the next evaluation starts from a fresh copy).
        if not _put_back(self._probe, dotted, self.written):
            self._probe = None
        return found


def _put_back(probe: DictConfig, dotted: str, written: Mapping[str, Any]) -> bool:
    """The written value at `dotted` again; False where it cannot be."""
    node: Any = written
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return False
        node = node[part]
    try:
        OmegaConf.update(probe, dotted, node, merge=False)
    except OmegaConfBaseException:
        return False
    return True


def _resolve(node: DictConfig | ListConfig, key: str, errors: list[str]) -> Any:
    if isinstance(node, DictConfig):
        return {k: _child(node, k, ".".join(filter(None, (key, str(k)))), errors) for k in node}
    return [_child(node, i, f"{key}[{i}]", errors) for i in range(len(node))]


def _child(node: DictConfig | ListConfig, index: Any, key: str, errors: list[str]) -> Any:
    try:
        value = node[index]
    except MissingMandatoryValue:
        return MISSING
    except OmegaConfBaseException as error:
        errors.append(f"{key}: {_reason(error)}")
        return None
    if isinstance(value, DictConfig | ListConfig):
        return _resolve(value, key, errors)
    return value


def _leaves(node: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for k, v in node.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        out += _leaves(v, key) if isinstance(v, Mapping) else [(key, v)]
    return out


def resolve(root: Mapping[str, Any]) -> dict[str, Any]:
    """`root` with its interpolations resolved (see ComposedConfig.resolved)."""
    return ComposedConfig(root).resolved()
