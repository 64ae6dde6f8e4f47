#!/usr/bin/env python3
"""verl 0.9.1 (PyPI) as a peer of rlkube's GRPO benchmark, at grpo_bench.py's shape.

`python -m verl.trainer.main_ppo` with GRPO, FSDP and vLLM rollout (colocated, sleep mode) on one
GPU: the model grpo_bench.ensure_model saves (Qwen2.5-0.5B architecture, random, byte-level
tokenizer), 64 prompts x 8 samples, 256 prompt + 512 response tokens (EOS ignored), reward =
grpo_bench.REWARD_SOURCE as verl's custom_reward_function, one optimizer step per step
(ppo_mini_batch_size = 64 prompts), no reference model (no KL, as rlkube's GRPO run), no
validation, no checkpoints. verl runs with its own site (transformers 5.9.0, see
requirements-verl.txt) in front of rlkube's: VERL_SITE (default /tmp/verl-site).

  python3 bench/gpu/verl_bench.py prepare                 # model, tokenizer with a chat template, parquet, reward.py
  python3 bench/gpu/verl_bench.py check                   # no GPU: config validated by verl, prompt tokens, reward fn
  python3 bench/gpu/verl_bench.py config                  # the composed Hydra config (main_ppo --cfg job), no run
  python3 bench/gpu/verl_bench.py run --out OUT/verl.json # prepare + main_ppo + parse; log in OUT/verl.log
  python3 bench/gpu/verl_bench.py parse OUT/verl.log --out OUT/verl.json   # console log or file-logger JSONL

OUT/verl.json is read by `grpo_bench.py report` (key "verl": its `summary` has rlkube's metric names:
perf/throughput = verl's tokens/s/GPU, timing_s/*).
"""

# ruff: noqa: PLC0415
from __future__ import annotations

import argparse
import ast
import json
import os
import random
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
# grpo_bench sets VLLM_ENABLE_V1_MULTIPROCESSING=0 for its in-process engine on import; verl's
# vLLM server (AsyncLLM in a Ray actor) keeps vLLM's default, so the child gets the caller's env.
_CALLER_ENV = dict(os.environ)
# This process too (prepare's prompt check, check) uses verl's site: verl, transformers 5.9.
VERL_SITE = os.environ.get("VERL_SITE", "/tmp/verl-site")
if Path(VERL_SITE).is_dir():
    sys.path.insert(0, VERL_SITE)
sys.path.insert(0, str(HERE))
import grpo_bench as gb  # noqa: E402

VERL_VERSION = "0.9.1"
# The prompt is the message's text as is: 256 lowercase letters = 256 byte tokens.
CHAT_TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% endfor %}"


def paths(workdir: Path, tiny: bool) -> dict[str, Path]:
    return {
        "model": workdir / ("model-tiny" if tiny else "model-qwen2.5-0.5b"),
        "tokenizer": workdir / ("verl-tokenizer-tiny" if tiny else "verl-tokenizer"),
        "data": workdir / ("verl-train-tiny.parquet" if tiny else "verl-train.parquet"),
        "reward": workdir / "reward.py",
        "ckpt": workdir / "verl-checkpoints",
    }


def prompt_texts(shape: dict[str, int], count: int, seed: int = 0) -> list[str]:
    """As grpo_bench's TRL phase: letters, one byte = one token with the byte-level tokenizer."""
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    return ["".join(rng.choice(letters) for _ in range(shape["prompt_len"])) for _ in range(count)]


