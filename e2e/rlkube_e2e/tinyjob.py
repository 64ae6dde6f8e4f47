"""The tiny CPU RLJob (examples/tiny-cpu.yaml) made ready to run on the local cluster's real
nodes: the init step that writes its model and data, its reward ConfigMap, and the manifest
pinned to the nodes' pool with its work folder on this machine. Shared by `make demo` and
the end-to-end tests."""

from __future__ import annotations

import copy
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from rlkube_e2e.cluster import REPO_ROOT
from rlkube_e2e.polling import SLOW, WaitTimedOut, poll_until
from rlkube_e2e.pools import POOL_LABEL
from rlkube_e2e.testing import Kubectl

EXAMPLE = REPO_ROOT / "examples" / "tiny-cpu.yaml"
REWARD = REPO_ROOT / "examples" / "rewards" / "tiny_task.py"
CRD = REPO_ROOT / "crds" / "rljob.yaml"
# Where the example mounts its work folder in the pods; the hostPath behind it is the demo's.
MOUNT = "/rlkube"
REAL_POOL = "real"  # the pool label of the local cluster's real nodes


@dataclass(frozen=True)
class TinyJob:
    """One run of the example: its manifest and where its files are on this machine."""

    manifest: dict[str, Any]
    workdir: Path  # the hostPath mounted at /rlkube in every pod

    @property
    def name(self) -> str:
        return str(self.manifest["metadata"]["name"])

    def host_path(self, pod_path: str) -> Path:
        """Where a path under /rlkube in the pods lives on this machine."""
        return self.workdir / Path(pod_path).relative_to(MOUNT)

    @property
    def checkpoints(self) -> Path:
        return self.host_path(self.manifest["spec"]["checkpoint"]["dir"])

    def metrics(self) -> list[dict[str, float]]:
        path = self.checkpoints / "metrics.jsonl"
        if not path.exists():
            return []
        text = path.read_text()
        lines = text.splitlines()
        if lines and not text.endswith("\n"):
            lines.pop()  # a line the driver is still writing
        return [json.loads(line) for line in lines if line.strip()]


def prepare(
    workdir: Path,
    name: str = "tiny-cpu",
    steps: int | None = None,
    save_freq: int | None = None,
    pool: str = REAL_POOL,
) -> TinyJob:
    """The init step (model, data under workdir/tiny) and the manifest: every pod on the
    real nodes' pool, the example's hostPath replaced by workdir."""
    from rlkube_trainer.tiny.task import VAL_PROMPTS, build_model, write_dataset  # noqa: PLC0415  (torch: only here)

    manifest: dict[str, Any] = copy.deepcopy(yaml.safe_load(EXAMPLE.read_text()))
    spec = manifest["spec"]
    manifest["metadata"]["name"] = name
    for volume in spec["volumes"]:
        if volume["mountPath"] == MOUNT:
            volume["source"] = {"hostPath": {"path": str(workdir), "type": "DirectoryOrCreate"}}
    spec["checkpoint"]["dir"] = f"{MOUNT}/checkpoints/{name}"
    if steps is not None:
        spec["trainer"]["totalTrainingSteps"] = steps
    if save_freq is not None:
        spec["trainer"]["saveFreq"] = save_freq
    # The simulated GPU pools are kwok nodes that run nothing: pin every pod to the real nodes.
    selector = {POOL_LABEL: pool}
    spec.setdefault("controller", {})["pool"] = {"nodeSelector": selector}
    for role in spec["roles"].values():
        role["pool"] = {"nodeSelector": selector}
    job = TinyJob(manifest, workdir)
    model = job.host_path(spec["model"]["path"])
    if not (model / "config.json").exists():
        build_model(model)
    data = job.host_path(spec["data"]["trainFiles"][0])
    if not data.exists():
        write_dataset(data)
    # Held-out prompts, another seed (as `rlkube-trainer tiny-task` writes them).
    for val in spec["data"].get("valFiles", []):
        if not job.host_path(val).exists():
            write_dataset(job.host_path(val), count=VAL_PROMPTS, seed=1)
    job.checkpoints.parent.mkdir(parents=True, exist_ok=True)
    return job


# The trainer image's user and group (Dockerfile.trainer: USER 1000:1000).
TRAINER_UID = 1000


def from_image(job: TinyJob, image_ref: str) -> None:
    """Run the job's pods from a trainer image built here (never pulled: there is no
    registry), as a real node does; its user must be able to write the work folder, which a
    hostPath volume does not get chowned for (fsGroup leaves hostPath alone)."""
    spec = job.manifest["spec"]
    spec["image"], spec["imagePullPolicy"] = image_ref, "Never"
    for path in (job.workdir, *job.workdir.rglob("*")):
        os.chown(path, TRAINER_UID, TRAINER_UID)


