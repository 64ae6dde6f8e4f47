"""docs/first-real-run.md, run as written against the package's real-node cluster.

The commands are read from the guide's ```sh blocks and run in order with bash; its ```yaml
blocks (`# file: NAME` on the first line) are the files those commands use. A tiny random
Qwen2 model and a few GSM8K-shaped rows stand in for Qwen2.5-7B-Instruct and GSM8K. What the
test changes, and why, is named here and nowhere else:

- the block the guide marks `not run by the test` (downloads) is replaced by writing the same
  folders;
- the images are the ones built here (no registry): the loader's busybox is the base image,
  which has tar and sleep, and job.yaml's trainer image is the trainer image, never pulled;
- the claims bind to hostPath PersistentVolumes this test creates (the local cluster has no
  storage provisioner);
- job.yaml's sizes shrink to a CPU run (SHRINK); every field it changes must already be in
  the guide's job.yaml, so a guide edit that drops one fails here.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from rlkube_e2e import tinyjob
from rlkube_e2e.pools import POOL_LABEL
from rlkube_e2e.testing import Kubectl, wait_established

if TYPE_CHECKING:
    from tests.e2e.real_node_kit import RealCluster

pytestmark = [pytest.mark.cluster, pytest.mark.e2e, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "first-real-run.md"
NAMESPACE = "rl-first-run"
MODEL = "Qwen2.5-7B-Instruct"
BLOCK_TIMEOUT = 1200.0
SKIP = re.compile(r"<!-- not run by the test: (?P<why>[^>]*?) -->\s*$")
# The guide's loader image; no registry here, so the base image built here stands in.
LOADER_IMAGE = "busybox:1.37"
FENCE = re.compile(r"^```(?P<lang>\w+)\n(?P<body>.*?)^```$", re.M | re.S)


@dataclass
class Block:
    lang: str
    body: str
    skipped: str | None  # why the test does this block's work itself


def guide_blocks(text: str) -> list[Block]:
    blocks = []
    for match in FENCE.finditer(text):
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        skip = SKIP.match(before)
        blocks.append(Block(match["lang"], match["body"], skip["why"] if skip else None))
    return blocks


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(job: dict[str, Any]) -> None:
        *parents, key = path.split(".")
        node = job
        for part in parents:
            node = node[part]
        assert key in node, f"job.yaml has no {path}: the guide changed, update SHRINK"
        node[key] = value

    return change


def _drop(path: str) -> Callable[[dict[str, Any]], None]:
    def change(job: dict[str, Any]) -> None:
        *parents, key = path.split(".")
        node = job
        for part in parents:
            node = node[part]
        del node[key]  # KeyError: the guide changed

    return change


ON_THE_REAL_NODES = {"nodeSelector": {POOL_LABEL: "real"}}
# A 7B GPU job shrunk to a tiny CPU one: every field named exists in the guide's job.yaml.
SHRINK = [
    _set("spec.roles.actor.gpusPerReplica", 0),
    _drop("spec.roles.actor.resources"),  # a real node here has this machine's 2 CPUs
    _set("spec.roles.actor.pool", ON_THE_REAL_NODES),
    _set("spec.data.maxPromptLength", 256),
    _set("spec.data.maxResponseLength", 8),
    _set("spec.data.trainBatchSize", 8),
    _set("spec.actor.ppoMiniBatchSize", 4),
    _set("spec.actor.ppoMicroBatchSizePerGpu", 16),
    _set("spec.actor.optim", {"lr": 0.003}),
    _set("spec.actor.fsdpConfig", {"modelDtype": "fp32"}),  # gloo on CPU
    _set("spec.rollout.samplesPerPrompt", 4),
    _set("spec.rollout.gpuMemoryUtilization", 0.02),  # vLLM's CPU build: KV cache in host memory
    _set("spec.trainer.totalTrainingSteps", 6),
    _set("spec.trainer.saveFreq", 3),
    _set("spec.trainer.testFreq", 3),
]


def shrink(text: str, trainer_image: str) -> str:
    job = yaml.safe_load(text)
    for change in SHRINK:
        change(job)
    _set("spec.image", trainer_image)(job)
    job["spec"]["imagePullPolicy"] = "Never"
    job["spec"]["controller"] = {"pool": ON_THE_REAL_NODES}
    job["spec"]["rollout"]["enforceEager"] = True  # as examples/tiny-cpu.yaml on CPU
    return yaml.safe_dump(job, sort_keys=False)


QUESTIONS = [
    ("Tom has 3 apples and buys 4. How many?", "3 + 4 = 7\n#### 7"),
    ("What is 2 times 6?", "2 * 6 = 12\n#### 12"),
    ("Ann had 10 pens and gave away 3. How many are left?", "10 - 3 = 7\n#### 7"),
    ("What is 5 plus 5?", "#### 10"),
]


def write_downloads(workdir: Path) -> None:
    """What `hf download` would leave: a model snapshot and GSM8K's parquet files."""
    sys.path.insert(0, str(ROOT / "tests" / "trainer"))
    from tiny_model import build_tiny_model  # noqa: PLC0415  (tests/trainer is not a package)

    build_tiny_model(workdir / MODEL)
    for split, count in (("train", 16), ("test", 4)):
        rows = [{"question": q, "answer": a} for q, a in (QUESTIONS * 4)[:count]]
        path = workdir / "gsm8k-raw" / "main" / f"{split}-00000-of-00001.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pylist(rows), path)


