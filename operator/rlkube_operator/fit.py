"""Does the job fit its GPUs? The memory estimate per rank (rlkube_api.fit) of each role against
the GPU memory of its nodes: spec.fit.gpuMemoryMiB, or the smallest `nvidia.com/gpu.memory` label
(NVIDIA GPU feature discovery, in MiB) among the nodes its pool selects. Pure: the nodes' labels
are passed in."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from rlkube_api.fit.estimate import estimate
from rlkube_api.rljob import RLJob
from rlkube_api.roles import Pool, roles_with_pods

GPU_MEMORY_LABEL = "nvidia.com/gpu.memory"
MIB = 2**20


def pool_gpu_memory_mib(pool: Pool | None, nodes: list[Mapping[str, str]]) -> int | None:
    """The smallest GPU memory label among the nodes the pool's nodeSelector selects (None when
    none of them says). Affinity is not evaluated: the selector decides."""
    selector = (pool.node_selector if pool else None) or {}
    sizes = []
    for labels in nodes:
        if all(labels.get(k) == v for k, v in selector.items()) and labels.get(GPU_MEMORY_LABEL, "").isdigit():
            sizes.append(int(labels[GPU_MEMORY_LABEL]))
    return min(sizes, default=None)


def fit_refusals(job: RLJob, nodes: Callable[[], list[Mapping[str, str]]]) -> tuple[str, ...]:
    """Why each GPU role cannot fit, with the numbers; empty when it fits or nothing is known (no
    spec.fit model, or no GPU memory stated or labelled). `nodes` lists the cluster's node labels;
    it is called only when spec.fit does not state the GPU memory."""
    fit = job.spec.fit
    dims = fit.dimensions() if fit else None
    if fit is None or dims is None:
        return ()
    labels = [] if fit.gpu_memory_mib else nodes()
    config = job.spec.trainer_config()
    out = []
    for pods in roles_with_pods(job.spec.roles):
        mib = fit.gpu_memory_mib or pool_gpu_memory_mib(pods.pool, labels)
        if mib is None or pods.gpus_per_replica == 0:
            continue
        # The engine's share is a fraction of the GPU's memory: estimated at this pool's size.
        mine = [e for e in estimate(config, dims, mib * MIB) if e.role.value == pods.name]
        out += [r for e in mine if (r := e.refusal(mib * MIB)) is not None]
    return tuple(out)
