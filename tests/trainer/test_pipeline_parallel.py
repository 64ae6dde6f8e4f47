"""Pipeline parallelism (torch.distributed.pipelining) over 2 gloo ranks trains as one process
does: a tiny 4-layer Llama (tied embeddings, so the LM head on the last stage and the
embeddings on the first share one weight) under the actor's policy loss (with its entropy and
KL terms) and under the critic's value loss, with 2 stages (1F1B) and with 2 virtual stages per
rank (interleaved 1F1B). Each micro-batch's loss, the gradients of the first mini-batch, the
gradient norm of every optimizer step, the weights after each update (two updates of two
mini-batches each) and the forward-only pass (old log-probs, values) match the unpipelined
run (`pipeline_probe.reference`, Trainable.update's loop).

Tolerances, all fp32: the first mini-batch's losses and gradient norm 1e-5 relative, later
ones (on weights that differ by the tolerance below) 1e-3; gradients 1e-5 × (1 + the largest gradient);
weights 1e-4 absolute, 1 % of one AdamW step at the learning rate 1e-2 (Adam divides each
gradient by its own scale, so the 1e-7 differences of near-zero gradients' summation order
show there, not in the loss); forward outputs 1e-5."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from rlkube_trainer.parallel.pipeline import PipelineLayoutError, micro_batch_rows, stage_layers, stages_of_rank
from rlkube_trainer.tiny.task import build_model

sys.path.insert(0, str(Path(__file__).parent))
from pipeline_probe import MICRO, MINI, reference

PROBE = Path(__file__).with_name("pipeline_probe.py")
PIPELINE = 2
# The last stage's LM head is the tied embedding, one parameter (listed once) without a pipeline.
TIED = {"lm_head.weight": "model.embed_tokens.weight"}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Both roles and both layouts in one start of 2 processes; the references in this one."""
    path = tmp_path_factory.mktemp("pipeline")
    model = build_model(path / "model", layers=4)
    result = subprocess.run(
        [sys.executable, str(PROBE), str(PIPELINE), str(model), str(path)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    ranks = [torch.load(path / f"rank_{r}.pt") for r in range(PIPELINE)]
    return {"ranks": ranks, "reference": {kind: reference(kind, str(model)) for kind in ("actor", "critic")}}


@pytest.mark.trainer
@pytest.mark.parametrize("kind", ["actor", "critic"])
@pytest.mark.parametrize("virtual", [1, 2])
def test_pipelined_update_matches_one_process(runs: dict[str, Any], kind: str, virtual: int) -> None:
    expected = runs["reference"][kind]
    ranks = [rank[f"{kind}-v{virtual}"] for rank in runs["ranks"]]
    assert [rank["stages"] for rank in ranks] == [stages_of_rank(r, PIPELINE, virtual) for r in range(PIPELINE)]
    held: dict[str, list[str]] = {}
    for r, rank in enumerate(ranks):
        # Every rank reports the last stage's losses and the norm of the whole model's gradient.
        first = MINI // MICRO  # the first mini-batch's micro-batches, on the same weights
        torch.testing.assert_close(rank["losses"][:first], expected["losses"][:first], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(rank["norms"][0], expected["norms"][0], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(rank["losses"], expected["losses"], rtol=1e-3, atol=1e-5)
        torch.testing.assert_close(rank["norms"], expected["norms"], rtol=1e-3, atol=1e-5)
        torch.testing.assert_close(rank["forward"][..., :2], expected["forward"][..., :2], rtol=1e-5, atol=1e-5)
        for name, grad in rank["grads"].items():
            want = expected["grads"][TIED.get(name, name)]
            tolerance = 1e-5 * (1 + float(want.abs().max()))
            torch.testing.assert_close(grad, want, rtol=0, atol=tolerance, msg=name)
        for after, weights in enumerate(rank["weights"]):
            for name, weight in weights.items():
                want = expected["weights"][after][TIED.get(name, name)]
                torch.testing.assert_close(weight, want, rtol=0, atol=1e-4, msg=name)
                held.setdefault(TIED.get(name, name), []).append(str(r))
    # Between them the ranks hold the whole model, each layer on one rank; the embedding and
    # the tied head on the first and last stage's, equal after every update.
    assert set(held) == set(expected["weights"][0])
    layers = {name: ranks_ for name, ranks_ in held.items() if ".layers." in name}
    assert all(len(set(ranks_)) == 1 for ranks_ in layers.values())


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