def prepare(workdir: Path, steps: int, tiny: bool) -> dict[str, Path]:
    """Model (grpo_bench.ensure_model), a tokenizer copy with a chat template, the parquet, reward.py.

    verl's single-turn agent loop renders every prompt through the tokenizer's chat template
    (Continuous Token builder); the bench tokenizer has none, so a copy gets one that emits the
    message text unchanged. Checks that each prompt renders to exactly prompt_len tokens."""
    import pandas as pd
    from transformers import AutoTokenizer

    arch, shape = (gb.TINY, gb.TINY_SHAPE) if tiny else (gb.QWEN25_05B, gb.FULL_SHAPE)
    p = paths(workdir, tiny)
    workdir.mkdir(parents=True, exist_ok=True)
    gb.ensure_model(p["model"], arch)
    tokenizer = AutoTokenizer.from_pretrained(str(p["model"]))
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(str(p["tokenizer"]))
    tokenizer = AutoTokenizer.from_pretrained(str(p["tokenizer"]))
    p["reward"].write_text(gb.REWARD_SOURCE)

    texts = prompt_texts(shape, shape["prompts"] * steps)
    rows = [
        {
            "data_source": "bench",
            "prompt": [{"role": "user", "content": text}],
            "ability": "bench",
            "reward_model": {"style": "rule", "ground_truth": ""},
            "extra_info": {"index": i},
        }
        for i, text in enumerate(texts)
    ]
    pd.DataFrame(rows).to_parquet(p["data"])
    check_prompt_tokens(tokenizer, [r["prompt"] for r in rows[:4]], shape["prompt_len"], str(p["model"]))
    gb.log(f"verl inputs ready: {len(rows)} prompts in {p['data']}, tokenizer {p['tokenizer']}")
    return p


def check_prompt_tokens(tokenizer: Any, prompts: list[list[dict[str, str]]], want: int, model_dir: str) -> None:
    """Renders prompts the way verl's agent loop does (its Continuous Token builder for the model's
    type); each must be `want` tokens and decode back to the text. Runs under verl's site."""
    from transformers import AutoConfig
    from verl.utils.tokenizer.continuous_token_wiring import create_continuous_token_builder

    builder = create_continuous_token_builder(tokenizer, hf_model_type=AutoConfig.from_pretrained(model_dir).model_type)
    render = builder.build_initial_tokens
    how = f"verl {type(builder).__name__}"
    for messages in prompts:
        ids = render(messages)
        if len(ids) != want:
            raise SystemExit(f"prompt renders to {len(ids)} tokens via {how}, want {want}: {ids[:20]}...")
        if tokenizer.decode(ids) != messages[0]["content"]:
            raise SystemExit(f"prompt tokens do not round-trip through the tokenizer ({how})")
    gb.log(f"prompts render to exactly {want} tokens ({how}) and round-trip")


