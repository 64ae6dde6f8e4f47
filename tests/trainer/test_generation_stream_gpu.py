"""rollout/stream.py on a GPU (skipped without one; CI has none: run it on a GPU host). The
colocated engine's generation in colocate_async runs on a CUDA stream of its own; each test
delays one stream with `torch.cuda._sleep` so that a missing wait shows as a wrong value:

- a generation reads what the default stream wrote before it started (the last weight push);
- what it queued is done when it returns (the next push may overwrite the weights);
- a push into a paused generation waits for the generation's queued reads, and the resumed
  generation reads the pushed weights."""

from __future__ import annotations

import pytest
import torch

from rlkube_trainer.rollout.stream import GenerationStream

pytestmark = [
    pytest.mark.trainer,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

DELAY = 200_000_000  # GPU clock cycles: about 0.1 s, far longer than a launch


@pytest.fixture
def device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device())


def test_a_generation_reads_the_weights_pushed_before_it(device: torch.device) -> None:
    stream = GenerationStream(device, enabled=True)
    weights = torch.zeros(1 << 20, device=device)
    torch.cuda._sleep(DELAY)  # the push, still queued on the default stream
    weights.fill_(1.0)
    with stream.generating():
        assert torch.cuda.current_stream(device) == stream.stream
        seen = weights.clone()
    assert bool((seen == 1.0).all())


def test_a_generation_is_done_on_the_device_when_it_returns(device: torch.device) -> None:
    stream = GenerationStream(device, enabled=True)
    out = torch.zeros(1 << 20, device=device)
    with stream.generating():
        torch.cuda._sleep(DELAY)
        out.fill_(2.0)
    assert stream.stream is not None and stream.stream.query()
    assert torch.cuda.current_stream(device) == torch.cuda.default_stream(device)


def test_a_push_into_a_paused_generation_keeps_both_orders(device: torch.device) -> None:
    stream = GenerationStream(device, enabled=True)
    assert stream.stream is not None
    weights = torch.full((1 << 20,), 3.0, device=device)
    with torch.cuda.stream(stream.stream):  # the generation's last step before the pause
        torch.cuda._sleep(DELAY)
        before = weights.clone()
    stream.before_weights()
    weights.fill_(5.0)  # the push, on the default stream
    torch.cuda._sleep(DELAY)
    weights.add_(2.0)
    stream.after_weights()
    with torch.cuda.stream(stream.stream):  # the resumed generation's first step
        after = weights.clone()
    torch.cuda.synchronize(device)
    assert bool((before == 3.0).all()) and bool((after == 7.0).all())


def test_without_overlap_nothing_changes_streams(device: torch.device) -> None:
    stream = GenerationStream(device, enabled=False)
    with stream.generating():
        assert torch.cuda.current_stream(device) == torch.cuda.default_stream(device)
    stream.before_weights()
    stream.after_weights()
    cpu = GenerationStream(torch.device("cpu"), enabled=True)
    assert cpu.stream is None
