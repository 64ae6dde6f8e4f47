#!/usr/bin/env bash
# Issue 29's device calls (docs/benchmarks.md, "Issue 29: async vs sync"): the carried wheel
# batches (fetch_wheels.sh with LEAVE_OUT="trl datasets multiprocess ray": three batches) staged
# and installed as in issue 8, then async_bench.py, back to back on one machine:
#
#   bash bench/gpu/issue29.sh stage      # after each carried batch (CARRY_DIR/carry/bN)
#   bash bench/gpu/issue29.sh install    # stage the last batch, install the vLLM 0.24 site
#   RUNS=sync,colocate_async STEPS=5 PROFILE=1 bash bench/gpu/issue29.sh run
#
# CARRY_DIR: a folder the checkout ignores, holding carry/b1.. (the device tool sends the
# checkout plus the ignored paths named in its carry list). Outputs go to $OUT.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
carry_dir="${CARRY_DIR:-$root/.gpu-carry}"
out="${OUT:-/tmp/issue29/out}"
mkdir -p "$out"
# stage.sh reads bench/gpu/carry/b*.
if [ -d "$carry_dir/carry" ] && [ ! -e "$here/carry" ]; then
  ln -s "$(cd "$carry_dir/carry" && pwd)" "$here/carry"
fi
export PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0 TOKENIZERS_PARALLELISM=false
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True

case "${1:?phase}" in
  stage)
    bash "$here/stage.sh" || true
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    ;;
  install)
    bash "$here/stage.sh"
    bash "$here/install.sh" 2>&1 | tail -4
    ;;
  run)
    export PYTHONPATH=/tmp/rlkube-site
    args=(--out "$out/async.json" --runs "${RUNS:-sync,colocate_async}" --steps "${STEPS:-5}")
    if [ -n "${PROFILE:-}" ]; then args+=(--profile); fi
    # shellcheck disable=SC2086  # EXTRA: a list of flags
    timeout "${RUN_TIMEOUT:-560}" python3 "$here/async_bench.py" "${args[@]}" ${EXTRA:-} >"$out/async-full.log" 2>&1 ||
      echo "async_bench.py exited with $?"
    grep -E "^\[ *[0-9.]+s\]|Error|error|Traceback|^  File" "$out/async-full.log" | cut -c1-400 | tail -60 || true
    python3 "$here/async_bench.py" report "$out/async.json" | tee "$out/async-report.md" || true
    gzip -f "$out/async-full.log"
    ;;
  *)
    echo "unknown phase $1" >&2
    exit 2
    ;;
esac
