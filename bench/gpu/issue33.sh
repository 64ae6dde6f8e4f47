#!/usr/bin/env bash
# Issue 33, session 14 (docs/benchmarks.md, "GPU: issue 33, LoRA at the 7B shape (session 14)"):
# the device calls, back to back on one machine. The device tool sends main's checkout plus the
# ignored paths named in `carry`; this branch travels as bench/gpu/carry/src.tgz (git archive of
# api/, trainer/ and bench/gpu/ at the commit, unpacked over the checkout first), the wheel
# batches (fetch_wheels.sh: vLLM 0.24 slim, peft, no TRL/Ray) as bench/gpu/carry/bN.
#
#   c="tar xzf bench/gpu/carry/src.tgz && bash bench/gpu/issue33.sh"
#   $c stage      # after each carried batch: copies it to /tmp/rlkube-wheels
#   $c install    # stage, then the vLLM 0.24 site with peft (/tmp/rlkube-site) and an import check
#   $c lora7b     # Qwen2.5-7B shape, LoRA rank 64 (alpha 128, all-linear), fp32 master, colocated vLLM
#   $c full7b     # the same shape fully fine-tuned, bf16 master (fp32 master does not fit: issue 14)
#   $c pair05b    # Qwen2.5-0.5B at issue 8's shape (64x8, micro 16): LoRA rank 64, then full, fp32 master
#   $c lora7b-bf16  # optional: LoRA rank 64 over a bf16 base (modelDtype bf16): what fp32 master costs
#   $c model7b    # the 7B model alone (built once; the runs above build it too)
#   $c syncs      # session 16: bench/lora_sync.py at the 7B shape, rank 64: merged weights, then vLLM
#                 # LoRA adapters (written to /dev/shm, as verl's use_shm), issue 14's generation shape
#
# STEPS (default 3 for 7B, 4 for 0.5B), RUN_TIMEOUT (seconds per run, default 500), GPU_UTIL (vLLM's
# gpu_memory_utilization, default 0.3 for 7B as in issue 14, 0.25 for 0.5B as in issue 8).
# Each run writes to $OUT its JSON (scale_bench.py's), a filtered log, the gzipped full log and
# nvidia-smi's memory samples (every 2 s): at most 8 files a call. The 7B model is built once
# (/tmp/rlkube-scale/model-7b, bf16 safetensors, 15 GB) and reused by the later calls.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
out="${OUT:-/tmp/i33/out}"
state=/tmp/i33
site=/tmp/rlkube-site
mkdir -p "$out" "$state"
export OUT="$out" PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0 TOKENIZERS_PARALLELISM=false
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
# The commit the tarball was made from (git archive writes it into the tar's pax header).
RLKUBE_COMMIT="$(python3 -c 'import sys, tarfile; print(tarfile.open(sys.argv[1]).pax_headers.get("comment", "unknown")[:12])' \
  "$here/carry/src.tgz" 2>/dev/null || echo unknown)"
export RLKUBE_COMMIT
elapsed() { echo "[$(date -u +%T)] $*"; }

scale() { # scale ARCH TAG [scale_bench.py options]: one run in its own process, its files into $OUT
  local arch=$1 tag=$2 name="$1-$2" smi status=0
  shift 2
  elapsed "$name: scale_bench.py run --arch $arch --tag $tag $* (commit $RLKUBE_COMMIT)"
  nvidia-smi --query-gpu=timestamp,memory.used,utilization.gpu,power.draw --format=csv,noheader -lms 2000 \
    >"$out/$name-gpu.csv" 2>&1 &
  smi=$!
  PYTHONPATH=$site python3 "$here/scale_bench.py" run --arch "$arch" --tag "$tag" --out "$out/scale-$name.json" \
    --timeout "${RUN_TIMEOUT:-500}" "$@" >"$state/$name.full.log" 2>&1 || status=$?
  kill "$smi" 2>/dev/null || true
  [ "$status" -eq 0 ] || echo "scale_bench.py exited with $status"
  grep -vE "^(INFO|DEBUG|WARNING|\(EngineCore)|Capturing|Loading|Writing|it/s]" "$state/$name.full.log" |
    cut -c1-600 | tail -40 | tee "$out/$name.log" || true
  echo "most GPU memory in use (nvidia-smi, MiB): $(cut -d, -f2 "$out/$name-gpu.csv" | grep -oE '[0-9]+' | sort -n | tail -1 || true)" |
    tee -a "$out/$name.log"
  gzip -c "$state/$name.full.log" >"$out/$name.full.log.gz"
}

