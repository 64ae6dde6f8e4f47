"""The images' cache keys: they change when an input of the image changes, and not otherwise."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from rlkube_e2e import images
from rlkube_e2e.images import context_files, copied_sources, image_key

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of what the image builds read: the Dockerfiles, .dockerignore and what they copy."""
    root = tmp_path_factory.mktemp("repo")
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("Dockerfile.operator", "Dockerfile.trainer", ".dockerignore", "pyproject.toml", "README.md"):
        shutil.copy(REPO / name, root / name)
    for name in ("api", "operator", "trainer", "e2e", "requirements", "tests/packaging"):
        shutil.copytree(REPO / name, root / name, ignore=ignore)
    return root


def keys(repo: Path) -> dict[str, str]:
    return {name: image_key(name, repo) for name in images.NAMES}


def test_the_keys_are_stable(repo: Path) -> None:
    assert keys(repo) == keys(repo)
    # Where the checkout is makes no difference: paths go in relative to it.
    assert keys(repo) == keys(REPO)


@pytest.mark.parametrize(
    ("path", "changed"),
    [
        ("operator/rlkube_operator/reconcile.py", {"operator", "trainer-cpu"}),
        ("trainer/rlkube_trainer/pod/cli.py", {"operator", "trainer-cpu"}),
        ("requirements/pip.lock", {"operator", "trainer-cpu"}),
        ("requirements/operator.lock", {"operator"}),
        ("requirements/trainer-cpu.lock", {"trainer-cpu"}),
        ("requirements/trainer-gpu.lock", {"trainer-cpu"}),  # the shared stage copies it
        ("Dockerfile.trainer", {"trainer-cpu"}),
        ("Dockerfile.operator", {"operator"}),
        # Not copied into any image: the test harness is no part of a user's image.
        ("e2e/rlkube_e2e/cluster.py", set()),
        ("README.md", set()),
        ("tests/packaging/test_images.py", set()),
        ("requirements/gpu-pair.in", set()),
    ],
)
def test_a_key_changes_exactly_when_an_input_of_its_image_does(repo: Path, path: str, changed: set[str]) -> None:
    before = keys(repo)
    file = repo / path
    original = file.read_bytes()
    try:
        file.write_bytes(original + b"\n# changed\n")
        after = keys(repo)
    finally:
        file.write_bytes(original)
    assert {name for name in images.NAMES if before[name] != after[name]} == changed
    assert keys(repo) == before


def test_a_new_source_file_changes_the_keys_and_bytecode_does_not(repo: Path) -> None:
    before = keys(repo)
    cache = repo / "trainer" / "rlkube_trainer" / "__pycache__"
    cache.mkdir(exist_ok=True)
    (cache / "cli.cpython-311.pyc").write_bytes(b"bytecode")
    assert keys(repo) == before
    new = repo / "api" / "rlkube_api" / "new_module.py"
    new.write_text("X = 1\n")
    try:
        assert keys(repo)["operator"] != before["operator"]
    finally:
        new.unlink()
        shutil.rmtree(cache)


def test_the_base_key_follows_what_the_base_is_made_of(monkeypatch: pytest.MonkeyPatch, repo: Path) -> None:
    before = keys(repo)
    monkeypatch.setattr(images, "BASE_PACKAGES", (*images.BASE_PACKAGES, "libnuma1"))
    after = keys(repo)
    # Every image is rebuilt on a new base.
    assert all(before[name] != after[name] for name in images.NAMES)


def test_the_key_covers_every_copied_file() -> None:
    files = {p.relative_to(REPO).as_posix() for p in context_files(REPO / "Dockerfile.operator")}
    assert {"pyproject.toml", "requirements/operator.lock", "api/rlkube_api/__init__.py"} <= files
    assert not any("__pycache__" in f for f in files)
    assert copied_sources(REPO / "Dockerfile.operator")[:2] == ["requirements/pip.lock", "requirements/operator.lock"]


def test_a_copy_continued_over_several_lines_is_read_whole(tmp_path: Path) -> None:
    (tmp_path / "Dockerfile").write_text("FROM scratch\nCOPY a \\\n    b \\\n    /x/\nRUN true\n")
    assert copied_sources(tmp_path / "Dockerfile") == ["a", "b"]


def test_a_copy_of_a_missing_path_is_an_error_naming_it(tmp_path: Path) -> None:
    (tmp_path / ".dockerignore").write_text("")
    (tmp_path / "Dockerfile").write_text("FROM scratch\nCOPY nowhere /x\n")
    with pytest.raises(images.ImageError, match="COPY nowhere"):
        context_files(tmp_path / "Dockerfile", tmp_path)


def test_an_unknown_image_name_is_refused() -> None:
    with pytest.raises(images.ImageError, match=r"unknown image 'trainer-gpu'.*base, operator, trainer-cpu"):
        images.ensure_image("trainer-gpu")
