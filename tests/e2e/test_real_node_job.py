"""The tiny RLJob on real nodes from the trainer image built here: the chart's
operator, the restricted Pod Security Standard, and its pods split across two nodes. The
two-node cluster with the imported images is the package's (`tests/e2e/conftest.py`)."""

from __future__ import annotations

import json
import os
import shutil
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from rlkube_api.names import DRIVER_METRICS_PORT, LABEL_JOB, RAY_PORT
from rlkube_e2e import tinyjob
from rlkube_e2e.node import network_policies
from rlkube_e2e.node.node import RealNode, find_node_binaries
from rlkube_e2e.testing import Kubectl, wait_for
from tests.e2e import real_node_kit
from tests.e2e.real_node_kit import RealCluster
from tests.e2e.test_kubectl_plugin_logs import _plugin

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.e2e,
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None, reason="needs root and iproute2"),
]


STEPS = 8
# Run in the trainer container: what its process sees. Each write raises if it cannot.
PROBE = """
import json, os, pathlib, tempfile
home = pathlib.Path.home()
(home / ".cache" / "rlkube-probe").mkdir(parents=True, exist_ok=True)
(home / ".cache" / "rlkube-probe" / "written").write_text("x")
pathlib.Path(tempfile.gettempdir(), "rlkube-probe").write_text("x")
pathlib.Path("/dev/shm/rlkube-probe").write_bytes(bytes(1 << 20))
shm = os.statvfs("/dev/shm")
mounts = [line.split() for line in open("/proc/mounts")]
print(json.dumps({
    "uid": os.getuid(), "home": str(home), "shm_bytes": shm.f_blocks * shm.f_frsize,
    "shm_type": next(m[2] for m in mounts if m[1] == "/dev/shm"),
}))
"""


def _inside(kubectl: Kubectl, namespace: str, pod: str) -> dict[str, Any] | None:
    result = kubectl("-n", namespace, "exec", pod, "-c", "trainer", "--", "python3", "-c", PROBE, check=False)
    if result.returncode != 0:
        assert "Permission denied" not in result.stderr and "Read-only" not in result.stderr, result.stderr
        return None
    return dict(json.loads(result.stdout))


