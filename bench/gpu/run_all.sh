#!/usr/bin/env bash
# The whole issue-8 benchmark on a GPU host, once bench/gpu/carry/ holds every batch (a host with
# no transfer limit: copy all of bench/gpu/carry/ over and run this one command).
#   OUT=results bench/gpu/run_all.sh
# On a host whose transfers are limited, run stage.sh after each batch instead, then the part
# from install.sh on (see docs/benchmarks.md, "GPU: GRPO / PPO on one H200").
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${OUT:-$here/../../bench-out}"
mkdir -p "$out"
export RLKUBE_COMMIT="${RLKUBE_COMMIT:-$(git -C "$here" rev-parse HEAD 2>/dev/null || echo unknown)}"
export PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0 TOKENIZERS_PARALLELISM=false
export PYTORCH_CUDA_ALLOC_CONF="${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}"
bash "$here/stage.sh"
bash "$here/install.sh"
export PYTHONPATH="${SITE:-/tmp/rlkube-site}${PYTHONPATH:+:$PYTHONPATH}"
bench=(python3 "$here/grpo_bench.py")
"${bench[@]}" rlkube --out "$out/rlkube.json" --budget "${BUDGET:-470}" 2>&1 | tee "$out/rlkube.log"
"${bench[@]}" trl --generation hf --out "$out/trl-hf.json" 2>&1 | tee "$out/trl-hf.log" || true
"${bench[@]}" trl --generation vllm --out "$out/trl-vllm.json" 2>&1 | tee "$out/trl-vllm.log" || true
"${bench[@]}" mp-engine --out "$out/mp.json" 2>&1 | tee "$out/mp.log" || true
# verl 0.9.1 (issue 15), when its batch was fetched too (fetch_verl_wheels.sh): its own site in front.
if [ -d "$here/carry/verl" ]; then
  bash "$here/install-verl.sh"
  python3 "$here/verl_bench.py" run --out "$out/verl.json" || true
fi
"${bench[@]}" report "$out"/*.json | tee "$out/report.md"
