"""A role's parallel layout: the ranks of each group and the pod of each rank, the same order as
the device mesh the trainer builds (pp outermost, tp innermost)."""

from __future__ import annotations

import copy

import pytest
import torch

from rlkube_api.layout import MESH_DIMS, ParallelLayout
from rlkube_api.placement import Role, placement_of
from rlkube_api.validation import parse_rljob
from tests.api.cases import base_job


def test_tp2_pp2_dp2_groups_on_pods_of_two_gpus() -> None:
    layout = ParallelLayout(8, procs_per_pod=2, tp=2, pp=2)
    assert layout.dp == 2
    assert layout.groups("tp") == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert layout.groups("dp") == [(0, 2), (1, 3), (4, 6), (5, 7)]
    assert layout.groups("pp") == [(0, 4), (1, 5), (2, 6), (3, 7)]
    # Each tensor-parallel group in one pod; the two stages of a pipeline on different pods.
    assert all(len(layout.pods_of(g)) == 1 for g in layout.groups("tp"))
    assert layout.pods_of(layout.group_of("pp", 0)) == (0, 2)
    assert layout.describe() == "tp2×pp2×dp2"


@pytest.mark.parametrize(("tp", "pp", "sp", "world"), [(1, 1, 1, 4), (2, 1, 1, 4), (2, 2, 2, 16), (1, 2, 2, 8)])
def test_layout_numbers_ranks_as_the_device_mesh_does(tp: int, pp: int, sp: int, world: int) -> None:
    """init_device_mesh lays the world out as arange(world).reshape(shape): the groups along a
    dimension are the mesh's slices along it."""
    layout = ParallelLayout(world, procs_per_pod=tp, tp=tp, pp=pp, sp=sp)
    mesh = torch.arange(world).reshape(layout.shape)
    for axis, dim in enumerate(MESH_DIMS):
        slices = {tuple(row.tolist()) for row in mesh.movedim(axis, -1).reshape(-1, layout.size(dim))}
        assert set(layout.groups(dim)) == slices, dim
        assert sorted(r for g in layout.groups(dim) for r in g) == list(range(world))
    for rank in range(world):
        assert layout.rank_at(layout.coords(rank)) == rank


def test_a_layout_that_does_not_divide_the_world_is_refused() -> None:
    with pytest.raises(ValueError, match="does not divide"):
        ParallelLayout(6, tp=4)


def test_placement_gives_each_group_its_declared_layout() -> None:
    job = copy.deepcopy(base_job())
    job["spec"]["roles"]["actor"].update(
        {"tensorParallelSize": 2, "pipelineParallelSize": 2, "virtualPipelineParallelSize": 2, "fsdpSize": 4}
    )
    placement = placement_of(parse_rljob(job).spec.trainer_config())
    actor = placement.group(Role.ACTOR)
    assert actor.layout is not None and actor.layout.describe() == "tp2×pp2v2×dp4"
    rollout = placement.group(Role.ROLLOUT).layout
    assert rollout is not None and rollout.describe() == "tp2×dp4"