def test_the_chart_and_the_tiny_job_run_from_their_images_under_the_restricted_standard(
    real_cluster: RealCluster, tmp_path: Path
) -> None:
    """What a user does, on real nodes with the images built here: `helm install` (the
    operator's pods start from its image as its non-root user, pass the kubelet's probes and
    reach the API through the `kubernetes` Service with the chart's ServiceAccount), then the
    tiny RLJob, whose pods start from the trainer image in a namespace that enforces the
    restricted Pod Security Standard. The controller and the rollout pod run on one node and
    the actors on the other, so Ray's, torch.distributed's and the weight sync's connections
    cross between the nodes; the job trains to Succeeded. Inside a trainer container meanwhile:
    the image's non-root user with writable caches and a memory-backed /dev/shm. Once it has
    succeeded, every pod of it is gone within seconds with no container run again, and
    `kubectl rlkube logs` and `curves` read the finished job's log and metrics from its volume."""
    trainer, kubeconfig = real_cluster.images["trainer-cpu"], real_cluster.cluster.kubeconfig
    namespace = "tiny-restricted"
    with real_node_kit.restricted_operator(real_cluster, namespace) as kubectl:
        workdir = tmp_path / "work"
        job = tinyjob.prepare(workdir, name="tiny-real", steps=STEPS, save_freq=2, pool="real")
        tinyjob.from_image(job, trainer.ref)
        spec = job.manifest["spec"]
        tinyjob.claim_workdir(kubectl, namespace, job)
        apart = {"controller": 1, "rollout": 1, "actor": 0}
        spec["controller"]["pool"] = {"nodeSelector": {"test/index": str(apart["controller"])}}
        for role, settings in spec["roles"].items():
            settings["pool"] = {"nodeSelector": {"test/index": str(apart[role])}}
        spec["networkPolicy"] = {"metricsNamespace": MONITORING}
        _start_probes(kubectl, namespace, real_cluster.images["base"].ref)
        tinyjob.apply(kubectl, namespace, job)
        seen = wait_for(lambda: _inside(kubectl, namespace, f"{job.name}-actor-0"), "an exec into actor-0", 600)
        # The image's non-root user, a home of its own for the caches (Hugging Face, vLLM,
        # torch), a writable /tmp (Ray's session folder), and the memory-backed /dev/shm the
        # operator mounts: the node's memory, not a runtime's 64 MB default, which breaks NCCL.
        assert seen["uid"] == tinyjob.TRAINER_UID and seen["home"] == "/home/rlkube", seen
        assert seen["shm_bytes"] >= 1024**3 and seen["shm_type"] == "tmpfs", seen
        _check_reachability(kubectl, namespace, job.name)
        final = tinyjob.wait_state(kubectl, namespace, job.name, ("Succeeded", "Failed"), 600)
        assert final["state"] == "Succeeded", final
        assert final["progress"]["step"] == STEPS
        assert len(job.metrics()) == STEPS
        assert final.get("restartCount", 0) == 0
        # A finished job lets go at once: no container of it runs again (the driver idles
        # rather than exit, which the kubelet would restart) and every pod is gone within
        # seconds, not the job's grace period (120 s).
        seen = _pods_until_gone(kubectl, namespace, job.name, final["completionTime"], FINISHED_WITHIN)
        restarted = {
            f"{p['metadata']['name']}/{c['name']}": c["restartCount"]
            for p in seen
            for c in p["status"].get("containerStatuses") or []
            if c.get("restartCount")
        }
        assert not restarted, f"containers restarted after the job succeeded: {restarted}"
        # Its log and curves stay readable from its volume.
        log = _plugin(kubeconfig, "-n", namespace, "logs", job.name)
        assert log.returncode == 0 and f"step {STEPS} " in log.stdout, log.stderr
        png = tmp_path / "curves.png"
        curves = _plugin(kubeconfig, "-n", namespace, "curves", job.name, "-o", str(png))
        assert curves.returncode == 0, curves.stderr
        assert f"{STEPS} steps, 1 to {STEPS}" in curves.stdout
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        role = _plugin(kubeconfig, "-n", namespace, "logs", job.name, "--role", "actor")
        assert role.returncode == 1 and role.stderr.count("error") == 1 and "is Succeeded" in role.stderr
        _agent_comes_back(real_cluster.nodes[1])


def _agent_comes_back(node: RealNode) -> None:
    """The NetworkPolicy agent killed (after the job, which a fail-closed gap could slow), its
    supervisor starts it again and it loads its rules anew."""
    log = node.logs_dir / f"{network_policies.NAME}.log"
    synced = log.read_text().count(SYNCED)
    real_node_kit.kill_daemon(node, find_node_binaries().network_policies)
    wait_for(lambda: log.read_text().count(SYNCED) > synced, "the restarted agent to load its rules", 60)
    assert node.enforcing()


# The job's ports on its controller pod: Ray's GCS, Ray's client server (`ray start --head`
# opens it) and the driver's metrics.
RAY_CLIENT_PORT = 10001
JOB_PORTS = [RAY_PORT, RAY_CLIENT_PORT, DRIVER_METRICS_PORT]
# A connection that met the pod: accepted, or refused by the pod's own kernel (nothing listens
# yet). The agent never refuses: what it denies it drops, and the connect times out.
REACHED = ("open", "refused")
# The namespace the job names as its monitoring one, and another where nothing is allowed.
MONITORING, ELSEWHERE = "tiny-monitoring", "tiny-elsewhere"
# Probe pods: (namespace or None for the job's own, name, node). The job's controller runs on
# node 1: the probe there reaches it across the node's bridge, the others through the routes
# between the nodes.
PROBES = [(ELSEWHERE, "elsewhere", 1), (None, "neighbour", 0), (MONITORING, "monitor", 0)]


def _start_probes(kubectl: Kubectl, namespace: str, image: str) -> None:
    """The probe pods, started with the job so they are up by the time its ports are."""
    for other in (MONITORING, ELSEWHERE):
        kubectl("create", "namespace", other, check=False)  # a second run finds it
        kubectl("label", "namespace", other, "pod-security.kubernetes.io/enforce=restricted")
    for where, name, node in PROBES:
        pod = real_node_kit.probe_pod(name, image, node)
        kubectl("-n", where or namespace, "apply", "-f", "-", input=json.dumps(pod))


