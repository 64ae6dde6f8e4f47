"""The end of a successful run in a pod: the driver records it on its own pod and stays up, idle.

A StatefulSet's pods restart every container that exits, whatever its code (restartPolicy
Always is the only policy a StatefulSet allows). A driver that exited 0 would be started again
at once: a second Ray head, a second run resuming from the last checkpoint, role pods that
wait for their driver through their whole grace period. So once the run has ended and its last
checkpoint is written, the driver merge-patches `rlkube.dev/run-finished` onto its pod (the
operator's Role for the job grants exactly patch on that pod), disconnects from Ray (its rank
actors end and free their memory) and waits for the SIGTERM of the operator's deletion, which
it answers with exit 0 at once: nothing is left to save.

Where the annotation cannot be written (no API access, say), the driver exits 0 as before: the
operator still reads the success from the exit code, and deletes the pods right after.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, NoReturn

from rlkube_api.names import ANNOTATION_RUN_FINISHED, Env
from rlkube_trainer.loop.progress import FIELD_MANAGER, pod_core_api

if TYPE_CHECKING:
    from kubernetes import client

log = logging.getLogger("rlkube.trainer.finished")

# Seconds for each request (connect and read), and the waits between the tries.
REQUEST_TIMEOUT = 5.0
RETRY_WAITS = (1.0, 2.0)


def record_finished(
    env: Mapping[str, str] | None = None,
    sa_dir: Path | None = None,
    api: client.ApiClient | None = None,
    now: datetime | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> bool:
    """Annotates this pod with the run's end (a few tries); True once the API server stored it.
    Outside a pod the operator made, or when every try fails, False: the caller exits instead."""
    env = os.environ if env is None else env
    pod, namespace = env.get(Env.POD_NAME), env.get(Env.NAMESPACE)
    if not (pod and namespace):
        return False
    try:
        core = pod_core_api(env, sa_dir, api)
    except Exception as exc:
        log.warning("cannot record the finished run on pod %s/%s: %s", namespace, pod, exc)
        return False
    if core is None:
        return False
    stamp = (now or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")
    patch = {"metadata": {"annotations": {ANNOTATION_RUN_FINISHED: stamp}}}
    for wait in (0.0, *RETRY_WAITS):
        sleep(wait)
        try:
            core.patch_namespaced_pod(
                pod,
                namespace,
                patch,
                field_manager=FIELD_MANAGER,
                _request_timeout=REQUEST_TIMEOUT,
                _content_type="application/merge-patch+json",
            )
            return True
        except Exception as exc:
            log.warning("could not record the finished run on pod %s/%s: %s", namespace, pod, exc)
    return False


def _exit_at_once(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(0)


def idle_until_stopped(pause: Callable[[], object] = signal.pause) -> NoReturn:
    """Waits for SIGTERM (the operator deleting the finished job's pods) and exits 0 on it. The
    Ray head started beside this process stays up until the container ends, so the role pods'
    Ray nodes never see their head go before they are told to stop."""
    import ray  # noqa: PLC0415

    ray.shutdown()  # the driver's rank actors end with its connection
    signal.signal(signal.SIGTERM, _exit_at_once)
    log.info("the run has finished: waiting for the operator to delete the job's pods")
    while True:
        pause()
