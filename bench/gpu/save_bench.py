"""Issue 34 item 4: what checkpoint.asyncSave takes off the step at the 7B shape, with torch
alone (the device image has torch, not the trainer's other dependencies). A state the size of
Qwen2.5-7B's trainable state with bf16 master weights (7.6 B parameters and two AdamW moments,
bf16, on the GPU, split in tensors of the model's largest size) is saved with torch distributed
checkpoint twice into a local folder: blocking (`save`, what a blocking save's ranks run) and
in the background (`async_save`, what `checkpoint/state.py: stage_rank_state` runs): the time
the caller waits (the copy into host memory) and the time the write takes after it.

    python3 bench/gpu/save_bench.py OUT_DIR [BILLIONS]  # prints one JSON line
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

import torch
from torch.distributed.checkpoint.state_dict_loader import load
from torch.distributed.checkpoint.state_dict_saver import async_save, save


def state(billions: float) -> dict[str, torch.Tensor]:
    chunk = 152_064 * 3_584  # the embedding, Qwen2.5-7B's largest tensor
    total = int(billions * 1e9)
    out = {}
    for name in ("weights", "exp_avg", "exp_avg_sq"):
        left, i = total, 0
        while left > 0:
            n = min(chunk, left)
            out[f"{name}.{i}"] = torch.randn(n, device="cuda", dtype=torch.bfloat16)
            left, i = left - n, i + 1
    torch.cuda.synchronize()
    return out


def main() -> None:
    out, billions = Path(sys.argv[1]), float(sys.argv[2]) if len(sys.argv) > 2 else 7.616
    tensors = state(billions)
    size = sum(t.numel() * t.element_size() for t in tensors.values())
    result: dict[str, float] = {"state_gb": size / 1e9}

    start = time.perf_counter()
    save(tensors, checkpoint_id=str(out / "blocking"), no_dist=True)
    result["blocking_save_s"] = time.perf_counter() - start
    shutil.rmtree(out / "blocking")

    before = tensors["weights.0"].cpu()
    start = time.perf_counter()
    future = async_save(tensors, checkpoint_id=str(out / "background"), no_dist=True)
    result["async_blocking_s"] = time.perf_counter() - start
    for t in tensors.values():  # the next update: the GPU state changes while the write goes on
        t.mul_(0.5)
    torch.cuda.synchronize()
    future.result()  # type: ignore[union-attr]
    result["async_total_s"] = time.perf_counter() - start
    result["async_background_s"] = result["async_total_s"] - result["async_blocking_s"]
    saved = {"weights.0": torch.empty_like(before)}
    load(saved, checkpoint_id=str(out / "background"), no_dist=True)
    result["saved_is_before_the_update"] = float(torch.equal(saved["weights.0"], before))
    shutil.rmtree(out / "background")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