def overrides(args: argparse.Namespace, p: dict[str, Path]) -> list[str]:
    """main_ppo's Hydra overrides: the bench shape and verl's recommended performance flags."""
    shape = gb.TINY_SHAPE if args.tiny else gb.FULL_SHAPE
    seq = shape["prompt_len"] + shape["response_len"]
    token_budget = args.max_token_len or args.micro * seq
    a, r = "actor_rollout_ref.actor", "actor_rollout_ref.rollout"
    return [
        "algorithm.adv_estimator=grpo",
        "algorithm.use_kl_in_reward=False",
        f"data.train_files={p['data']}",
        f"data.val_files={p['data']}",
        f"data.train_batch_size={shape['prompts']}",
        f"data.max_prompt_length={shape['prompt_len']}",
        f"data.max_response_length={shape['response_len']}",
        "data.filter_overlong_prompts=False",
        "data.truncation=error",
        "data.shuffle=False",
        f"actor_rollout_ref.model.path={p['model']}",
        f"actor_rollout_ref.model.tokenizer_path={p['tokenizer']}",
        # verl recommends use_remove_padding (packed sequences) with flash-attn's varlen kernel;
        # flash-attn is not on the host. Packed with SDPA, transformers masks a dense block-diagonal
        # (packed length)^2 matrix: 16x the attention work of varlen at a 12288-token budget. At
        # this shape nothing is padded (every prompt 256, every response 512), so the padded path
        # with SDPA's causal kernel does exactly varlen's work: the default. --remove-padding
        # --attn flex_attention is the packed path with block-sparse attention.
        f"actor_rollout_ref.model.use_remove_padding={args.remove_padding}",
        f"+actor_rollout_ref.model.override_config.attn_implementation={args.attn}",
        # As rlkube's GRPO run in grpo_bench (its trainer_config leaves checkpointing off).
        f"actor_rollout_ref.model.enable_gradient_checkpointing={args.gradient_checkpointing}",
        f"{a}.optim.lr=1e-6",
        # One optimizer step per step: the mini-batch is the whole batch of 64 prompts (x n).
        f"{a}.ppo_mini_batch_size={shape['prompts']}",
        f"{a}.ppo_micro_batch_size_per_gpu={args.micro}",
        # Dynamic batches by token count; the budget is the micro-batch's tokens (16 x 768), the
        # forward-only log-prob pass inherits it (log_prob_max_token_len_per_gpu interpolates).
        f"{a}.use_dynamic_bsz={args.dynamic_bsz}",
        f"{a}.ppo_max_token_len_per_gpu={token_budget}",
        f"{r}.log_prob_micro_batch_size_per_gpu={args.micro}",
        f"{a}.use_kl_loss=False",
        f"{a}.entropy_coeff=0",
        f"{a}.fsdp_config.param_offload=False",
        f"{a}.fsdp_config.optimizer_offload=False",
        f"{r}.name=vllm",
        f"{r}.n={shape['n']}",
        f"{r}.tensor_model_parallel_size=1",
        f"{r}.temperature=1.0",
        f"{r}.ignore_eos=True",
        f"{r}.gpu_memory_utilization={args.gpu_util}",
        # Colocated (hybrid engine): vLLM sleeps during training, as verl recommends.
        f"{r}.free_cache_engine={args.free_cache_engine}",
        f"{r}.enforce_eager=False",
        "reward.custom_reward_function.name=compute_score",
        f"reward.custom_reward_function.path={p['reward']}",
        "trainer.critic_warmup=0",
        "trainer.logger=[console,file]",
        "trainer.project_name=rlkube_bench",
        "trainer.experiment_name=verl_grpo",
        "trainer.n_gpus_per_node=1",
        "trainer.nnodes=1",
        f"trainer.device={'cpu' if args.tiny else 'cuda'}",
        "trainer.val_before_train=False",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        "trainer.resume_mode=disable",
        f"trainer.default_local_dir={p['ckpt']}",
        "trainer.total_epochs=1",
        f"trainer.total_training_steps={args.steps}",
        # Ray's CPUs are logical: TransferQueue alone holds 9 (controller + 8 storage units,
        # num_cpus=1 each), the task runner 1 and the FSDP worker pool's bundle up to 10; on a
        # 16-core host actors could wait forever for CPUs (seen here on 2 cores with num_cpus=2).
        f"ray_kwargs.ray_init.num_cpus={max(32, os.cpu_count() or 1)}",
        *args.extra,
    ]


def verl_env(args: argparse.Namespace, jsonl: Path | None) -> dict[str, str]:
    env = dict(_CALLER_ENV)
    site = args.verl_site
    if site:
        env["PYTHONPATH"] = site + (":" + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.setdefault("WANDB_MODE", "disabled")
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    if jsonl is not None:
        env["VERL_FILE_LOGGER_PATH"] = str(jsonl)
    return env


def main_ppo(
    args: argparse.Namespace, p: dict[str, Path], extra: list[str], jsonl: Path | None, log: Path | None
) -> int:
    cmd = [args.python, "-m", "verl.trainer.main_ppo", *overrides(args, p), *extra]
    gb.log("running: " + " ".join(cmd))
    env = verl_env(args, jsonl)
    if log is None:
        return subprocess.call(cmd, env=env)
    log.parent.mkdir(parents=True, exist_ok=True)
    with (
        log.open("w") as f,
        subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1) as proc,
    ):
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(line)
            f.write(line)
        return proc.wait()


