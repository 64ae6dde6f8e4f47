"""Classes named in verl's tool and interaction configs (`class_name: module.Class`)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


def import_class(class_name: str, beside: Path, base: type[T], where: str) -> type[T]:
    """`module.Class`, a subclass of `base`. The config's own folder is searched first, so a module
    shipped beside it (a ConfigMap key such as my_tools.py) imports as `my_tools`."""
    module_name, _, attr = class_name.rpartition(".")
    if not module_name:
        raise ValueError(f"{where}: class_name {class_name!r} must be module.Class")
    folder = str(beside.resolve())
    if folder not in sys.path:
        sys.path.insert(0, folder)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"{where}: class_name {class_name!r}: cannot import {module_name}: {exc}") from None
    cls = getattr(module, attr, None)
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise ValueError(f"{where}: class_name {class_name!r} is not a {base.__name__} subclass")
    return cls
