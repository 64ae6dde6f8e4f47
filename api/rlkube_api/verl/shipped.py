"""verl's shipped configs as the converter's table of defaults: every leaf of the composed
configs verl's wheel ships (`verl/trainer/config/_generated_*.yaml`, which Hydra composes from
the same defaults every verl run starts from), as written, interpolations included.

`python -m rlkube_api.verl.shipped verl-X-py3-none-any.whl > api/rlkube_api/verl/verl-defaults.json`
writes the table (read by rlkube_api.verl.defaults) for another verl release."""

from __future__ import annotations

import email.parser
import json
import sys
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

# The composed configs read, one per training engine: FSDP (verl's default), Megatron,
# TorchTitan, VeOmni.
SHIPPED_CONFIGS = (
    "verl/trainer/config/_generated_ppo_trainer.yaml",
    "verl/trainer/config/_generated_ppo_megatron_trainer.yaml",
    "verl/trainer/config/_generated_ppo_torchtitan_trainer.yaml",
    "verl/trainer/config/_generated_ppo_veomni_trainer.yaml",
)


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """(dotted key: value) of every leaf: a value that is not a mapping, or an empty mapping."""
    out: dict[str, Any] = {}
    for k, v in tree.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, Mapping) and v:
            out |= flatten(v, key)
        else:
            out[key] = v
    return out


def read_wheel(wheel: Path) -> tuple[str, dict[str, dict[str, Any]]]:
    """verl's version and its shipped configs (by path in the wheel), as YAML trees."""
    with zipfile.ZipFile(wheel) as archive:
        metadata = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        version = email.parser.Parser().parsestr(archive.read(metadata).decode())["Version"]
        configs = {name: yaml.safe_load(archive.read(name)) for name in SHIPPED_CONFIGS}
    return version, configs


def defaults_of(configs: Mapping[str, Mapping[str, Any]]) -> dict[str, tuple[Any, ...]]:
    """Each key's values across the shipped configs (one, or one per engine where they differ)."""
    out: dict[str, tuple[Any, ...]] = {}
    for tree in configs.values():
        for key, value in flatten(tree).items():
            known = out.setdefault(key, ())
            if value not in known:
                out[key] = (*known, value)
    return dict(sorted(out.items()))


def render(version: str, defaults: Mapping[str, tuple[Any, ...]]) -> str:
    """The table as rlkube_api.verl.defaults reads it (one key a line)."""
    rows = [f"  {json.dumps(key)}: {json.dumps(list(values))}" for key, values in defaults.items()]
    return "{\n" + f' "version": {json.dumps(version)},\n "defaults": {{\n' + ",\n".join(rows) + "\n }\n}\n"


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m rlkube_api.verl.shipped verl-X-py3-none-any.whl", file=sys.stderr)
        return 2
    version, configs = read_wheel(Path(argv[0]))
    sys.stdout.write(render(version, defaults_of(configs)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
