"""A CUDA stream of its own for a colocated engine's generation in `colocate_async`.

Measured on one H200 (docs/benchmarks.md, "GPU: asynchronous against synchronous"): with the rollout thread and the
actor's update issuing every kernel on the one default stream, each decode step's copy of the
sampled tokens to the host queued behind the update's kernels, generation ran 1.19x slower and
the asynchronous step lost to the synchronous one; generation on a stream of its own ran at its
speed alone (+30 % tokens/s). The ordering the default stream gave for free is kept explicitly:

- a generation starts after the work already queued on the default stream (the last weight
  push) and is finished on the device when it returns (the next push may overwrite the weights);
- with partial rollouts, a push into a paused generation waits for the generation's queued
  kernels, and the resumed generation for the push.

On a CPU every step is a no-op: torch runs CPU kernels in program order.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


class GenerationStream:
    def __init__(self, device: torch.device, enabled: bool) -> None:
        self.device = device
        cuda = enabled and device.type == "cuda"
        self.stream = torch.cuda.Stream(device) if cuda else None  # type: ignore[no-untyped-call]

    @contextmanager
    def generating(self) -> Iterator[None]:
        """The generation's kernels on the stream, after the default stream's queued work."""
        if self.stream is None:
            yield
            return
        self.stream.wait_stream(torch.cuda.default_stream(self.device))
        with torch.cuda.stream(self.stream):
            yield
        self.stream.synchronize()

    def before_weights(self) -> None:
        """A paused generation's queued kernels come before the weights change."""
        if self.stream is not None:
            torch.cuda.default_stream(self.device).wait_stream(self.stream)

    def after_weights(self) -> None:
        """The resumed generation reads the weights the default stream wrote."""
        if self.stream is not None:
            self.stream.wait_stream(torch.cuda.default_stream(self.device))
