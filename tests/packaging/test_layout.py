"""The shape of the tree: the trainer's packages are floors by the process a line runs in, each
importing only from floors below it; no module does so much that it runs past 450 lines; and
the tree speaks of the software, not of the work periods that built it."""

from __future__ import annotations

import ast
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).parents[2]
TRAINER = ROOT / "trainer" / "rlkube_trainer"
MAX_LINES = 450

# The trainer's floors, top to bottom: a package imports only from a floor below its own (and
# from itself). The pod's entry starts the driver's loop, which steers rank groups, which host
# the rank-side workers; what both sides use lies below.
FLOORS = (
    ("pod",),
    ("loop",),
    ("cluster",),
    ("workers",),
    ("batch", "tools"),  # tools: the public face of the rollout's tool classes
    ("rollout", "reward", "fetch"),
    ("data", "model", "parallel", "checkpoint", "tiny"),
    ("algos", "scorers"),
)


def _modules(package: Path) -> Iterator[Path]:
    yield from sorted(p for p in package.rglob("*.py") if "__pycache__" not in p.parts)


def _wing(path: Path) -> str:
    """The top-level package (or module) of the trainer a file belongs to."""
    first = path.relative_to(TRAINER).parts[0]
    return first.removesuffix(".py")


def _imported_wings(path: Path) -> set[str]:
    """The trainer's top-level packages a module imports, inside functions too."""
    wings: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
        if isinstance(node, ast.ImportFrom) and node.module:
            names.append(node.module + "." + ".".join(a.name for a in node.names[:1]))
        for name in names:
            parts = name.split(".")
            if parts[0] == "rlkube_trainer" and len(parts) > 1:
                wings.add(parts[1])
    return wings


def test_every_package_of_the_trainer_has_a_floor() -> None:
    placed = {wing for floor in FLOORS for wing in floor}
    present = {_wing(p) for p in _modules(TRAINER)} - {"__init__"}
    assert present == placed


def test_the_trainers_packages_import_only_downwards() -> None:
    floor_of = {wing: index for index, floor in enumerate(FLOORS) for wing in floor}
    upward = []
    for path in _modules(TRAINER):
        if path.parent == TRAINER and path.name == "__init__.py":
            continue
        own = _wing(path)
        for wing in _imported_wings(path) - {own}:
            if floor_of[wing] <= floor_of[own]:
                upward.append(f"{path.relative_to(ROOT)} imports {wing} (floor {floor_of[wing]} of {floor_of[own]})")
    assert upward == []


def test_no_module_of_the_api_or_the_trainer_is_over_450_lines() -> None:
    long = [
        f"{path.relative_to(ROOT)}: {n}"
        for package in (TRAINER, ROOT / "api" / "rlkube_api")
        for path in _modules(package)
        if (n := len(path.read_text().splitlines())) > MAX_LINES
    ]
    assert long == []


def test_the_tree_names_no_issue_or_work_session() -> None:
    tracked = subprocess.run(
        ["git", "ls-files", "api", "operator", "trainer", "e2e", "docs", "README.md", "bench", "tests", "examples"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    pattern = re.compile(r"\b(issue|session) [0-9]+", re.IGNORECASE)
    found = [
        f"{name}:{number}"
        for name in tracked
        if (ROOT / name).is_file() and not (ROOT / name).is_symlink()
        for number, line in enumerate(_text(ROOT / name).splitlines(), 1)
        if pattern.search(line)
    ]
    assert found == []


def _text(path: Path) -> str:
    try:
        return path.read_text()
    except UnicodeDecodeError:
        return ""