# --------------------------------------------------------------------------- metrics

# verl's console logger (verl.utils.logger.aggregate_logger.concat_dict_to_str) prints one line
# per step: "step:N - key:value - key:value ...", numbers formatted by pprint.pformat.
_CONSOLE_STEP = re.compile(r"(?:^|\s)step:(\d+) - (.*)$")
_SCALAR_WRAPPER = re.compile(r"^(?:np\.\w+|numpy\.\w+|tensor)\((.*)\)$")


def parse_console(text: str) -> list[dict[str, float]]:
    steps: dict[int, dict[str, float]] = {}
    for line in text.splitlines():
        m = _CONSOLE_STEP.search(line)
        if not m:
            continue
        metrics: dict[str, float] = {}
        for item in m.group(2).split(" - "):
            key, sep, value = item.partition(":")
            if not sep:
                continue
            # numpy scalars print as np.float64(1.5) under numpy 2, tensors as tensor(1.5).
            text = _SCALAR_WRAPPER.sub(r"\1", value.strip())
            try:
                number = ast.literal_eval(text)
            except (ValueError, SyntaxError):
                continue
            if isinstance(number, (int, float)) and not isinstance(number, bool):
                metrics[key.strip()] = float(number)
        if "timing_s/step" in metrics:
            steps[int(m.group(1))] = {"step": float(m.group(1)), **metrics}
    return [steps[k] for k in sorted(steps)]


def parse_jsonl(text: str) -> list[dict[str, float]]:
    """verl's file logger: one {"step": N, "data": {...}} object per line."""
    steps: dict[int, dict[str, float]] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        entry = json.loads(line)
        data = {k: float(v) for k, v in entry.get("data", {}).items() if isinstance(v, (int, float))}
        if "timing_s/step" in data:
            steps[int(entry["step"])] = {"step": float(entry["step"]), **data}
    return [steps[k] for k in sorted(steps)]


SUMMARY_PREFIXES = ("timing_s/", "perf/", "response_length/", "prompt_length/", "timing_per_token_ms/")


def summarize(history: list[dict[str, float]], shape: dict[str, int]) -> dict[str, float]:
    """Means over the steps after the first (warm-up), with grpo_bench's key names."""
    steady = history[1:] if len(history) > 1 else history
    keys = sorted({k for m in steady for k in m if k.startswith(SUMMARY_PREFIXES)})
    out = {k: statistics.fmean(m[k] for m in steady if k in m) for k in keys}
    if "timing_s/gen" in out:
        out["gen_tokens_per_s"] = shape["prompts"] * shape["n"] * shape["response_len"] / out["timing_s/gen"]
    out["steps_averaged"] = len(steady)
    return out


def write_result(
    out: Path, history: list[dict[str, float]], shape: dict[str, int], extra: dict[str, Any]
) -> dict[str, Any]:
    res = gb.Results(out)
    for key, value in extra.items():
        res.put(key, value)
    res.put("shape", shape)
    res.put("steps", history)
    if not history:
        res.error("verl", RuntimeError("no step metrics found in verl's output"))
        return res
    summary = summarize(history, shape)
    want = shape["response_len"]
    if summary.get("response_length/mean", want) != want:
        res.error("shape", RuntimeError(f"mean response length {summary['response_length/mean']} != {want}"))
    res.put("summary", summary)
    gb.log(f"verl summary: {json.dumps(summary)}")
    return res


# --------------------------------------------------------------------------- phases


def verl_versions(args: argparse.Namespace) -> dict[str, str]:
    code = (
        "import json, importlib.metadata as m\n"
        "out = {}\n"
        "for n in ('verl', 'transformers', 'tokenizers', 'vllm', 'torch', 'tensordict', 'ray', 'hydra-core'):\n"
        "    try: out[n] = m.version(n)\n"
        "    except Exception as e: out[n] = 'missing'\n"
        "print(json.dumps(out))\n"
    )
    try:
        done = subprocess.run(
            [args.python, "-c", code], check=False, env=verl_env(args, None), capture_output=True, text=True, timeout=60
        )
        return json.loads(done.stdout.strip().splitlines()[-1])
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}


