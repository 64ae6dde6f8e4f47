"""What checkpoint.asyncSave takes off the step at the 7B shape, with torch
alone (the device image has torch, not the trainer's other dependencies). A state the size of
Qwen2.5-7B's trainable state with bf16 master weights (7.6 B parameters and two AdamW moments,
bf16, on the GPU, split in tensors of the model's largest size) is saved with torch distributed
checkpoint twice into a local folder: blocking (`save`, what a blocking save's ranks run) and
in the background (`async_save`, what `checkpoint/state.py: stage_rank_state` runs): the time
the caller waits (the copy into host memory) and the time the write takes after it.

The background save is timed twice more with the stager the trainer keeps per rank
(`checkpoint/state.py: _stager`, torch's BlockingAsyncStager with its cache: pinned host buffers,
made at the first save and reused by every later one): the first save pays for pinning the buffers, the second only copies. Each phase's
line is printed as it ends (a run cut short still says what it measured), then the JSON.

    python3 bench/gpu/save_bench.py OUT_DIR [BILLIONS]  # prints one JSON line last
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

import torch
from torch.distributed.checkpoint.staging import BlockingAsyncStager
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


def timed_async_save(
    tensors: dict[str, torch.Tensor], where: Path, stager: BlockingAsyncStager | None
) -> dict[str, float]:
    """One background save: the caller's wait, then the write behind it while the GPU state
    changes (the next update); checks that the files hold the state from before the change."""
    before = tensors["weights.0"].cpu()
    start = time.perf_counter()
    future = async_save(tensors, checkpoint_id=str(where), no_dist=True, async_stager=stager)
    blocking = time.perf_counter() - start
    for t in tensors.values():
        t.mul_(0.5)
    torch.cuda.synchronize()
    future.result()  # type: ignore[union-attr]
    total = time.perf_counter() - start
    saved = {"weights.0": torch.empty_like(before)}
    load(saved, checkpoint_id=str(where), no_dist=True)
    shutil.rmtree(where)
    return {
        "blocking_s": blocking,
        "background_s": total - blocking,
        "saved_is_before_the_update": float(torch.equal(saved["weights.0"], before)),
    }


def main() -> None:
    out, billions = Path(sys.argv[1]), float(sys.argv[2]) if len(sys.argv) > 2 else 7.616
    tensors = state(billions)
    size = sum(t.numel() * t.element_size() for t in tensors.values())
    result: dict[str, float] = {"state_gb": size / 1e9}
    print(f"state {size / 1e9:.1f} GB", flush=True)

    start = time.perf_counter()
    save(tensors, checkpoint_id=str(out / "blocking"), no_dist=True)
    result["blocking_save_s"] = time.perf_counter() - start
    shutil.rmtree(out / "blocking")
    print(f"blocking save {result['blocking_save_s']:.1f} s", flush=True)

    # torch's default stager: pageable host memory allocated at every save.
    for key, value in timed_async_save(tensors, out / "background", None).items():
        result[f"async_{key}"] = value
    print(f"async, default stager: waits {result['async_blocking_s']:.1f} s", flush=True)

    stager = BlockingAsyncStager(cache_staged_state_dict=True)
    for save_no in (1, 2):
        for key, value in timed_async_save(tensors, out / f"pinned-{save_no}", stager).items():
            result[f"pinned{save_no}_{key}"] = value
        print(f"async, pinned stager, save {save_no}: waits {result[f'pinned{save_no}_blocking_s']:.1f} s", flush=True)
    result["pinned_copy_gb_per_s"] = result["state_gb"] / result["pinned2_blocking_s"]
    print(json.dumps(result))


if __name__ == "__main__":
    main()
