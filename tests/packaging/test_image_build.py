"""The images built for real with buildah from the project's Dockerfiles, and run.

The archives are cached by their inputs' key in $RLKUBE_CACHE/images: the operator
image is rebuilt here when an input changed (about 30 s), the trainer image (about 9
minutes cold) only once per key, then reused by every later run.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tarfile
import time
from collections.abc import Iterator

import pytest

from rlkube_e2e import images
from rlkube_e2e.images import ImageArchive, ensure_image

pytestmark = pytest.mark.skipif(
    any(shutil.which(tool) is None for tool in images.TOOLS), reason="buildah/mmdebstrap missing: make images-sysdeps"
)


def run_in(archive: ImageArchive, script: str, timeout: float = 300) -> str:
    """Run a shell script in a container of the image (as the image's user) and return its output."""
    buildah = ["buildah", *images._storage_options()]
    container = subprocess.run([*buildah, "from", "--quiet", archive.ref], capture_output=True, text=True, check=True)
    name = container.stdout.strip()
    try:
        result = subprocess.run(
            [*buildah, "run", "--isolation", "chroot", name, "--", "sh", "-c", script],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    finally:
        subprocess.run([*buildah, "rm", name], capture_output=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def oci_ref_names(archive: ImageArchive) -> list[str]:
    with tarfile.open(archive.path) as tar:
        member = tar.extractfile("index.json")
        assert member is not None
        index = json.load(member)
    return [m.get("annotations", {}).get("org.opencontainers.image.ref.name", "") for m in index["manifests"]]


@pytest.fixture(scope="module")
def operator_image() -> Iterator[ImageArchive]:
    yield ensure_image("operator")


def test_the_operator_image_is_an_oci_archive_named_by_its_key(operator_image: ImageArchive) -> None:
    assert operator_image.path.is_file() and operator_image.path.parent == images.images_dir()
    assert operator_image.ref.endswith(f":{operator_image.key}")
    assert oci_ref_names(operator_image) == [operator_image.ref]
    started = time.monotonic()
    assert ensure_image("operator") == operator_image
    assert time.monotonic() - started < 2, "a cached image must not be rebuilt"


def test_the_operator_image_runs_the_operator_as_its_uid(operator_image: ImageArchive) -> None:
    output = run_in(operator_image, "id -u && rlkube-operator --help && pip check")
    uid, usage = output.split("\n", 1)
    assert uid == "65532"
    assert "--leader-elect" in usage


@pytest.mark.slow
def test_the_trainer_cpu_image_has_torch_vllm_and_the_trackers() -> None:
    trainer = ensure_image("trainer-cpu")
    assert oci_ref_names(trainer) == [trainer.ref]
    script = (
        'id -u && test -w "$HOME" && python -c \''
        "import torch, vllm, wandb, mlflow, rlkube_trainer.pod.cli; "
        "print(torch.__version__, vllm.__version__, (torch.ones(2, 2) @ torch.ones(2, 2)).sum().item())"
        "'"
    )
    uid, versions, _ = run_in(trainer, script).split("\n", 2)
    assert uid == "1000"
    torch_version, vllm_version, product = versions.split()
    assert (torch_version.split("+")[0], product) == ("2.13.0", "8.0")
    assert vllm_version.startswith("0.32.0")