def phase_run(args: argparse.Namespace) -> int:
    shape = gb.TINY_SHAPE if args.tiny else gb.FULL_SHAPE
    out: Path = args.out
    log, jsonl = out.with_suffix(".log"), out.with_suffix(".jsonl")
    started = time.monotonic()
    p = prepare(Path(args.workdir), args.steps, args.tiny)
    # ensure_model may have built the model on the GPU in this process: give the cache back to verl.
    gb.torch.cuda.empty_cache()
    jsonl.unlink(missing_ok=True)
    rc = main_ppo(args, p, [], jsonl, log)
    history = parse_jsonl(jsonl.read_text()) if jsonl.exists() else []
    if not history:
        history = parse_console(log.read_text())
    meta = {
        "env": {**gb.environment(), **{f"verl_site_{k}": v for k, v in verl_versions(args).items()}},
        "overrides": overrides(args, p),
        "returncode": rc,
        "wall_s": time.monotonic() - started,
    }
    res = write_result(out, history, shape, meta)
    if rc != 0:
        text = log.read_text()
        start = text.rfind("Traceback (most recent call last)")
        tail = text[start : start + 6000] if start >= 0 else text[-3000:]
        res.error("main_ppo", RuntimeError(f"exit status {rc}; log tail:\n{tail}"))
    return 0 if rc == 0 and "summary" in res else 1


def phase_check(args: argparse.Namespace) -> int:
    """No GPU needed: composes main_ppo's config with the overrides in-process, runs verl's own
    validate_config and its dataclass conversion of the actor and rollout configs, loads and calls
    the custom reward function the way verl does. Run with verl's site on PYTHONPATH."""
    from hydra import compose, initialize_config_module
    from verl.trainer.ppo.reward import get_custom_reward_fn
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config

    p = prepare(Path(args.workdir), args.steps, args.tiny)
    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        cfg = compose(config_name="ppo_trainer", overrides=overrides(args, p))
    if need_reference_policy(cfg) or need_critic(cfg):
        raise SystemExit("the GRPO config would build a reference model or a critic")
    validate_config(config=cfg, use_reference_policy=False, use_critic=False)
    actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    rollout = omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout)
    shape = gb.TINY_SHAPE if args.tiny else gb.FULL_SHAPE
    assert rollout.prompt_length == shape["prompt_len"] and rollout.response_length == shape["response_len"]
    assert rollout.n == shape["n"] and rollout.ignore_eos and actor.ppo_mini_batch_size == shape["prompts"]
    score_fn = get_custom_reward_fn(cfg)
    assert score_fn is not None, "verl did not load reward.custom_reward_function"
    score = score_fn(data_source="bench", solution_str="abc", ground_truth="", extra_info={})
    assert score == 3 / 7, score
    packed_forward_check(args.attn)
    gb.log(
        f"config ok: actor mini {actor.ppo_mini_batch_size} micro {actor.ppo_micro_batch_size_per_gpu} dynamic "
        f"{actor.use_dynamic_bsz} budget {actor.ppo_max_token_len_per_gpu}; rollout n {rollout.n} "
        f"{rollout.prompt_length}+{rollout.response_length} util {rollout.gpu_memory_utilization} free_cache "
        f"{rollout.free_cache_engine}; reward fn ok ({score:.3f})"
    )
    return 0


