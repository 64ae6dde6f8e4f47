"""Padded vs packed (verl's use_remove_padding) vs packed micro-batches by token budget
(use_dynamic_bsz): the actor's forward + backward and its forward-only log-prob pass, through
the trainer's own code (`rlkube_trainer.model.token_scores.response_log_probs`,
`rlkube_trainer.model.packing`).

    python bench/gpu/packing_bench.py            # GPU: Qwen2.5-0.5B-shaped random model, 64 x 8 samples
    python bench/gpu/packing_bench.py --tiny     # CPU or GPU: a tiny model and shape, in seconds

Needs torch and transformers only. Prints one JSON object: per variant, real (unpadded)
tokens per second, seconds per pass and peak GPU memory, and how far the packed log-probs are
from the padded ones. On GPU packed attention is FlexAttention with a document BlockMask
(compiled on first use: the warm-up pass pays it); on CPU it is SDPA with a dense mask.

Lengths: prompts uniform in [prompt_len/2, prompt_len] tokens (left-padded), responses
log-normal around response_len/2, a share of them cut at response_len (right-padded): the
shape of a GRPO batch whose samples stop at EOS, not ignore_eos's all-full batch.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
for _path in (ROOT / "trainer", Path(__file__).resolve().parent):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import torch  # noqa: E402

# The benchmark's model shapes are grpo_bench.py's (it imports nothing heavy at the top).
from grpo_bench import FULL_SHAPE, QWEN25_05B, TINY  # noqa: E402
from transformers import Qwen2Config, Qwen2ForCausalLM  # noqa: E402

from rlkube_trainer.model.packing import enable_packed_attention, token_bins  # noqa: E402
from rlkube_trainer.model.token_scores import response_log_probs  # noqa: E402

TINY_SHAPE = {"prompts": 4, "n": 4, "prompt_len": 16, "response_len": 24}


def make_batch(shape: dict[str, int], vocab: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """input_ids and attention_mask [samples, prompt_len + response_len]: left-padded prompts,
    right-padded responses of uneven lengths."""
    g = torch.Generator().manual_seed(seed)
    samples, prompt, response = shape["prompts"] * shape["n"], shape["prompt_len"], shape["response_len"]
    prompt_lengths = torch.randint(prompt // 2, prompt + 1, (shape["prompts"],), generator=g).repeat_interleave(
        shape["n"]
    )
    # log-normal around response/2 (sigma 0.6): ~15% reach response_len and are cut there.
    drawn = torch.exp(math.log(response / 2) + 0.6 * torch.randn(samples, generator=g))
    response_lengths = drawn.round().clamp(1, response).long()
    ids = torch.randint(3, vocab, (samples, prompt + response), generator=g)
    columns = torch.arange(prompt + response)
    mask = (columns >= prompt - prompt_lengths.unsqueeze(1)) & (columns < prompt + response_lengths.unsqueeze(1))
    return ids * mask, mask.long()


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def micro_batches(mask: torch.Tensor, micro: int, budget: int | None) -> list[torch.Tensor]:
    if budget is None:
        return [torch.arange(i, min(i + micro, len(mask))) for i in range(0, len(mask), micro)]
    lengths = [int(n) for n in mask.sum(-1)]
    return [torch.tensor(b) for b in token_bins(lengths, budget, "--token-budget")]


def run_pass(
    model: torch.nn.Module,
    ids: torch.Tensor,
    mask: torch.Tensor,
    response_len: int,
    groups: list[torch.Tensor],
    packed: bool,
    backward: bool,
    device: torch.device,
) -> list[torch.Tensor]:
    """One pass over the batch; returns each micro-batch's response log-probs (detached, CPU)."""
    out = []
    for group in groups:
        micro_ids, micro_mask = ids[group].to(device), mask[group].to(device)
        response_mask = micro_mask[:, -response_len:]
        with torch.set_grad_enabled(backward):
            lp, _ = response_log_probs(model, micro_ids, micro_mask, response_len, packed=packed)
            if backward:
                # A token-mean loss of the log-probs: the backward of an actor update's policy term.
                loss = -(lp.float() * response_mask).sum() / response_mask.sum()
                loss.backward()
        out.append(lp.detach().float().cpu())
    if backward:
        model.zero_grad(set_to_none=True)
    return out


