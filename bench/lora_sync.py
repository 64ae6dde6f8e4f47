"""LoRA weight sync on vLLM CPU, the two ways an engine can get a trained adapter (issue 33):
merged weights loaded as the plain sync loads them (what the trainer does), or the adapter
written in PEFT's format and added to an engine started with LoRA enabled. Prints seconds per
sync and per generation batch for each. A benchmark, not a test: timings decide nothing.

    .venv/bin/python bench/lora_sync.py --hidden 64 --layers 2 --mode merged
    .venv/bin/python bench/lora_sync.py --hidden 64 --layers 2 --mode adapter
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from rlkube_trainer.lora import LoraSettings, apply_lora, merged_names, merged_weights
from rlkube_trainer.lora.export import peft_adapter_state, write_adapter
from rlkube_trainer.models import load_causal_lm
from tests.trainer.tiny_model import build_tiny_model

PROMPTS = [[5, 17, 42, 99, 3, 250, 7, 8]] * 64
REPEATS = 6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--mode", choices=("merged", "adapter"), required=True)
    args = parser.parse_args()
    import vllm  # noqa: PLC0415

    workdir = Path(tempfile.mkdtemp())
    heads = max(2, args.hidden // 64)
    path = build_tiny_model(workdir / "model", hidden_size=args.hidden, num_layers=args.layers, num_heads=heads)
    settings = LoraSettings(args.rank, 2 * args.rank)
    model = apply_lora(load_causal_lm(str(path)), settings)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if ".lora_B." in name:
                param.normal_(std=0.01)
    sampling = vllm.SamplingParams(max_tokens=16, temperature=1.0, ignore_eos=True)
    prompts = [vllm.inputs.TokensPrompt(prompt_token_ids=p) for p in PROMPTS]
    syncs, generations = [], []
    if args.mode == "merged":
        from rlkube_trainer.rollout.vllm_engine import VLLMRolloutEngine  # noqa: PLC0415
        from rlkube_trainer.weight_sync import load_into_engine  # noqa: PLC0415

        engine = VLLMRolloutEngine(path, dtype="float32", device="cpu", gpu_memory_utilization=0.05, enforce_eager=True)
        names = merged_names(list(model.state_dict()))
        for _ in range(REPEATS):
            started = time.perf_counter()
            load_into_engine(engine, merged_weights(model.state_dict().items(), settings.scaling), names)
            syncs.append(time.perf_counter() - started)
            started = time.perf_counter()
            engine._llm.generate(prompts, sampling, use_tqdm=False)
            generations.append(time.perf_counter() - started)
    else:
        from vllm.lora.request import LoRARequest  # noqa: PLC0415

        llm = vllm.LLM(
            model=str(path),
            dtype="float32",
            enable_lora=True,
            max_lora_rank=args.rank,
            max_loras=1,
            gpu_memory_utilization=0.05,
            enforce_eager=True,
        )
        for version in range(1, REPEATS + 1):
            started = time.perf_counter()
            folder = workdir / f"adapter-{version}"
            write_adapter(folder, settings, peft_adapter_state(model.state_dict().items()), str(path))
            request = LoRARequest(f"v{version}", version, str(folder))
            llm.llm_engine.add_lora(request)
            if version > 1:
                llm.llm_engine.remove_lora(version - 1)
            syncs.append(time.perf_counter() - started)
            started = time.perf_counter()
            llm.generate(prompts, sampling, lora_request=request, use_tqdm=False)
            generations.append(time.perf_counter() - started)
    print(
        f"{args.mode}: hidden {args.hidden}, {args.layers} layers, rank {args.rank}: "
        f"sync median {statistics.median(syncs) * 1e3:.1f} ms {[round(s * 1e3, 1) for s in syncs]}, "
        f"generation of 64x16 tokens median {statistics.median(generations) * 1e3:.0f} ms"
    )


if __name__ == "__main__":
    main()
