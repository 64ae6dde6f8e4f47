"""How a pod's ranks find their pod in Ray: each role pod is a Ray node advertising one custom
resource named for its group and pod index (`rlkube_<group>_<pod index>`), with one unit per rank
it runs; a rank asks for one unit of its pod's resource. The pod side advertises these names
(pod/ray_node.py), the driver's rank groups ask for them (cluster/ray_group.py).
"""

from __future__ import annotations

from rlkube_api.placement import Placement


def resource_name(group: str, pod_index: int) -> str:
    """The Ray resource a role pod advertises; the ranks of that pod ask for it."""
    return f"rlkube_{group}_{pod_index}"


def pod_of_resource(group: str, name: str) -> int | None:
    """The pod index in a resource name `resource_name(group, index)` (None: another's)."""
    prefix = resource_name(group, 0)[:-1]
    tail = name.removeprefix(prefix)
    return int(tail) if tail != name and tail.isdigit() else None


def node_resources(placement: Placement) -> dict[str, float]:
    """Every pod's resource, with one unit per rank it runs."""
    return {resource_name(g.name, i): float(g.procs_per_pod) for g in placement.groups for i in range(g.pods.replicas)}