@dataclass
class Volumes:
    """hostPath PersistentVolumes standing in for the cluster's storage, by claim name."""

    paths: dict[str, Path]


@pytest.fixture
def volumes(real_kubectl: Kubectl, tmp_path: Path) -> Iterator[Volumes]:
    kubectl = real_kubectl
    paths = {claim: tmp_path / "pv" / claim for claim in ("models", "rl-ckpt")}
    names = []
    for claim, path in paths.items():
        path.mkdir(parents=True)
        path.chmod(0o777)
        name = f"first-run-{claim}-{os.getpid()}"
        names.append(name)
        pv = tinyjob.host_path_volume(name, path, NAMESPACE, claim, ("ReadWriteMany", "ReadOnlyMany"))
        kubectl("apply", "-f", "-", input=yaml.safe_dump(pv))
    try:
        yield Volumes(paths)
    finally:
        kubectl("delete", "namespace", NAMESPACE, "--wait=false", "--ignore-not-found", check=False)
        kubectl("delete", "pv", *names, "--wait=false", "--ignore-not-found", check=False)


@pytest.fixture
def operator_for_guide(real_cluster: RealCluster, real_kubectl: Kubectl, tmp_path: Path) -> Iterator[Path]:
    """The operator as a process watching the guide's namespace (as the chart would run it)."""
    real_kubectl("apply", "--server-side", "--force-conflicts", "-f", str(tinyjob.CRD))
    wait_established(real_kubectl, "rljobs.rlkube.dev")
    log = tmp_path / "operator.log"
    env = {**os.environ, "KUBECONFIG": str(real_cluster.cluster.kubeconfig)}
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        health = str(free.getsockname()[1])
    command = [sys.executable, "-m", "rlkube_operator", "-n", NAMESPACE, "--metrics-port", "0", "--health-port", health]
    with log.open("wb") as out:
        process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        yield log
    finally:
        process.terminate()
        process.wait(timeout=60)


def test_the_guide_parses_into_the_blocks_the_test_expects() -> None:
    blocks = guide_blocks(GUIDE.read_text())
    files = [b.body.split("\n", 1)[0] for b in blocks if b.lang == "yaml"]
    assert files == ["# file: volumes.yaml", "# file: loader.yaml", "# file: job.yaml"]
    assert [b.skipped.split(" ")[0] for b in blocks if b.skipped] == ["downloads"]
    assert all(b.lang in ("sh", "yaml") for b in blocks)
    job = yaml.safe_load(next(b.body for b in blocks if b.body.startswith("# file: job.yaml")))
    assert job["spec"]["model"]["path"] == f"/models/{MODEL}"
    yaml.safe_load(shrink(yaml.safe_dump(job), "trainer:tag"))  # every field SHRINK names is in the guide
    loader = next(b.body for b in blocks if b.body.startswith("# file: loader.yaml"))
    assert LOADER_IMAGE in loader


def test_first_real_run_as_the_guide_says(
    real_cluster: RealCluster,
    volumes: Volumes,
    operator_for_guide: Path,
    tmp_path: Path,
) -> None:
    workdir = tmp_path / "work"
    workdir.mkdir()
    (workdir / "examples").symlink_to(ROOT / "examples")  # the guide runs from a checkout's root
    env = {
        **os.environ,
        "KUBECONFIG": str(real_cluster.cluster.kubeconfig),
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        "NS": NAMESPACE,
    }
    standins = {"downloads": lambda: write_downloads(workdir)}
    files = {
        "job.yaml": lambda body: shrink(body, real_cluster.images["trainer-cpu"].ref),
        "loader.yaml": lambda body: body.replace(LOADER_IMAGE, real_cluster.images["base"].ref),
    }
    transcript = []
    for block in guide_blocks(GUIDE.read_text()):
        if block.lang == "yaml":
            name = block.body.split("\n", 1)[0].removeprefix("# file: ").strip()
            (workdir / name).write_text(files.get(name, str)(block.body))
            continue
        if block.skipped is not None:
            standins[block.skipped.split(" ")[0]]()
            continue
        run = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", block.body],
            cwd=workdir,
            env=env,
            capture_output=True,
            text=True,
            timeout=BLOCK_TIMEOUT,
            check=False,
        )
        transcript.append(f"$ {block.body}{run.stdout}{run.stderr}")
        context = "\n".join(transcript[-3:]) + "\n--- operator log (tail):\n" + operator_log_tail(operator_for_guide)
        assert run.returncode == 0, context
    # What the guide says the run leaves on the checkpoint volume.
    checkpoints = volumes.paths["rl-ckpt"] / "qwen-first-run"
    assert (checkpoints / "hf" / "config.json").exists()
    assert (checkpoints / "rljob.json").exists()
    rows = [json.loads(line) for line in (checkpoints / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [int(row["step"]) for row in rows]
    assert steps == sorted(set(steps)) and steps[-1] == 6, steps
    # The progress the guide prints once the job has Succeeded.
    finished = next(t for t in transcript if "=Succeeded" in t.split("\n", 1)[0] or "=Succeeded" in t[:300])
    assert '"step":6' in finished.replace(" ", ""), finished


def operator_log_tail(log: Path) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-30:]) if log.exists() else ""
