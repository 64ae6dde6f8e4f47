"""This pod's place in the Ray cluster the ranks run on: each role pod is a Ray node advertising
its pod's resource (cluster/ray_resources.py), the controller pod is the head. Locally
(`rlkube-trainer run`) one Ray on this machine advertises every pod's resource.
"""

from __future__ import annotations

import logging
import os
import shlex
import socket
import subprocess
import time

import ray

from rlkube_api.names import RAY_START_ARGS_ENV, Env
from rlkube_api.placement import Placement
from rlkube_trainer.cluster.ray_resources import node_resources, resource_name
from rlkube_trainer.loop.termination import TERMINATION

log = logging.getLogger("rlkube.trainer")
# How long a role pod keeps trying to reach the Ray head.
JOIN_TIMEOUT = 600.0


def start_local_ray(placement: Placement, attempts: int = 3) -> None:
    """A Ray on this machine with every pod's resources, for `rlkube-trainer run`.

    Ray gives its raylet a fixed 30 s to register; on a loaded 2-core machine that is
    sometimes not enough, so the start is retried."""
    for attempt in range(1, attempts + 1):
        try:
            ray.init(
                # A new Ray of its own even when another one runs here (ray.init would join it).
                address="local",
                resources=node_resources(placement),
                include_dashboard=False,
                configure_logging=False,
                log_to_driver=True,
            )
            return
        except Exception as exc:  # Ray raises a bare Exception for this
            if "timed out during startup" not in str(exc) or attempt == attempts:
                raise
            log.warning("local Ray did not start (%s); retrying (%d/%d)", exc, attempt, attempts)
            ray.shutdown()


# --- in pods ---------------------------------------------------------------------------------------


def ray_head_port() -> int:
    address = os.environ.get(Env.RAY_ADDRESS, "")
    return int(address.rsplit(":", 1)[1]) if ":" in address else 6379


def ray_start_args() -> list[str]:
    """The user's extra `ray start` flags from the environment (shell words), and the pod's
    own IP as the node address where the operator gave it."""
    pod_ip = os.environ.get(Env.POD_IP)
    return ([f"--node-ip-address={pod_ip}"] if pod_ip else []) + shlex.split(os.environ.get(RAY_START_ARGS_ENV, ""))


def start_ray_head() -> None:
    """The controller pod: a Ray head with no role resources of its own."""
    subprocess.run(
        [
            "ray",
            "start",
            "--head",
            f"--port={ray_head_port()}",
            "--num-cpus=1",
            "--num-gpus=0",
            "--include-dashboard=false",
            "--disable-usage-stats",
            *ray_start_args(),
        ],
        check=True,
    )
    ray.init(address="auto", configure_logging=False)


class NodesMissing(RuntimeError):
    """Role pods did not join the Ray head in time (ExitCode.NODES_MISSING)."""


def wait_for_nodes(placement: Placement, timeout: float) -> None:
    """Waits until every role pod has joined; names the ones that did not."""
    wanted = node_resources(placement)
    deadline = time.monotonic() + timeout
    while True:
        have = ray.cluster_resources()  # type: ignore[no-untyped-call]
        missing = sorted(name for name, amount in wanted.items() if have.get(name, 0) < amount)
        if not missing:
            return
        if time.monotonic() > deadline:
            raise NodesMissing(f"role pods did not join the Ray head within {timeout:.0f} s: {', '.join(missing)}")
        time.sleep(2)


def head_reachable(timeout: float = 1.0) -> bool:
    """Whether the Ray head this pod joins (its driver) answers on its address."""
    host, _, port = os.environ.get(Env.RAY_ADDRESS, "").rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            return True
    except (OSError, ValueError):
        return False


# How often a pod told to stop checks whether its driver has ended.
HEAD_POLL_S = 1.0


def _serve(command: list[str]) -> int:
    """Runs `ray start --block` until it ends, or, once SIGTERM asked this pod to stop, until the
    head it serves has gone: the raylet itself notices that only after Ray's GCS reconnect
    timeout (60 s), which would hold the pod that long after its driver saved and ended."""
    process = subprocess.Popen(command)
    while True:
        try:
            return process.wait(timeout=HEAD_POLL_S)
        except subprocess.TimeoutExpired:
            if TERMINATION.requested and not head_reachable():
                log.info("the Ray head has gone after SIGTERM: stopping this node")
                process.terminate()
                process.wait()
                return 128 + (TERMINATION.signum or 15)


def join_as_node(group: str, gpus: int) -> int:
    """A role pod: joins the head and advertises its group and pod index; returns when
    the head goes away (the driver ended)."""
    index = int(os.environ.get(Env.PET_NODE_RANK) or "0")
    procs = max(gpus, 1)
    resources = f'{{"{resource_name(group, index)}": {procs}}}'
    address = os.environ[Env.RAY_ADDRESS]
    command = [
        "ray",
        "start",
        f"--address={address}",
        f"--resources={resources}",
        f"--num-gpus={gpus}",
        "--disable-usage-stats",
        "--block",
        *ray_start_args(),
    ]
    log.info("joining %s as %s pod %d: %s", address, group, index, " ".join(command))
    # The head may still be starting (pods start in any order): retry the join for a while.
    deadline = time.monotonic() + JOIN_TIMEOUT
    while True:
        code = _serve(command)
        # After a SIGTERM the pod waited for its driver to end (termination.py): not again.
        if code == 0 or time.monotonic() > deadline or TERMINATION.requested:
            return code
        log.info("Ray head at %s not reachable yet (exit %d); retrying", address, code)
        time.sleep(5)