case "${1:?phase}" in
  stage)
    bash "$here/stage.sh" || true
    elapsed "commit $RLKUBE_COMMIT; root $root"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    ;;
  install)
    bash "$here/stage.sh"
    if [ ! -d $site/vllm ]; then bash "$here/install.sh" 2>&1 | tail -4; fi
    # The image has a peft of its own; the carried one (the trainer's lock's) must come first.
    PYTHONPATH=$site python3 -c "
import accelerate, peft, torch, transformers
from peft import LoraConfig, inject_adapter_in_model
print(f'peft {peft.__version__} ({peft.__file__}), transformers {transformers.__version__}, '
      f'accelerate {accelerate.__version__}, torch {torch.__version__}')"
    df -h /tmp | tail -1
    ;;
  lora7b)
    scale 7b lora64 --steps "${STEPS:-3}" --gpu-util "${GPU_UTIL:-0.3}" --model-dtype fp32 \
      --lora-rank 64 --lora-alpha 128 --target-modules all-linear
    ;;
  lora7b-bf16)
    scale 7b lora64-bf16 --steps "${STEPS:-3}" --gpu-util "${GPU_UTIL:-0.3}" --model-dtype bf16 \
      --lora-rank 64 --lora-alpha 128 --target-modules all-linear --skip-checkpoint
    ;;
  full7b)
    # Full fine-tuning's final checkpoint (weights and AdamW moments, about 45 GB) would not
    # fit beside the model on this disk: the ranks' parts are skipped (after the last row).
    scale 7b full-bf16 --steps "${STEPS:-3}" --gpu-util "${GPU_UTIL:-0.3}" --model-dtype bf16 --skip-checkpoint
    ;;
  pair05b)
    scale 0.5b lora64 --shape bench --steps "${STEPS:-4}" --gpu-util "${GPU_UTIL:-0.25}" --skip-checkpoint \
      --lora-rank 64 --lora-alpha 128 --target-modules all-linear
    scale 0.5b full --shape bench --steps "${STEPS:-4}" --gpu-util "${GPU_UTIL:-0.25}" --skip-checkpoint
    ;;
  model7b)
    # The 7B model of the runs above, built once (syncs needs it; its own call so that each
    # stays well inside the device's 600 s).
    PYTHONPATH=$site python3 -c "
import sys; sys.path.insert(0, '$here')
from pathlib import Path
from grpo_bench import ensure_model
from scale_bench import _COMMON, ARCHS
ensure_model(Path('/tmp/rlkube-scale/model-7b'), {**_COMMON, **ARCHS['7b']})"
    du -sh /tmp/rlkube-scale/model-7b
    ;;
  syncs)
    # One process per mode: vLLM wants one engine per process.
    mkdir -p /dev/shm/rlkube-adapters
    for mode in merged adapter; do
      elapsed "lora_sync.py --mode $mode (commit $RLKUBE_COMMIT)"
      PYTHONPATH=$site timeout "${RUN_TIMEOUT:-280}" python3 "$root/bench/lora_sync.py" --mode "$mode" \
        --model /tmp/rlkube-scale/model-7b --device cuda --dtype bfloat16 --rank 64 --prompts 32 --samples 8 \
        --prompt-len 256 --tokens 512 --gpu-util "${GPU_UTIL:-0.3}" --repeats 3 \
        --adapter-dir /dev/shm/rlkube-adapters --out "$out/sync-$mode.json" >"$state/sync-$mode.full.log" 2>&1 ||
        echo "lora_sync.py --mode $mode exited with $?"
      grep -vE "^(INFO|DEBUG|WARNING|\(EngineCore)|Capturing|Loading|Writing|it/s]" "$state/sync-$mode.full.log" |
        cut -c1-600 | tail -25 | tee "$out/sync-$mode.log" || true
      gzip -c "$state/sync-$mode.full.log" >"$out/sync-$mode.full.log.gz"
      rm -rf /dev/shm/rlkube-adapters/*
    done
    ;;
  *)
    echo "unknown phase $1" >&2
    exit 2
    ;;
esac
