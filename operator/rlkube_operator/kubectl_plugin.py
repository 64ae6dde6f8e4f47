"""`kubectl rlkube`: a kubectl plugin (the `kubectl-rlkube` entry point on PATH).

- `status NAME`: state, progress in percent, reward, throughput, restarts, pods per
  role and the conditions, rounded for reading;
- `logs NAME [--role ROLE] [--rank N]`: the driver's log (the controller pod), or a
  role's pod of that rank, with kubectl's -f/--tail/--previous;
- `curves NAME [-o curves.png]`: the reward, KL and response-length curves of a
  running job, from the step lines the driver logs (`kubectl logs`, so it works
  wherever logs do, the local cluster's real nodes included);
- a finished job's pods are deleted at its end, and their logs with them; what stays is
  checkpoint.dir on the job's volume, where the driver keeps metrics.jsonl and a copy of
  its log. `logs` (of the driver) and `curves` read them there once the controller pod is
  gone, through a short-lived pod of the job's image with that volume mounted read-only
  (deleted once read), as a user would with `kubectl debug`: no pod of the job is kept
  around, holding its nodes, only for its log;
- `plan NAME` or `plan -f FILE [--gpu-memory-mib N]`: each role's parallel layout, where its
  tensor-, pipeline- and sequence-parallel groups sit, and its memory per rank in each phase
  (rlkube_api.fit), the estimate the operator checks before it creates pods;
- `suspend NAME` / `resume NAME`: sets spec.suspend (the operator scales the pods to
  zero and back, from the last checkpoint).

Everything goes through the kubectl it runs as (`$KUBECTL`, else `kubectl` on PATH)
with the user's kubeconfig, context and namespace flags, so the plugin needs no
Kubernetes client. The formatting and parsing are pure functions.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import posixpath
import re
import secrets
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from rlkube_api.names import CONTROLLER_ROLE, DRIVER_LOG_FILE, METRICS_FILE, child_name
from rlkube_api.pod_template import TRAINER_CONTAINER
from rlkube_api.rljob import PLURAL
from rlkube_api.roles import ALL_ROLES
from rlkube_api.step_rows import parse_step_lines, plot_curves
from rlkube_api.validation import InvalidSpec, parse_rljob
from rlkube_operator.children.statefulset import CONTAINER_SECURITY_CONTEXT, volumes_and_mounts
from rlkube_operator.fit import format_plan
from rlkube_operator.runtimes import Held, resolve_job, runtime_ref

Obj = dict[str, Any]


class PluginError(Exception):
    """A failure to show the user in one line."""


# --- pure: formatting and parsing -------------------------------------------------------------


def _number(value: Any, digits: int) -> str:
    if value is None:
        return "-"
    return f"{float(value):,.{digits}f}"


def format_status(job: Obj) -> str:
    meta, spec, status = job["metadata"], job.get("spec") or {}, job.get("status") or {}
    progress = status.get("progress") or {}
    step, total = progress.get("step"), progress.get("totalSteps")
    done = f" ({100 * step / total:.1f}%)" if step is not None and total else ""
    lines = [
        f"RLJob {meta.get('namespace', '')}/{meta['name']}",
        f"  state:        {status.get('state') or 'Pending'}" + (" (suspended)" if spec.get("suspend") else ""),
        f"  step:         {step if step is not None else '-'} / {total if total is not None else '-'}{done}",
        f"  reward:       {_number(progress.get('rewardMean'), 4)}",
        f"  tokens/s/GPU: {_number(progress.get('tokensPerSecondPerGPU'), 1)}",
        f"  checkpoint:   step {progress.get('lastCheckpointStep', '-')}",
        f"  restarts:     {status.get('restartCount', 0)}",
    ]
    roles = status.get("roles") or {}
    if roles:
        lines.append(
            "  pods:         "
            + ", ".join(f"{r} {s.get('ready', 0)}/{s.get('replicas', 0)} ready" for r, s in roles.items())
        )
        layouts = [f"{r} {s['layout']}" for r, s in roles.items() if s.get("layout")]
        if layouts:
            lines.append("  layout:       " + ", ".join(layouts))
    conditions = status.get("conditions") or []
    if conditions:
        lines.append("  conditions:")
        width = max(len(c["type"]) for c in conditions)
        for c in conditions:
            message = f": {c['message']}" if c.get("message") else ""
            lines.append(f"    {c['type']:<{width}}  {c['status']:<5}  {c.get('reason', '')}{message}")
    return "\n".join(lines)


def pod_name(job: str, role: str, rank: int) -> str:
    """StatefulSet pods are named <statefulset>-<ordinal>; a pod's ordinal is its rank."""
    return f"{child_name(job, role)}-{rank}"


