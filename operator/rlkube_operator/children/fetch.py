"""The init containers that fetch model.uri and data.uri into the job's volume before its
trainers start (the trainer's `rlkube-trainer fetch`).

The controller pod fetches, once per source, with the source's credentials; every role pod
waits in an init container of its own until the fetch's marker names the uri, so no trainer
starts on a half-fetched folder. Why init containers rather than a Job: docs/design.md
("Fetching model and data").
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from rlkube_api.exit_codes import TERMINATION_MESSAGE_PATH
from rlkube_api.fetch_source import FetchSource
from rlkube_api.names import CONTROLLER_ROLE, SHM_DIR
from rlkube_api.rljob import RLJob

# A role pod waits this long for the controller pod's fetch, then exits and is restarted by
# the kubelet (an init container of a pod that restarts Always), waiting again.
WAIT_SECONDS = 24 * 3600
# huggingface_hub keeps its token lookup and locks under HF_HOME: the pod's own memory, not
# the (read-only or absent) home directory of the trainer image's user.
HUB_ENV = {"HF_HOME": f"{SHM_DIR}/hf-home", "HF_HUB_DISABLE_PROGRESS_BARS": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}


@dataclass(frozen=True)
class Fetch:
    """One source to fetch: its field (model.uri, data.uri), where it goes, and how."""

    field: str
    uri: str
    dest: str
    endpoint_url: str | None
    credentials_secret: str | None
    dataset: bool

    @property
    def fetch_name(self) -> str:
        return f"fetch-{self.field.split('.')[0]}"

    @property
    def wait_name(self) -> str:
        return f"wait-for-{self.field.split('.')[0]}"


def _fetch(field: str, source: FetchSource, dest: str | None, dataset: bool) -> list[Fetch]:
    if source.uri is None or dest is None:
        return []
    return [Fetch(field, source.uri, dest, source.endpoint_url, source.credentials_secret, dataset)]


def fetches(job: RLJob) -> list[Fetch]:
    """The job's sources to fetch, model first."""
    spec = job.spec
    return [
        *_fetch("model.uri", spec.model, spec.model.path, False),
        *_fetch("data.uri", spec.data, spec.data.dir, True),
    ]


def fetch_command(fetch: Fetch) -> list[str]:
    command = ["rlkube-trainer", "fetch", fetch.uri, fetch.dest]
    if fetch.endpoint_url:
        command += ["--endpoint-url", fetch.endpoint_url]
    if fetch.dataset:
        command.append("--dataset")
    return command


def fetch_init_containers(job: RLJob, role: str, trainer: dict[str, Any]) -> list[dict[str, Any]]:
    """The init containers of `role`'s pods, from the same image and mounts as `trainer` (the
    role's trainer container): the controller fetches, the roles wait."""
    common = {
        "image": trainer["image"],
        "imagePullPolicy": trainer["imagePullPolicy"],
        "volumeMounts": copy.deepcopy(trainer["volumeMounts"]),
        "securityContext": copy.deepcopy(trainer["securityContext"]),
        # The fetch's error (naming the uri) becomes the job's Failed condition.
        "terminationMessagePath": TERMINATION_MESSAGE_PATH,
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    containers = []
    for fetch in fetches(job):
        if role != CONTROLLER_ROLE:
            command = ["rlkube-trainer", "fetch", fetch.uri, fetch.dest, "--wait", str(WAIT_SECONDS)]
            containers.append({"name": fetch.wait_name, "command": command, **copy.deepcopy(common)})
            continue
        # The user's environment (a proxy, say) but not the trainer's HF_HUB_OFFLINE.
        env = {**HUB_ENV, **{e.name: e.value for e in job.spec.env or []}}
        container: dict[str, Any] = {
            "name": fetch.fetch_name,
            "command": fetch_command(fetch),
            "env": [{"name": k, "value": v} for k, v in env.items()],
            **copy.deepcopy(common),
        }
        if fetch.credentials_secret:
            container["envFrom"] = [{"secretRef": {"name": fetch.credentials_secret}}]
        if "resources" in trainer:
            container["resources"] = copy.deepcopy(trainer["resources"])
        containers.append(container)
    return containers
