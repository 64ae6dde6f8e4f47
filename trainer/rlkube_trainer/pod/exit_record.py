"""The record a trainer container leaves as it exits non-zero: an entry, under its own pod's
UID, in the job's exit-record ConfigMap (`<job>-exits`; the exit code in the
`rlkube.dev/exit-code` annotation, the message as in the termination message, shaped as an
Event about its pod with reason `TrainerExited`).

The container's termination message already carries both, but only as long as the pod
exists: a pod that failed while no operator watched is deleted and replaced by its
StatefulSet, and the next operator would see only that a member was replaced. The ConfigMap
outlives the pod, so the operator can still classify the failure by its exit code (a
configuration error fails the job instead of restarting it) and name it.

Why not an Event (as before): the right to create Events cannot be narrowed by name or
content, so a pod allowed to post its own could post one about another job's pod and steer
how that job's failure is judged. The job's Role grants `patch` on this one ConfigMap only,
by name: only the job's own ServiceAccount can write its records, and the job's pods hold no
right to create Events at all.

Best effort and bounded: a container that is exiting must not hang on an API server that
does not answer.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlkube_api.event_message import fit_event_message
from rlkube_api.names import ANNOTATION_EXIT_CODE, EVENT_TRAINER_EXITED, Env, exit_records_name
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
    """Writes the exit record when running in a pod the operator made (its job, name, UID
    and namespace in the environment, a ServiceAccount token mounted); True if it was
    stored. Outside a pod, or on any error, nothing is written and the exit goes on. A
    container restarted in place that exits again replaces its pod's record: the latest exit
    counts."""
    env = os.environ if env is None else env
    pod, uid, namespace = env.get(Env.POD_NAME), env.get(Env.POD_UID), env.get(Env.NAMESPACE)
    job = env.get(Env.JOB_NAME)
    if not (pod and uid and namespace and job):
        return False
    try:
        core = pod_core_api(env, sa_dir, api)
        if core is None:
            return False
        body = exit_event(code, message, pod, uid, namespace, datetime.now(UTC))
        # A strategic-merge patch adds (or replaces) this pod's key and leaves the others.
        core.patch_namespaced_config_map(
            exit_records_name(job), namespace, {"data": {uid: json.dumps(body)}}, _request_timeout=REQUEST_TIMEOUT
        )
    except Exception as exc:
        log.warning("could not record the exit (code %d) of pod %s/%s: %s", code, namespace, pod, exc)
        return False
    return True