# What kubectl puts before the API server's message: "error: ", "Error from server (NotFound): ",
# or both ("error: error from server ..." from `kubectl logs`).
_KUBECTL_PREFIX = re.compile(r"^(?:error:\s*)*(?:error from server(?: \(\w+\))?:\s*)?", re.IGNORECASE)


def kubectl_message(stderr: str) -> str:
    """kubectl's error as one line of the plugin's own, which says "error: " once."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip() and not line.startswith("Warning:")]
    # The API server's own message says what failed ('pods "x" not found', '... is forbidden: ...').
    return _KUBECTL_PREFIX.sub("", "; ".join(lines))


def metrics_rows(text: str) -> list[dict[str, float]]:
    """metrics.jsonl's rows, one per step (a step a restarted run redid keeps its latest row);
    a line cut short by a write in progress is skipped."""
    rows: dict[int, dict[str, float]] = {}
    for line in text.splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and isinstance(row.get("step"), int | float):
            rows[int(row["step"])] = {k: v for k, v in row.items() if isinstance(v, int | float)}
    return [rows[step] for step in sorted(rows)]


# How long the pod that reads a file from a finished job's volume may take to start and end.
READER_TIMEOUT_SECONDS = 180.0


def reader_pod(job: Obj, name: str, file: str) -> Obj:
    """A pod that prints `file` of the job's checkpoint.dir and ends: the job's image (which the
    job's nodes hold) and pull secrets, the controller's pool, and the job's volume that holds
    checkpoint.dir, mounted read-only where the job's pods mount it. Under the restricted Pod
    Security Standard, as the job's pods are. Not labelled as the job's: the operator's view of
    the job's pods must not count it. Raises PluginError when checkpoint.dir is on no volume
    of the job (an object store keeps the checkpoints, a pod's own disk the rest)."""
    meta = job["metadata"]
    if runtime_ref(job) is not None:
        # The runtime as the job resolved it (status.runtime), which gave its image and volumes.
        resolved = resolve_job(job, lambda *_: None)
        if isinstance(resolved, Held):
            raise PluginError(f"RLJob {meta['name']}: {resolved.message}")
        rljob = resolved
    else:
        try:
            rljob = parse_rljob(job, f"RLJob {meta['name']}", admitted=True)
        except InvalidSpec as exc:
            raise PluginError(str(exc)) from None
    folder = rljob.spec.checkpoint.dir
    volumes, mounts = volumes_and_mounts(rljob)
    holding = [m for m in mounts if _under(folder, m["mountPath"])]
    if not holding:
        raise PluginError(
            f"RLJob {meta['name']}'s pods are gone and its checkpoint.dir {folder} is on none of its volumes: "
            f"{file} went with them"
        )
    mount = max(holding, key=lambda m: len(m["mountPath"]))
    volume = next(v for v in volumes if v["name"] == mount["name"])
    pod: dict[str, Any] = {
        "restartPolicy": "Never",
        "containers": [
            {
                "name": "reader",
                "image": rljob.spec.image,
                "imagePullPolicy": rljob.spec.image_pull_policy,
                "command": ["cat", posixpath.join(folder, file)],
                "volumeMounts": [{**mount, "readOnly": True}],
                "securityContext": copy.deepcopy(CONTAINER_SECURITY_CONTEXT),
                "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}},
            }
        ],
        "volumes": [volume],
        "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
        "automountServiceAccountToken": False,
    }
    if rljob.spec.image_pull_secrets:
        pod["imagePullSecrets"] = [secret.to_wire() for secret in rljob.spec.image_pull_secrets]
    if rljob.spec.controller.pool is not None:
        pool = rljob.spec.controller.pool.to_wire()
        pod.update({key: pool[key] for key in ("nodeSelector", "tolerations", "affinity") if key in pool})
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": meta.get("namespace")},
        "spec": pod,
    }


def _under(path: str, folder: str) -> bool:
    folder = folder.rstrip("/") or "/"
    return path == folder or path.startswith(folder if folder.endswith("/") else folder + "/")


# --- kubectl --------------------------------------------------------------------------------------


class Kubectl:
    def __init__(self, flags: Sequence[str]) -> None:
        self.binary = os.environ.get("KUBECTL", "kubectl")
        self.flags = list(flags)

    def run(self, *args: str, capture: bool = True, stdin: str | None = None) -> str:
        command = [self.binary, *self.flags, *args]
        try:
            result = subprocess.run(command, capture_output=capture, text=True, check=False, input=stdin)
        except FileNotFoundError:
            raise PluginError(f"{self.binary} not found (set KUBECTL to its path)") from None
        if result.returncode != 0:
            raise PluginError(kubectl_message(result.stderr or "") or f"kubectl {' '.join(args)} failed")
        return result.stdout or ""

    def pod_exists(self, name: str) -> bool:
        return bool(self.run("get", "pods", "--field-selector", f"metadata.name={name}", "-o", "name").strip())

    def read_from_volume(self, job: Obj, file: str) -> str:
        """`file` of a job's checkpoint.dir, printed by a short-lived pod (`reader_pod`)."""
        name = f"{job['metadata']['name']}-reader-{secrets.token_hex(3)}"
        self.run("create", "-f", "-", stdin=json.dumps(reader_pod(job, name, file)))
        try:
            deadline = time.monotonic() + READER_TIMEOUT_SECONDS
            phase = ""
            while phase not in ("Succeeded", "Failed"):
                if time.monotonic() > deadline:
                    raise PluginError(
                        f"pod {name}, reading {file} from the job's volume, did not end within "
                        f"{READER_TIMEOUT_SECONDS:.0f}s (kubectl describe pod {name})"
                    )
                time.sleep(0.5)
                phase = self.run("get", "pod", name, "-o", "jsonpath={.status.phase}").strip()
            text = self.run("logs", name)
            if phase == "Failed":
                raise PluginError(
                    f"cannot read {file} from the job's volume: {text.strip() or 'the reader pod failed'}"
                )
            return text
        finally:
            with contextlib.suppress(PluginError):
                self.run("delete", "pod", name, "--wait=false", "--ignore-not-found")

    def rljob(self, name: str) -> Obj:
        job: Obj = json.loads(self.run("get", f"{PLURAL}.rlkube.dev", name, "-o", "json"))
        return job


def _flags(args: argparse.Namespace) -> list[str]:
    flags = []
    for option in ("namespace", "context", "kubeconfig"):
        value = getattr(args, option)
        if value:
            flags.append(f"--{option}={value}")
    return flags


def _status(kubectl: Kubectl, args: argparse.Namespace) -> int:
    print(format_status(kubectl.rljob(args.name)))
    return 0


def tail(text: str, lines: int | None) -> str:
    """The last `lines` lines of `text`, as `kubectl logs --tail` counts them (-1 or None: all)."""
    kept = text.splitlines(keepends=True)
    if lines is None or lines < 0:
        return text
    return "".join(kept[len(kept) - lines :]) if lines else ""


def _logs(kubectl: Kubectl, args: argparse.Namespace) -> int:
    pod = pod_name(args.name, args.role, args.rank)
    if not kubectl.pod_exists(pod):
        job = kubectl.rljob(args.name)  # a missing job is named as kubectl names it
        state = (job.get("status") or {}).get("state") or "Pending"
        if args.role != CONTROLLER_ROLE:
            raise PluginError(
                f"pod {pod} does not exist (RLJob {args.name} is {state}): a role pod's log goes with the pod; "
                f"the driver's is kept (kubectl rlkube logs {args.name})"
            )
        sys.stdout.write(tail(kubectl.read_from_volume(job, DRIVER_LOG_FILE), args.tail))
        return 0
    extra = ["-f"] if args.follow else []
    extra += [f"--tail={args.tail}"] if args.tail is not None else []
    extra += ["--previous"] if args.previous else []
    kubectl.run("logs", pod, "-c", TRAINER_CONTAINER, *extra, capture=False)
    return 0


def _curves(kubectl: Kubectl, args: argparse.Namespace) -> int:
    driver = pod_name(args.name, CONTROLLER_ROLE, 0)
    if kubectl.pod_exists(driver):
        rows = parse_step_lines(kubectl.run("logs", driver, "-c", TRAINER_CONTAINER))
        where = f"the driver's log ({driver})"
    else:
        rows = metrics_rows(kubectl.read_from_volume(kubectl.rljob(args.name), METRICS_FILE))
        where = f"{METRICS_FILE} on the job's volume"
    if not rows:
        raise PluginError(f"no steps in {where} yet")
    if not plot_curves(rows, args.output):
        raise PluginError("matplotlib is not installed (pip install 'rlkube[trainer]')")
    print(f"{args.output}: {len(rows)} steps, {rows[0]['step']:.0f} to {rows[-1]['step']:.0f}")
    return 0


def _plan(kubectl: Kubectl, args: argparse.Namespace) -> int:
    if (args.name is None) == (args.filename is None):
        raise PluginError("plan takes an RLJob's name or -f FILE")
    if args.filename is not None:
        try:
            raw = yaml.safe_load(args.filename.read_text())
        except (OSError, yaml.YAMLError) as exc:
            raise PluginError(f"{args.filename}: {exc}") from exc
    else:
        raw = kubectl.rljob(args.name)
    try:
        job = parse_rljob({k: v for k, v in raw.items() if k != "status"})
    except (InvalidSpec, ValueError) as exc:
        raise PluginError(f"{args.filename or args.name}: {exc}") from exc
    print(format_plan(job, args.gpu_memory_mib))
    return 0


def _set_suspend(kubectl: Kubectl, name: str, suspend: bool) -> int:
    patch = json.dumps({"spec": {"suspend": suspend}})
    kubectl.run("patch", f"{PLURAL}.rlkube.dev", name, "--type=merge", "-p", patch)
    print(f"rljob {name} {'suspended' if suspend else 'resumed'}")
    return 0


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="kubectl rlkube", description="RLJobs from the command line")
    top.add_argument("-n", "--namespace", help="the RLJob's namespace (default: the context's)")
    top.add_argument("--context", help="kubeconfig context")
    top.add_argument("--kubeconfig", help="kubeconfig file")
    sub = top.add_subparsers(dest="command", required=True)
    status = sub.add_parser("status", help="state, progress, reward, throughput, restarts, conditions")
    status.add_argument("name")
    logs = sub.add_parser("logs", help="the driver's log, or a role's pod of one rank")
    logs.add_argument("name")
    logs.add_argument("--role", default=CONTROLLER_ROLE, choices=[CONTROLLER_ROLE, *ALL_ROLES])
    logs.add_argument("--rank", type=int, default=0, help="the pod's rank in its role (default 0)")
    logs.add_argument("-f", "--follow", action="store_true")
    logs.add_argument("--tail", type=int)
    logs.add_argument("-p", "--previous", action="store_true", help="the previous run of the container")
    curves = sub.add_parser("curves", help="a PNG of the reward, KL and response-length curves so far")
    curves.add_argument("name")
    curves.add_argument("-o", "--output", type=Path, default=Path("curves.png"))
    plan = sub.add_parser("plan", help="each role's parallel layout and its memory per rank, before any pod exists")
    plan.add_argument("name", nargs="?", help="an RLJob in the cluster (or -f FILE)")
    plan.add_argument("-f", "--filename", type=Path, help="an RLJob manifest")
    plan.add_argument("--gpu-memory-mib", type=int, help="GPU memory (default: the job's spec.fit.gpuMemoryMiB)")
    for verb in ("suspend", "resume"):
        sub.add_parser(verb, help=f"{verb} the job (spec.suspend)").add_argument("name")
    return top


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    kubectl = Kubectl(_flags(args))
    try:
        if args.command == "status":
            return _status(kubectl, args)
        if args.command == "logs":
            return _logs(kubectl, args)
        if args.command == "curves":
            return _curves(kubectl, args)
        if args.command == "plan":
            return _plan(kubectl, args)
        return _set_suspend(kubectl, args.name, args.command == "suspend")
    except PluginError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
