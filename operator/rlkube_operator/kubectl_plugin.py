"""`kubectl rlkube`: a kubectl plugin (the `kubectl-rlkube` entry point on PATH).

- `status NAME`: state, progress in percent, reward, throughput, restarts, pods per
  role and the conditions, rounded for reading;
- `logs NAME [--role ROLE] [--rank N]`: the driver's log (the controller pod), or a
  role's pod of that rank, with kubectl's -f/--tail/--previous;
- `curves NAME [-o curves.png]`: the reward, KL and response-length curves of a
  running job, from the step lines the driver logs (`kubectl logs`, so it works
  wherever logs do, the local cluster's real nodes included; the driver's metrics.jsonl has
  every metric but lives on the checkpoint volume);
- `suspend NAME` / `resume NAME`: sets spec.suspend (the operator scales the pods to
  zero and back, from the last checkpoint).

Everything goes through the kubectl it runs as (`$KUBECTL`, else `kubectl` on PATH)
with the user's kubeconfig, context and namespace flags, so the plugin needs no
Kubernetes client. The formatting and parsing are pure functions.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rlkube_api.names import CONTROLLER_ROLE, child_name
from rlkube_api.pod_template import TRAINER_CONTAINER
from rlkube_api.rljob import PLURAL
from rlkube_api.roles import ALL_ROLES
from rlkube_api.step_rows import parse_step_lines, plot_curves

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


# --- kubectl --------------------------------------------------------------------------------------


class Kubectl:
    def __init__(self, flags: Sequence[str]) -> None:
        self.binary = os.environ.get("KUBECTL", "kubectl")
        self.flags = list(flags)

    def run(self, *args: str, capture: bool = True) -> str:
        command = [self.binary, *self.flags, *args]
        try:
            result = subprocess.run(command, capture_output=capture, text=True, check=False)
        except FileNotFoundError:
            raise PluginError(f"{self.binary} not found (set KUBECTL to its path)") from None
        if result.returncode != 0:
            raise PluginError((result.stderr or "").strip() or f"kubectl {' '.join(args)} failed")
        return result.stdout or ""

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


def _logs(kubectl: Kubectl, args: argparse.Namespace) -> int:
    extra = ["-f"] if args.follow else []
    extra += [f"--tail={args.tail}"] if args.tail is not None else []
    extra += ["--previous"] if args.previous else []
    kubectl.run("logs", pod_name(args.name, args.role, args.rank), "-c", TRAINER_CONTAINER, *extra, capture=False)
    return 0


def _curves(kubectl: Kubectl, args: argparse.Namespace) -> int:
    log = kubectl.run("logs", pod_name(args.name, CONTROLLER_ROLE, 0), "-c", TRAINER_CONTAINER)
    rows = parse_step_lines(log)
    if not rows:
        raise PluginError(f"no step lines in the driver's log yet ({pod_name(args.name, CONTROLLER_ROLE, 0)})")
    if not plot_curves(rows, args.output):
        raise PluginError("matplotlib is not installed (pip install 'rlkube[trainer]')")
    print(f"{args.output}: {len(rows)} steps, {rows[0]['step']:.0f} to {rows[-1]['step']:.0f}")
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
        return _set_suspend(kubectl, args.name, args.command == "suspend")
    except PluginError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
