"""LoRA weight sync, the two ways an engine can get a trained adapter: merged
weights loaded as the plain sync loads them (what the trainer does), or the adapter written in
PEFT's format and added to an engine started with LoRA enabled. Prints seconds per sync and per
generation batch for each. A benchmark, not a test: timings decide nothing.

On vLLM CPU, the tests' tiny Qwen2:

    .venv/bin/python bench/lora_sync.py --hidden 64 --layers 2 --mode merged
    .venv/bin/python bench/lora_sync.py --hidden 64 --layers 2 --mode adapter

On a GPU, a saved model at a real shape (bench/gpu/run.sh's `lora-sync` phase: the Qwen2.5-7B
shape, rank 64, the model sizes' generation shape):

    python3 bench/lora_sync.py --model DIR --device cuda --dtype bfloat16 --rank 64 \\
        --prompts 32 --samples 8 --prompt-len 256 --tokens 512 --gpu-util 0.3 --mode merged
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process

import torch

ROOT = Path(__file__).resolve().parents[1]
for _sub in ("", "trainer", "api"):
    if str(ROOT / _sub) not in sys.path:
        sys.path.insert(0, str(ROOT / _sub))
from rlkube_trainer.model.loading import load_causal_lm  # noqa: E402
from rlkube_trainer.model.lora import LoraSettings, apply_lora, merged_names, merged_weights  # noqa: E402  (after the path set-up above)
from rlkube_trainer.model.lora.export import peft_adapter_state, write_adapter  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=("merged", "adapter"), required=True)
    parser.add_argument("--model", type=Path, help="a saved model (default: the tests' tiny Qwen2, built here)")
    parser.add_argument("--hidden", type=int, default=64, help="the tiny model's width (without --model)")
    parser.add_argument("--layers", type=int, default=2, help="the tiny model's depth (without --model)")
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", help="the engine's and the base weights' dtype")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--samples", type=int, default=1, help="responses per prompt")
    parser.add_argument("--prompt-len", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=16, help="response tokens (EOS ignored)")
    parser.add_argument("--gpu-util", type=float, default=0.05)
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--adapter-dir", type=Path, help="where adapters are written (default: a temp dir)")
    parser.add_argument("--out", type=Path, help="a JSON file for the timings")
    args = parser.parse_args()
    import vllm  # noqa: PLC0415
    from vllm.inputs import TokensPrompt  # noqa: PLC0415

    workdir = Path(tempfile.mkdtemp())
    path = args.model or _tiny_model(workdir / "model", args.hidden, args.layers)
    vocab = json.loads((path / "config.json").read_text())["vocab_size"]
    dtype = getattr(torch, args.dtype)
    settings = LoraSettings(args.rank, 2 * args.rank)
    # The adapters in fp32 over the base in the engine's dtype, as the trainer's fp32-master
    # LoRA hands them over (the merge is computed in fp32 either way).
    model = apply_lora(load_causal_lm(str(path), device=args.device, dtype=dtype), settings)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if ".lora_" in name:
                param.data = param.data.float()
                if ".lora_B." in name:
                    param.normal_(std=0.01)
    rng = random.Random(0)
    prompts = [
        TokensPrompt(prompt_token_ids=[rng.randrange(10, vocab - 10) for _ in range(args.prompt_len)])
        for _ in range(args.prompts)
    ]
    sampling = vllm.SamplingParams(n=args.samples, max_tokens=args.tokens, temperature=1.0, ignore_eos=True)
    engine_args = {"dtype": args.dtype, "gpu_memory_utilization": args.gpu_util, "enforce_eager": args.device == "cpu"}
    syncs, generations = [], []
    if args.mode == "merged":
        from rlkube_trainer.rollout.vllm.engine import VLLMRolloutEngine  # noqa: PLC0415
        from rlkube_trainer.workers.weight_sync import load_into_engine  # noqa: PLC0415

        engine = VLLMRolloutEngine(path, device=args.device, **engine_args)
        names = merged_names(list(model.state_dict()))
        for _ in range(args.repeats + 1):  # the first of each: warm-up, not counted
            _sync(args.device)
            started = time.perf_counter()
            load_into_engine(engine, merged_weights(model.state_dict().items(), settings.scaling), names)
            _sync(args.device)
            syncs.append(time.perf_counter() - started)
            started = time.perf_counter()
            engine._llm.generate(prompts, sampling, use_tqdm=False)
            generations.append(time.perf_counter() - started)
    else:
        from vllm.lora.request import LoRARequest  # noqa: PLC0415

        llm = vllm.LLM(model=str(path), enable_lora=True, max_lora_rank=args.rank, max_loras=1, **engine_args)
        adapters = args.adapter_dir or workdir
        for version in range(1, args.repeats + 2):
            _sync(args.device)
            started = time.perf_counter()
            folder = adapters / f"adapter-{version}"
            write_adapter(folder, settings, peft_adapter_state(model.state_dict().items()), str(path))
            request = LoRARequest(f"v{version}", version, str(folder))
            llm.llm_engine.add_lora(request)
            if version > 1:
                llm.llm_engine.remove_lora(version - 1)
            syncs.append(time.perf_counter() - started)
            started = time.perf_counter()
            llm.generate(prompts, sampling, lora_request=request, use_tqdm=False)
            generations.append(time.perf_counter() - started)
    syncs, generations = syncs[1:], generations[1:]
    result = {
        "mode": args.mode,
        "model": str(args.model or f"tiny hidden {args.hidden}, {args.layers} layers"),
        "rank": args.rank,
        "device": args.device,
        "dtype": args.dtype,
        "shape": {k: getattr(args, k) for k in ("prompts", "samples", "prompt_len", "tokens")},
        "sync_s": syncs,
        "generate_s": generations,
        "sync_median_s": statistics.median(syncs),
        "generate_median_s": statistics.median(generations),
    }
    print(
        f"{args.mode}: {result['model']}, rank {args.rank}: sync median {result['sync_median_s'] * 1e3:.1f} ms "
        f"{[round(s * 1e3, 1) for s in syncs]}, generation of {args.prompts * args.samples}x{args.tokens} tokens "
        f"median {result['generate_median_s'] * 1e3:.0f} ms"
    )
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))


def _tiny_model(path: Path, hidden: int, layers: int) -> Path:
    from tests.trainer.tiny_model import build_tiny_model  # noqa: PLC0415

    return Path(build_tiny_model(path, hidden_size=hidden, num_layers=layers, num_heads=max(2, hidden // 64)))


def _sync(device: str) -> None:
    """Waits for the device's queued work, so a timing covers what it started."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()


if __name__ == "__main__":
    main()