def _check_reachability(kubectl: Kubectl, namespace: str, job: str) -> None:
    """The job's NetworkPolicy, as the nodes' agent enforces it: the job's own pods reach its
    controller's ports (an actor, from the other node); a pod of the job's namespace without
    the job's labels and a pod of another namespace reach none of them (their connections
    time out); the monitoring namespace reaches the metrics port only."""
    started = time.monotonic()
    own: dict[int, str] = {}
    ip = ""

    def own_actor_reaches() -> bool:
        nonlocal ip
        # Read each time: on a loaded machine the gang may restart, with new pods and addresses.
        ip = kubectl("-n", namespace, "get", "pod", f"{job}-controller-0", "-o", "jsonpath={.status.podIP}").stdout
        try:
            own.update(real_node_kit.reach(kubectl, namespace, f"{job}-actor-0", ip, JOB_PORTS, "trainer"))
        except AssertionError:  # the actor is not (or no longer) running
            return False
        # Ray's head serves both its ports; the driver's metrics may still be starting.
        return own[RAY_PORT] == own[RAY_CLIENT_PORT] == "open" and own[DRIVER_METRICS_PORT] in REACHED

    try:
        wait_for(own_actor_reaches, "Ray's ports open to the job's own actor", 600, interval=1)
    except AssertionError as error:
        raise AssertionError(f"{error}; last seen {own}") from None
    waited, started = time.monotonic() - started, time.monotonic()
    for where, name, _node in PROBES:

        def running(where: str = where or namespace, name: str = name) -> bool:
            pod = kubectl("-n", where, "get", "pod", name, "-o", "jsonpath={.status.phase}")
            return pod.stdout == "Running"

        wait_for(running, f"probe pod {name}", 60, interval=0.5)
        seen = real_node_kit.reach(kubectl, where or namespace, name, ip, JOB_PORTS)
        reached = {port for port, verdict in seen.items() if verdict in REACHED}
        blocked = {port for port, verdict in seen.items() if verdict == "timeout"}
        allowed = {DRIVER_METRICS_PORT} if where == MONITORING else set()
        assert reached == allowed and blocked == set(JOB_PORTS) - allowed, f"from {where or namespace}/{name}: {seen}"
    print(
        f"Ray's ports open to the job's actor after {waited:.1f} s; the probes took {time.monotonic() - started:.1f} s"
    )
    for where, name, _node in PROBES:
        kubectl("-n", where or namespace, "delete", "pod", name, "--wait=false", "--grace-period=0", check=False)


# The agent's log line once its caches are synced, just before it writes its rules.
SYNCED = "Caches are synced for kube-network-policies"
# After a job's end (its completionTime), every pod of it is gone within this many seconds.
FINISHED_WITHIN = 15.0


def _pods_until_gone(kubectl: Kubectl, namespace: str, job: str, completed: str, within: float) -> list[dict[str, Any]]:
    """Every observation of the job's pods from now until none is left (polled 4 times a second);
    fails if any is still there `within` seconds after `completed` (whole seconds, so the bound
    is kept with up to a second to spare)."""
    deadline = datetime.fromisoformat(completed.replace("Z", "+00:00")).timestamp() + within
    seen: list[dict[str, Any]] = []
    while True:
        pods = json.loads(kubectl("-n", namespace, "get", "pods", "-l", f"{LABEL_JOB}={job}", "-o", "json").stdout)
        seen += pods["items"]
        if not pods["items"]:
            return seen
        left = {
            p["metadata"]["name"]: (
                p["metadata"].get("deletionTimestamp"),
                p["metadata"].get("deletionGracePeriodSeconds"),
                [c.get("state") for c in p["status"].get("containerStatuses") or []],
            )
            for p in pods["items"]
        }
        assert time.time() < deadline, f"pods still there {within:.0f}s after the job ended: {left}"
        time.sleep(0.25)
