"""The fetch of model.uri and data.uri, as the job's status tells it: the Initialized
condition, from the controller pod's fetch init containers (children/fetch.py), and whether a
fetch failed in a way that running it again cannot fix (the trainer's permanent exit classes:
a missing key or bucket, bad credentials, a full volume), which fails the job naming the uri.
Pure: the pods are observed elsewhere."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rlkube_api.exit_codes import exit_class
from rlkube_api.names import CONTROLLER_ROLE
from rlkube_api.rljob import RLJob
from rlkube_operator.children.fetch import fetches
from rlkube_operator.observed import PodView

FETCHING = "Fetching"
FETCHED = "Fetched"
FETCH_FAILED = "FetchFailed"


@dataclass(frozen=True)
class Initialization:
    status: Literal["True", "False"]
    reason: str
    message: str
    # The fetch cannot succeed: the job fails with this reason and message.
    failed: bool = False


def initialization(job: RLJob, pods: list[PodView]) -> Initialization | None:
    """Where the fetch of the job's sources stands in the current controller pod; None for a
    job with nothing to fetch, or while no controller pod is there to tell."""
    wanted = fetches(job)
    controller = next((pod for pod in pods if pod.role == CONTROLLER_ROLE), None)
    if not wanted or controller is None:
        return None
    by_name = {c.name: c for c in controller.init_containers}
    for fetch in wanted:
        container = by_name.get(fetch.fetch_name)
        if container is not None and container.state == "terminated" and container.exit_code == 0:
            continue
        if container is not None and container.exit_code not in (None, 0):
            said = f"{fetch.field} {fetch.uri}: exit code {container.exit_code}: {container.message.strip() or 'no message'}"
            found = exit_class(container.exit_code)
            if found is not None and found.permanent:
                return Initialization("False", FETCH_FAILED, f"the fetch of {said}", failed=True)
            return Initialization("False", FETCHING, f"fetching again after {said}")
        return Initialization("False", FETCHING, f"fetching {fetch.field} {fetch.uri} into {fetch.dest}")
    return Initialization("True", FETCHED, "; ".join(f"{f.field} {f.uri} is in {f.dest}" for f in wanted))
