"""Pipeline parallelism (torch.distributed.pipelining) trains as one rank does, through the
actor's and the critic's own update and forward-only code (workers.builders; FSDP2 per stage,
fp32, gloo): a tiny 4-layer Llama with tied embeddings (the LM head on the last stage and the
embeddings on the first share one weight) under roles.<role>.pipelineParallelSize 2 (1F1B)
and 2 × virtualPipelineParallelSize 2 (interleaved 1F1B, one layer a stage), and stages whose
decoder layers are tensor parallel (tensorParallelSize 2 × pipelineParallelSize 2 on 4 ranks:
DTensor projections over the mesh's "tp" dimension inside each stage; with RLKUBE_PARITY_8_RANKS=1
also × data parallel 2 on 8 ranks, each update's metrics the mean over the ranks as the driver
reports them), the actor's policy
loss with its entropy term and the critic's value loss on the last stage. The old log-probs and
values, each update's loss and gradient norm, the first optimizer step's gradients, the
weights after three updates (one optimizer step each) and the whole model the rollout receives from every rank match the
single rank's.

Tolerances: forward passes, losses and gradient norms 1e-5 absolute or 1e-4 relative;
gradients 1e-5; weights 1e-4 after three AdamW steps at lr 3e-3 (a wrong gradient moves a
weight by about lr a step). Measured on an earlier form of the same run (two mini-batches an
update): log-probs 2e-7, gradients 7e-8, weights 7e-6 apart."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from rlkube_trainer.parallel.pipeline import PipelineLayoutError, micro_batch_rows, stage_layers, stages_of_rank
from rlkube_trainer.tiny.task import build_model

sys.path.insert(0, str(Path(__file__).parent))

# The last stage's LM head is the tied embedding, one parameter (listed once) without a pipeline.
TIED = {"lm_head.weight": "model.embed_tokens.weight"}


@pytest.mark.trainer
def test_stages_divide_the_layers_evenly_or_are_refused() -> None:
    assert stage_layers(4, 2, None, "actor") == [range(0, 2), range(2, 4)]
    assert stage_layers(8, 2, 2, "actor") == [range(0, 2), range(2, 4), range(4, 6), range(6, 8)]
    assert stages_of_rank(1, 2, 2) == [1, 3]
    with pytest.raises(
        PipelineLayoutError,
        match=r"roles\.critic\.pipelineParallelSize 2 × virtualPipelineParallelSize 2 = 4 stages do not divide the model's 6 decoder layers",
    ):
        stage_layers(6, 2, 2, "critic")
    # Micro-batches of one shape: the largest divisor of the rows not above the size asked for.
    assert [micro_batch_rows(8, 3), micro_batch_rows(6, 4), micro_batch_rows(5, 2), micro_batch_rows(2, 4)] == [
        2,
        3,
        1,
        2,
    ]


ROLES_PROBE = Path(__file__).with_name("pipeline_roles_probe.py")
# name: (ranks, pipelineParallelSize, virtualPipelineParallelSize, tensorParallelSize)
ROLE_LAYOUTS = {"one": (1, 1, None, 1), "pp2": (2, 2, None, 1), "pp2v2": (2, 2, 2, 1), "tp2pp2": (4, 2, None, 2)}
# Tensor parallel 2 × pipeline parallel 2 × data parallel 2 (8 ranks, FSDP2 over the data ranks of
# each tensor-parallel stage) passes the same checks, but 8 gloo processes on 2 cores took this
# module from 135 s to 248 s: it runs with RLKUBE_PARITY_8_RANKS=1. Its mini-batch's 16 samples
# are then 2 a rank (the batch rules count every rank), so every layout runs micro-batches of 2:
# one rank's micro-batches are the data replicas' pooled ones, and the means of their metrics agree.
EIGHT_RANKS = os.environ.get("RLKUBE_PARITY_8_RANKS") == "1"
if EIGHT_RANKS:
    ROLE_LAYOUTS["tp2pp2dp2"] = (8, 2, None, 2)


@pytest.fixture(scope="module")
def role_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    """The real Actor and Critic (workers.builders, FSDP2, fp32) under each layout, one start of
    the processes for all; each rank's results."""
    import yaml  # noqa: PLC0415
    from fsdp_probe import free_port  # noqa: PLC0415
    from test_model_parallel import config_for  # noqa: PLC0415

    workdir = tmp_path_factory.mktemp("pipeline-roles")
    build_model(workdir / "model", layers=4)
    (workdir / "data").mkdir()
    (workdir / "data" / "train.parquet").touch()  # the config names it; the probe reads no data
    (workdir / "reward.py").touch()
    arguments = []
    for name, (ranks, pipeline, virtual, tensor) in ROLE_LAYOUTS.items():
        raw = config_for(workdir, ranks, tensor, 1)
        sizes = {"pipeline_parallel_size": pipeline, "virtual_pipeline_parallel_size": virtual}
        raw["roles"]["actor"].update(sizes)
        raw["roles"]["critic"].update(sizes)
        raw["actor"]["entropy_coeff"] = 0.01  # the last stage's entropy in the loss, too
        if EIGHT_RANKS:
            raw["actor"]["ppo_micro_batch_size_per_gpu"] = raw["critic"]["ppo_micro_batch_size_per_gpu"] = 2
        (workdir / name).mkdir()
        (workdir / name / "config.yaml").write_text(yaml.safe_dump(raw))
        arguments += [str(workdir / name / "config.yaml"), str(free_port())]
    result = subprocess.run(
        [sys.executable, str(ROLES_PROBE), *arguments], capture_output=True, text=True, timeout=600, check=False
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return {
        name: [torch.load(workdir / name / f"rank_{r}.pt") for r in range(ranks)]
        for name, (ranks, *_) in ROLE_LAYOUTS.items()
    }


@pytest.mark.trainer
@pytest.mark.parametrize("layout", [name for name in ROLE_LAYOUTS if name != "one"])
def test_pipelined_actor_and_critic_train_as_one_rank(role_runs: dict[str, list[dict[str, Any]]], layout: str) -> None:
    """Through the roles' own update and forward-only code: old log-probs and values, each
    update's loss and gradient norm, the first step's gradients, the weights after three
    updates (a stage's on its rank), and the full weights the rollout receives from every rank."""
    (one,) = role_runs["one"]
    for rank in role_runs[layout]:
        torch.testing.assert_close(rank["old_log_probs"], one["old_log_probs"], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(rank["values"], one["values"], rtol=1e-4, atol=1e-5)
        for role, loss in (("actor", "actor/pg_loss"), ("critic", "critic/vf_loss")):
            for mine, single in zip(rank[role], one[role], strict=True):
                for key in (loss, f"{role}/grad_norm"):
                    assert mine[key] == pytest.approx(single[key], abs=1e-5, rel=1e-4), (role, key)
            for kind, tolerance in (("grads", 1e-5), ("weights", 1e-4)):
                for name, tensor in rank[f"{role}_{kind}"].items():
                    want = one[f"{role}_{kind}"][TIED.get(name, name) if name not in one[f"{role}_{kind}"] else name]
                    torch.testing.assert_close(tensor, want, rtol=0, atol=tolerance, msg=f"{role} {kind} {name}")
        # The rollout gets the whole model from every rank, not the rank's stages.
        assert rank["actor_weights"].keys() == one["actor_weights"].keys()
        for name, weight in rank["actor_weights"].items():
            torch.testing.assert_close(weight, one["actor_weights"][name], rtol=0, atol=1e-4, msg=name)
    # Each rank holds its stages only: the first rank the first stage, the last rank the last
    # (pipeline outermost in the mesh, its tensor-parallel peers between them).
    layers = [{n for n in rank["actor_own_weights"] if ".layers." in n} for rank in role_runs[layout]]
    assert layers[0] and layers[-1] and not layers[0] & layers[-1]


@pytest.mark.trainer
def test_what_a_pipeline_cannot_run_is_refused_naming_the_fields() -> None:
    from types import SimpleNamespace  # noqa: PLC0415

    from rlkube_trainer.parallel.layout import LayoutError, ParallelLayout  # noqa: PLC0415
    from rlkube_trainer.workers.pipelined import check_pipelined  # noqa: PLC0415

    def mesh(**sizes: int) -> Any:
        return SimpleNamespace(layout=ParallelLayout.of("actor", 4, **sizes))

    fields = ("model.use_remove_padding", "actor.use_dynamic_bsz")
    check_pipelined(mesh(pipeline=2), False, False, *fields)
    with pytest.raises(
        LayoutError, match=r"roles\.actor\.pipelineParallelSize 2 runs padded .* set model\.use_remove_padding false"
    ):
        check_pipelined(mesh(pipeline=2), True, False, *fields)
    with pytest.raises(
        LayoutError,
        match=r"roles\.actor\.pipelineParallelSize 2 runs micro-batches of one size: set actor\.use_dynamic_bsz false",
    ):
        check_pipelined(mesh(pipeline=2), False, True, *fields)
    check_pipelined(mesh(pipeline=2, tensor=2), False, False, *fields)  # tensor-parallel stages run
    with pytest.raises(
        LayoutError, match=r"roles\.actor\.pipelineParallelSize 2 runs with ulyssesSequenceParallelSize 1"
    ):
        check_pipelined(mesh(pipeline=2, sequence=2), False, False, *fields)