def measure(
    name: str,
    fn: Callable[[], list[torch.Tensor]],
    tokens: int,
    repeats: int,
    device: torch.device,
) -> tuple[dict[str, Any], list[torch.Tensor]]:
    started = time.perf_counter()
    result = fn()  # warm-up: compilation of FlexAttention and the mask, allocator growth
    sync(device)
    warmup = time.perf_counter() - started
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - started)
    best = min(times)
    stats: dict[str, Any] = {
        "seconds": round(best, 4),
        "tokens_per_s": round(tokens / best, 1),
        "warmup_s": round(warmup, 2),
    }
    if device.type == "cuda":
        stats["peak_memory_gb"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 3)
    print(f"# {name}: {stats}", file=sys.stderr, flush=True)
    return stats, result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true", help="tiny model and shape (CPU-friendly)")
    parser.add_argument("--micro", type=int, default=16, help="samples per fixed micro-batch")
    parser.add_argument("--token-budget", type=int, default=16384, help="tokens per dynamic micro-batch")
    parser.add_argument("--repeats", type=int, default=3, help="timed passes per variant (best is reported)")
    parser.add_argument("--gradient-checkpointing", action="store_true")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    args = parser.parse_args(argv)

    device = torch.device(args.device)
    arch, shape = (TINY, TINY_SHAPE) if args.tiny else (QWEN25_05B, FULL_SHAPE)
    budget = min(args.token_budget, 256) if args.tiny else args.token_budget
    micro = min(args.micro, 4) if args.tiny else args.micro
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen2ForCausalLM(Qwen2Config(**arch)).to(dtype)
    model.config.use_cache = False
    if args.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    # As an actor with use_remove_padding: packed rows through FlexAttention (GPU), padded
    # batches still through SDPA with transformers' own masks, as without packing.
    enable_packed_attention(model)

    ids, mask = make_batch(shape, arch["vocab_size"], seed=0)
    real_tokens = int(mask.sum())
    response_len = shape["response_len"]
    fixed = micro_batches(mask, micro, None)
    dynamic = micro_batches(mask, micro, budget)
    result: dict[str, Any] = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "shape": shape,
        "samples": len(ids),
        "real_tokens": real_tokens,
        "padded_tokens": int(mask.numel()),
        "padding_share": round(1 - real_tokens / mask.numel(), 3),
        "micro_batch": micro,
        "token_budget": budget,
        "micro_batches": {"fixed": len(fixed), "dynamic": len(dynamic)},
        "dtype": str(dtype).removeprefix("torch."),
        "gradient_checkpointing": args.gradient_checkpointing,
    }
    variants = {
        "padded": (fixed, False),
        "packed": (fixed, True),
        "packed_dynamic": (dynamic, True),
    }
    logprobs: dict[str, list[torch.Tensor]] = {}
    for phase, backward in (("forward_backward", True), ("forward", False)):
        result[phase] = {}
        for name, (groups, packed) in variants.items():

            def one_pass(
                groups: list[torch.Tensor] = groups, packed: bool = packed, backward: bool = backward
            ) -> list[torch.Tensor]:
                return run_pass(model, ids, mask, response_len, groups, packed, backward, device)

            result[phase][name], out = measure(f"{phase}/{name}", one_pass, real_tokens, args.repeats, device)
            if not backward:
                logprobs[name] = out
        padded = result[phase]["padded"]["tokens_per_s"]
        for name in ("packed", "packed_dynamic"):
            result[phase][name]["speedup_vs_padded"] = round(result[phase][name]["tokens_per_s"] / padded, 3)

    # The packed log-probs are the padded ones (up to the compute dtype's rounding).
    response_mask = mask[:, -response_len:].bool()
    reference = torch.cat(logprobs["padded"])
    packed_lp = torch.cat(logprobs["packed"])
    order = torch.cat(dynamic)
    dynamic_lp = torch.empty_like(reference)
    dynamic_lp[order] = torch.cat(logprobs["packed_dynamic"])
    result["max_abs_logprob_diff"] = {
        "packed": float((packed_lp - reference)[response_mask].abs().max()),
        "packed_dynamic": float((dynamic_lp - reference)[response_mask].abs().max()),
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