def packed_forward_check(attn: str) -> None:
    """verl's model patching (apply_monkey_patch, as its FSDP engine calls it) on a small Qwen2, then
    a forward of two sequences packed the way use_remove_padding feeds them (attention_mask None,
    position_ids restarting per sequence, use_cache False) must equal the separate forwards.

    Also catches a TRL on the path that lacks trl.experimental.ppo (TRL 1.x): verl's patch imports
    AutoModelForCausalLMWithValueHead whenever any trl is importable, hence TRL 0.27 in verl's site."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM
    from verl.models.transformers.monkey_patch import apply_monkey_patch

    torch.manual_seed(0)
    arch = {k: v for k, v in gb.TINY.items() if k != "vocab_size"}
    model = Qwen2ForCausalLM(Qwen2Config(**arch, vocab_size=300, attn_implementation=attn)).eval()
    apply_monkey_patch(model, use_remove_padding=True)
    a, b = torch.randint(0, 300, (1, 7)), torch.randint(0, 300, (1, 5))
    with torch.no_grad():
        separate = torch.cat(
            [model(input_ids=a, use_cache=False).logits, model(input_ids=b, use_cache=False).logits], 1
        )
        position_ids = torch.cat([torch.arange(7), torch.arange(5)]).unsqueeze(0)
        packed = model(input_ids=torch.cat([a, b], 1), position_ids=position_ids, use_cache=False).logits
    diff = (packed - separate).abs().max().item()
    if diff > 1e-4:
        raise SystemExit(f"packed {attn} forward differs from separate forwards by {diff}")
    gb.log(f"verl-patched packed forward with {attn} equals separate forwards (max diff {diff:.1e})")


def phase_config(args: argparse.Namespace) -> int:
    p = paths(Path(args.workdir), args.tiny)
    return main_ppo(args, p, ["--cfg", "job"], None, None)


def phase_parse(args: argparse.Namespace) -> int:
    shape = gb.TINY_SHAPE if args.tiny else gb.FULL_SHAPE
    text = args.path.read_text()
    history = parse_jsonl(text) if args.path.suffix == ".jsonl" else parse_console(text)
    res = write_result(args.out, history, shape, {"parsed_from": str(args.path)})
    return 0 if "summary" in res else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("phase", choices=["prepare", "check", "config", "run", "parse"])
    parser.add_argument("path", nargs="?", type=Path, help="parse: verl's console log or file-logger JSONL")
    parser.add_argument("--out", type=Path, default=Path("bench-out/verl.json"))
    parser.add_argument("--workdir", default="/tmp/rlkube-bench")
    parser.add_argument("--steps", type=int, default=4, help="GRPO steps (the first is warm-up)")
    parser.add_argument("--micro", type=int, default=16, help="ppo/log-prob micro-batch per GPU (rlkube's)")
    parser.add_argument("--max-token-len", type=int, default=0, help="dynamic-batch token budget; 0: micro x 768")
    parser.add_argument("--dynamic-bsz", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--gradient-checkpointing", action=argparse.BooleanOptionalAction, default=False)
    parser.add_argument("--free-cache-engine", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--gpu-util", type=float, default=0.5, help="rollout.gpu_memory_utilization")
    parser.add_argument("--remove-padding", action=argparse.BooleanOptionalAction, default=False)
    parser.add_argument("--attn", default="sdpa", help="attn_implementation (flash_attention_2 needs flash-attn)")
    parser.add_argument("--verl-site", default=VERL_SITE, help="verl's site for main_ppo (env VERL_SITE)")
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--tiny", action="store_true", help="tiny model and shape (CPU checks of prepare/config)")
    parser.add_argument(
        "--override", dest="extra", action="append", default=[], help="one more Hydra override (repeatable)"
    )
    args = parser.parse_args(argv)
    if args.phase == "prepare":
        prepare(Path(args.workdir), args.steps, args.tiny)
        return 0
    if args.phase == "check":
        return phase_check(args)
    if args.phase == "config":
        return phase_config(args)
    if args.phase == "parse":
        if args.path is None:
            parser.error("parse needs the path of verl's log or JSONL")
        return phase_parse(args)
    return phase_run(args)


if __name__ == "__main__":
    sys.exit(main())
