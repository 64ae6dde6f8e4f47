"""verl's defaults: each key of the configs verl's wheel ships (`shipped.SHIPPED_CONFIGS`), with
its value as written, one per engine where the engines' configs differ. The table,
verl-defaults.json beside this module, is generated from the wheel by `python -m
rlkube_api.verl.shipped`; do not edit it.

A key rlkube has no rule for is ignored where its value is one of these (or resolves to what
one of these resolves to in the same config), and refused otherwise (conversion.convert)."""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

_TABLE = json.loads(resources.files(__package__).joinpath("verl-defaults.json").read_text())

VERL_VERSION: str = _TABLE["version"]
DEFAULTS: dict[str, tuple[Any, ...]] = {key: tuple(values) for key, values in _TABLE["defaults"].items()}
