"""Run an RLJob's pods as processes on one host, with the environment the operator gives them.

For a multi-GPU host without Kubernetes (the benchmark machine): the operator's own builders
(`rlkube_operator.desired.desired_children`) produce the StatefulSets, ConfigMap and Secret
of the job; every pod becomes a process running the pod's command with the pod's env
(downward-API fields and the Ray token resolved as the kubelet would), so the trainer runs
through exactly the entry points and rendezvous env it gets in a cluster. What a single host
forces to differ, and nothing else:

- every `*.svc` host name is 127.0.0.1 (pods share the host's network);
- each role's MASTER_PORT moves by 10 per role (every role group would listen on 29500),
  and each Ray node gets its own agent ports (RLKUBE_RAY_START_ARGS) and health port;
- CUDA_VISIBLE_DEVICES per pod from --gpus (a device plugin's job in a cluster);
- the trainer config is written to OUT/config.yaml (the ConfigMap's mount).

    python bench/gpu/local_pods.py JOB.yaml --out DIR --gpus actor=0,1 --gpus rollout=1

Exits with the driver's exit code; logs per pod under OUT/logs/.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
for _sub in ("api", "operator", "trainer", "e2e"):
    if str(ROOT / _sub) not in sys.path:
        sys.path.insert(0, str(ROOT / _sub))

from rlkube_api.names import RAY_START_ARGS_ENV, Env  # noqa: E402
from rlkube_api.validation import parse_rljob  # noqa: E402
from rlkube_e2e.pod_env import container_env, decode_secret  # noqa: E402
from rlkube_operator.desired import desired_children  # noqa: E402

POD_INDEX_LABEL = "apps.kubernetes.io/pod-index"
SVC_HOST = re.compile(r"[a-z0-9.-]+\.svc(\.cluster\.local)?")


def resolve_env(
    sts: dict[str, Any], index: int, namespace: str, objects: dict[tuple[str, str], dict[str, str]]
) -> dict[str, str]:
    """The env the kubelet gives pod `index` of StatefulSet `sts` (the process node's resolution:
    downward-API fields, Secret and ConfigMap references, $(VAR)), with every `*.svc` host name
    made 127.0.0.1."""
    template = sts["spec"]["template"]
    metadata = template.get("metadata", {})
    pod = {
        "metadata": {
            **metadata,
            "name": f"{sts['metadata']['name']}-{index}",
            "namespace": namespace,
            "labels": {**metadata.get("labels", {}), POD_INDEX_LABEL: str(index)},
        },
        "spec": template["spec"],
    }
    container = template["spec"]["containers"][0]
    env = container_env(pod, container, lambda kind, name: objects.get((kind, name)), "127.0.0.1", "127.0.0.1", {})
    return {k: SVC_HOST.sub("127.0.0.1", v) for k, v in env.items()}


def object_data(manifest: dict[str, Any]) -> dict[str, str]:
    """A Secret's or ConfigMap's data as a pod sees it (Secret values decoded)."""
    data = dict(manifest.get("stringData", {}))
    if manifest["kind"] == "Secret":
        data.update(decode_secret(manifest.get("data", {})))
    else:
        data.update(manifest.get("data", {}))
    return data


def pods_of(job_file: Path, out: Path, gpus: dict[str, list[str]]) -> list[tuple[str, list[str], dict[str, str]]]:
    """(pod name, command, env) for every pod of the job, the controller last."""
    raw = yaml.safe_load(job_file.read_text())
    job = parse_rljob(raw)
    namespace = raw["metadata"].get("namespace", "default")
    children = desired_children(job, "local-uid", 0, True, os.urandom(16).hex())
    objects = {
        (c["kind"].lower(), c["metadata"]["name"]): object_data(c)
        for c in children
        if c["kind"] in ("Secret", "ConfigMap")
    }
    config_maps = [c for c in children if c["kind"] == "ConfigMap"]
    config = out / "config.yaml"
    config.write_text(config_maps[0]["data"]["config.yaml"])
    pods: list[tuple[str, list[str], dict[str, str]]] = []
    roles = [c for c in children if c["kind"] == "StatefulSet"]
    for role_index, sts in enumerate(roles):
        role = sts["spec"]["selector"]["matchLabels"]["rlkube.dev/role"]
        container = sts["spec"]["template"]["spec"]["containers"][0]
        for index in range(sts["spec"]["replicas"]):
            pod = f"{sts['metadata']['name']}-{index}"
            env = resolve_env(sts, index, namespace, objects)
            env[Env.CONFIG] = str(config)
            if Env.MASTER_PORT in env:
                env[Env.MASTER_PORT] = str(int(env[Env.MASTER_PORT]) + 10 * role_index)
            node = len(pods)
            env[RAY_START_ARGS_ENV] = (
                f"--dashboard-agent-listen-port={52400 + node} --dashboard-agent-grpc-port={52500 + node} "
                f"--runtime-env-agent-port={52600 + node} --metrics-export-port={52700 + node}"
            )
            devices = gpus.get(role, [])
            # '+' joins the devices of one pod: --gpus actor=0+1+2+3 is one pod of 4 GPUs.
            env["CUDA_VISIBLE_DEVICES"] = devices[index].replace("+", ",") if index < len(devices) else ""
            command = [*container.get("command", []), *container.get("args", [])]
            if command[:1] == ["rlkube-trainer"] and shutil.which("rlkube-trainer") is None:
                # The project is on PYTHONPATH but not installed (no entry-point script).
                command = [sys.executable, "-m", "rlkube_trainer.pod.cli", *command[1:]]
            if role != "controller":
                command += ["--health-port", str(18100 + node)]
            pods.append((pod, command, env))
    pods.sort(key=lambda p: "controller" in p[0])
    return pods


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("job", type=Path, help="RLJob YAML")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--gpus",
        action="append",
        default=[],
        help="ROLE=DEV[,DEV...]: the devices of each pod index in turn, '+' between one pod's (0+1,2+3)",
    )
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--ray-stop", action="store_true", help="`ray stop --force` at the end (kills all Ray here)")
    args = parser.parse_args(argv)
    gpus = {k: v.split(",") for k, v in (g.split("=", 1) for g in args.gpus)}
    logs = args.out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    bin_dir = str(Path(sys.executable).parent)
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for pod, command, env in pods_of(args.job, args.out, gpus):
            full_env = {**os.environ, **env, "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}"}
            print(f"pod {pod}: {' '.join(command)} (CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES']!r})", flush=True)
            with (logs / f"{pod}.log").open("wb") as log:
                procs[pod] = subprocess.Popen(
                    command, env=full_env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
                )
        driver = next(p for name, p in procs.items() if "controller" in name)
        deadline = time.monotonic() + args.timeout
        while driver.poll() is None and time.monotonic() < deadline:
            for name, proc in procs.items():
                if proc is not driver and proc.poll() not in (None, 0):
                    print(f"pod {name} exited {proc.returncode}", flush=True)
            time.sleep(5)
        code = driver.poll()
        print(f"driver exit code: {code}", flush=True)
        return 124 if code is None else code
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        time.sleep(3)
        for proc in procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        if args.ray_stop:
            subprocess.run([shutil.which("ray") or "ray", "stop", "--force"], capture_output=True, check=False)


if __name__ == "__main__":
    raise SystemExit(main())
