"""Does the job fit its GPUs? The memory estimate per rank (rlkube_api.fit) of each role against
the GPU memory of its nodes: spec.fit.gpuMemoryMiB, or the smallest `nvidia.com/gpu.memory` label
(NVIDIA GPU feature discovery, in MiB) among the nodes its pool selects. Pure: the nodes' labels
are passed in."""

from __future__ import annotations

from collections.abc import Callable

from rlkube_api.fit.estimate import GIB, estimate
from rlkube_api.layout import Dim
from rlkube_api.placement import placement_of
from rlkube_api.rljob import RLJob
from rlkube_api.roles import Pool, roles_with_pods

GPU_MEMORY_LABEL = "nvidia.com/gpu.memory"
MIB = 2**20


def pool_gpu_memory_mib(pool: Pool | None, nodes: list[dict[str, str]]) -> int | None:
    """The smallest GPU memory label among the nodes the pool's nodeSelector selects (None when
    none of them says). Affinity is not evaluated: the selector decides."""
    selector = (pool.node_selector if pool else None) or {}
    sizes = []
    for labels in nodes:
        if all(labels.get(k) == v for k, v in selector.items()) and labels.get(GPU_MEMORY_LABEL, "").isdigit():
            sizes.append(int(labels[GPU_MEMORY_LABEL]))
    return min(sizes, default=None)


def fit_refusals(job: RLJob, nodes: Callable[[], list[dict[str, str]]]) -> tuple[str, ...]:
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


def format_plan(job: RLJob, gpu_memory_mib: int | None) -> str:
    """`kubectl rlkube plan`: each role's layout, where its groups sit, and its memory per rank."""
    fit = job.spec.fit
    dims = fit.dimensions() if fit else None
    mib = gpu_memory_mib or (fit.gpu_memory_mib if fit else None)
    placement = placement_of(job.spec.trainer_config())
    lines = [f"RLJob {job.metadata.name}"]
    for group in placement.groups:
        layout = group.layout
        if layout is None:
            continue
        hosted = ", ".join(sorted(r.value for r in group.hosts if r != group.name))
        lines.append(
            f"  {group.name.value}: {layout.describe()} on {group.pods.replicas} pod(s) × {group.procs_per_pod} "
            f"rank(s)" + (f" (hosts {hosted})" if hosted else "")
        )
        named: tuple[tuple[Dim, str], ...] = (("tp", "tensor"), ("pp", "pipeline"), ("sp", "sequence"))
        for dim, what in named:
            if layout.size(dim) > 1:
                first = layout.groups(dim)[0]
                lines.append(
                    f"    {what}-parallel groups of {len(first)}: ranks {list(first)} on pods {list(layout.pods_of(first))}, ..."
                )
    if dims is None:
        lines.append("  memory: set spec.fit.modelArchitecture or spec.fit.modelDimensions for an estimate")
        return "\n".join(lines)
    if mib is None:
        lines.append("  memory: give --gpu-memory-mib or spec.fit.gpuMemoryMiB for an estimate")
        return "\n".join(lines)
    lines.append(f"  memory per rank on GPUs of {mib / 1024:.1f} GiB ({dims.parameters / 1e9:.2f} B parameters):")
    for role_estimate in estimate(job.spec.trainer_config(), dims, mib * MIB):
        for phase in role_estimate.phases:
            lines.append(
                f"    {role_estimate.role.value} {phase.name}: {phase.total / GIB:.1f} GiB ({phase.describe()})"
            )
        lines += [f"    {role_estimate.role.value}: {note}" for note in role_estimate.notes]
        refusal = role_estimate.refusal(mib * MIB)
        lines.append(f"    {role_estimate.role.value}: " + ("fits" if refusal is None else f"DOES NOT FIT: {refusal}"))
    return "\n".join(lines)
