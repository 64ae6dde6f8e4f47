"""The record a trainer container leaves as it exits non-zero: a Warning Event about its own
pod (reason `TrainerExited`, the exit code in the `rlkube.dev/exit-code` annotation, the
message as in the termination message).

The container's termination message already carries both, but only as long as the pod
exists: a pod that failed while no operator watched is deleted and replaced by its
StatefulSet, and the next operator would see only that a member was replaced. An Event is an
object of its own (kept an hour by default, `--event-ttl`), found by the pod's UID, so the
operator can still classify the failure by its exit code (a configuration error fails the job
instead of restarting it) and name it. The operator's Role for the job grants `create` on
events; nothing else here needs more.

Best effort and bounded: a container that is exiting must not hang on an API server that
does not answer.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlkube_api.event_message import fit_event_message
from rlkube_api.names import ANNOTATION_EXIT_CODE, EVENT_TRAINER_EXITED, Env
from rlkube_trainer.loop.progress import pod_core_api

if TYPE_CHECKING:
    from kubernetes import client

log = logging.getLogger("rlkube.trainer.exit")

# The Event's reportingComponent and source: what `kubectl describe pod` shows as "From".
COMPONENT = "rlkube-trainer"
# Seconds for the one request (connect and read): the container is on its way out.
REQUEST_TIMEOUT = 5.0


def exit_event(code: int, message: str, pod: str, pod_uid: str, namespace: str, now: datetime) -> dict[str, Any]:
    """The core/v1 Event that records `pod` exiting with `code`."""
    stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {
            # Unique per exit: a container restarted in place may exit again.
            "name": f"{pod}.{EVENT_TRAINER_EXITED.lower()}.{now.strftime('%Y%m%d%H%M%S%f')}",
            "namespace": namespace,
            "annotations": {ANNOTATION_EXIT_CODE: str(int(code))},
        },
        "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": pod, "namespace": namespace, "uid": pod_uid},
        "type": "Warning",
        "reason": EVENT_TRAINER_EXITED,
        "message": fit_event_message(message),
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
        "reportingInstance": pod,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }


def record_exit(
    code: int,
    message: str,
    env: Mapping[str, str] | None = None,
    sa_dir: Path | None = None,
    api: client.ApiClient | None = None,
) -> bool:
    """Posts the exit Event when running in a pod the operator made (its name, UID and
    namespace in the environment, a ServiceAccount token mounted); True if it was stored.
    Outside a pod, or on any error, nothing is posted and the exit goes on."""
    env = os.environ if env is None else env
    pod, uid, namespace = env.get(Env.POD_NAME), env.get(Env.POD_UID), env.get(Env.NAMESPACE)
    if not (pod and uid and namespace):
        return False
    try:
        events = pod_core_api(env, sa_dir, api)
        if events is None:
            return False
        body = exit_event(code, message, pod, uid, namespace, datetime.now(UTC))
        # The client serialises a plain dict as it would its own model.
        events.create_namespaced_event(namespace, body, _request_timeout=REQUEST_TIMEOUT)  # type: ignore[arg-type]
    except Exception as exc:
        log.warning("could not record the exit (code %d) as an Event on pod %s/%s: %s", code, namespace, pod, exc)
        return False
    return True