def host_path_volume(
    name: str, path: Path, namespace: str, claim: str, modes: tuple[str, ...] = ("ReadWriteMany",)
) -> dict[str, Any]:
    """A PersistentVolume over a folder of this machine, bound ahead to `namespace/claim`
    (the local cluster has no storage provisioner; its nodes share this machine's disk)."""
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": name},
        "spec": {
            "capacity": {"storage": "1Ti"},
            "accessModes": list(modes),
            "persistentVolumeReclaimPolicy": "Retain",
            "hostPath": {"path": str(path), "type": "Directory"},
            "claimRef": {"namespace": namespace, "name": claim},
        },
    }


def claim_workdir(kubectl: Kubectl, namespace: str, job: TinyJob) -> str:
    """Put the job's work folder behind a PersistentVolumeClaim instead of a hostPath volume,
    which the restricted Pod Security Standard refuses in pods: a hostPath PersistentVolume
    bound to the claim `<job>-work` (the local nodes share this machine's disk, so
    ReadWriteMany holds). Idempotent: a claim already bound to it is reused."""
    claim = f"{job.name}-work"
    volume_name = f"{namespace}-{claim}"
    job.workdir.mkdir(parents=True, exist_ok=True)
    pv = host_path_volume(volume_name, job.workdir, namespace, claim)
    pvc = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": claim, "namespace": namespace},
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "resources": {"requests": {"storage": "1Gi"}},
            "volumeName": volume_name,
        },
    }
    kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump_all([pv, pvc]))
    for volume in job.manifest["spec"]["volumes"]:
        if volume["mountPath"] == MOUNT:
            volume["source"] = {"persistentVolumeClaim": {"claimName": claim}}
    return claim


def reward_config_map(job: TinyJob, namespace: str | None = None) -> dict[str, Any]:
    """The ConfigMap holding the reward function the example names."""
    reward = job.manifest["spec"]["reward"]["function"]["configMap"]
    metadata: dict[str, Any] = {"name": reward["name"]}
    if namespace:
        metadata["namespace"] = namespace
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": {reward["key"]: REWARD.read_text()}}


def apply(kubectl: Kubectl, namespace: str, job: TinyJob) -> None:
    """The reward ConfigMap the example names, then the RLJob."""
    kubectl("apply", "--server-side", "-f", "-", input=json.dumps(reward_config_map(job, namespace)))
    kubectl("-n", namespace, "apply", "--server-side", "-f", "-", input=json.dumps(job.manifest))


def status(kubectl: Kubectl, namespace: str, name: str) -> dict[str, Any]:
    out = kubectl("-n", namespace, "get", "rljob", name, "-o", "jsonpath={.status}", check=False).stdout
    return json.loads(out) if out.strip() else {}


def wait_state(
    kubectl: Kubectl, namespace: str, name: str, states: tuple[str, ...], timeout: float, show: bool = False
) -> dict[str, Any]:
    """Polls the job's status until its state is one of `states`; prints progress with `show`."""
    last_line = ""
    current: dict[str, Any] = {}

    def reached() -> dict[str, Any] | None:
        nonlocal current, last_line
        current = status(kubectl, namespace, name)
        if show:
            progress = current.get("progress", {})
            line = (
                f"  {current.get('state', '-'):<10} step {progress.get('step', 0)}/{progress.get('totalSteps', '?')}"
                f"  reward {progress.get('rewardMean') or float('nan'):.3f}"
                f"  val {progress.get('valScore') or float('nan'):.3f} (step {progress.get('valStep', '-')})"
                f"  restarts {current.get('restartCount', 0)}"
            )
            if line != last_line:
                print(line, flush=True)
                last_line = line
        return current if current.get("state") in states else None

    try:
        # A `kubectl get` that times out or fails to parse (a busy API server) is "not yet".
        return poll_until(
            reached,
            f"RLJob {namespace}/{name} in {states}",
            timeout=timeout,
            interval=2.0,
            transient=(*SLOW, json.JSONDecodeError),
        )
    except WaitTimedOut as error:
        raise TimeoutError(f"{error}; status {current}") from None


def main(argv: list[str] | None = None) -> int:
    """`python -m rlkube_e2e.tinyjob WORKDIR | kubectl -n NS apply -f -`: runs the init step
    into WORKDIR and prints the reward ConfigMap and the example pinned to a node pool,
    optionally from a trainer image built here."""
    import argparse  # noqa: PLC0415

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("workdir", type=Path, help="host folder mounted at /rlkube in the pods")
    parser.add_argument("--name", default="tiny-cpu")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--pool", default=REAL_POOL, help="the node pool every pod is pinned to")
    parser.add_argument("--image", default=None, help="a trainer image the nodes hold (never pulled)")
    args = parser.parse_args(argv)
    job = prepare(args.workdir.resolve(), args.name, args.steps, pool=args.pool)
    if args.image:
        from_image(job, args.image)
    print(yaml.safe_dump_all([reward_config_map(job), job.manifest], sort_keys=False), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
