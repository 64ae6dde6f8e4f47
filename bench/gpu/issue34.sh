#!/usr/bin/env bash
# Issue 34's device calls (docs/benchmarks.md, "Issue 34 (session 8)"): issue15.sh's phases, with
# the carried batches under CARRY_DIR (a folder the checkout ignores: the device tool sends the
# checkout plus the ignored paths named in its carry list) and a sampled profile of verl's run.
#
#   bash bench/gpu/issue34.sh stage          # after each carried batch
#   bash bench/gpu/issue34.sh install        # vLLM 0.24 site, vLLM 0.26 site, verl site, py-spy
#   bash bench/gpu/issue34.sh rlkube         # GRPO + PPO on vLLM 0.24, then GRPO on vLLM 0.26
#   VERL_ARGS="--remove-padding --attn flex_attention" bash bench/gpu/issue34.sh verl
#
# Outputs go to $OUT (the device tool's folder).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
carry_dir="${CARRY_DIR:-$root/.gpu-carry}"
out="${OUT:-/tmp/issue34/out}"
mkdir -p "$out" /tmp/issue34
# issue15.sh and install-verl.sh read bench/gpu/carry and bench/gpu/carry-vllm-next.
for d in carry carry-vllm-next; do
  if [ -d "$carry_dir/$d" ] && [ ! -e "$here/$d" ]; then ln -s "$carry_dir/$d" "$here/$d"; fi
done
export OUT="$out" PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0 TOKENIZERS_PARALLELISM=false
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True

case "${1:?phase}" in
  stage)
    bash "$here/issue15.sh" stage
    ;;
  install)
    bash "$here/issue15.sh" stage
    # install_vllm_next.sh re-copies from carry-vllm-next/b*, which only the calls that carried
    # them had: point it at the staged copy instead.
    rm -rf "$here/carry-vllm-next" && mkdir -p "$here/carry-vllm-next/b0"
    cp /tmp/vllm-next-wheels/manifest-batches.txt "$here/carry-vllm-next/b0/"
    [ -d /tmp/rlkube-site/vllm ] || bash "$here/install.sh" 2>&1 | tail -4
    STAGE=/tmp/vllm-next-wheels SITE=/tmp/vllm-next-site PYTHONPATH=/tmp/rlkube-site \
      bash "$here/install_vllm_next.sh" 2>&1 | tail -4 || echo "vLLM 0.26 install failed"
    bash "$here/issue15.sh" verl-install 2>&1 | tail -8 || echo "verl install failed"
    if compgen -G "$carry_dir/tools/*.whl" >/dev/null; then
      python3 -m pip install --no-index --no-deps --quiet --target /tmp/tools-site "$carry_dir"/tools/*.whl
    fi
    # verl's packed path with FlexAttention, on CPU: decides the verl call's flags.
    PYTHONPATH=/tmp/verl-site:/tmp/rlkube-site python3 "$here/verl_bench.py" check --remove-padding \
      --attn flex_attention 2>&1 | tail -4 | tee /tmp/issue34/flex-check.log
    if grep -q "config ok" /tmp/issue34/flex-check.log; then
      echo "--remove-padding --attn flex_attention" >/tmp/issue34/verl-args
    fi
    ;;
  rlkube)
    RLKUBE_BUDGET="${RLKUBE_BUDGET:-330}"
    BUDGET="$RLKUBE_BUDGET" bash "$here/issue15.sh" rlkube
    BUDGET="${NEXT_BUDGET:-200}" bash "$here/issue15.sh" rlkube-next
    if [ -n "${WITH_TRL:-}" ]; then bash "$here/issue15.sh" trl; fi
    ;;
  trl)
    bash "$here/issue15.sh" trl
    ;;
  verl)
    # A sampled profile beside the run: GPU utilisation every 2 s, the busiest processes every
    # 15 s, and a py-spy stack dump of the three busiest Ray workers every 30 s.
    echo "verl args: ${VERL_ARGS:-$(cat /tmp/issue34/verl-args 2>/dev/null)}"
    nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv,noheader -lms 2000 \
      >"$out/verl-gpu.csv" 2>&1 &
    smi=$!
    (
      i=0
      while sleep 15; do
        { echo "=== $(date -u +%T)"; top -b -n1 -w 220 -c | sed -n '1,5p;7,22p'; } >>"$out/verl-top.log"
        i=$((i + 1))
        if [ $((i % 2)) -eq 0 ] && [ -x /tmp/tools-site/bin/py-spy ]; then
          for pid in $(ps -eo pid,pcpu,args --sort=-pcpu | awk '/ray::|python/ && !/awk/ {print $1}' | head -3); do
            { echo "=== $(date -u +%T) pid $pid: $(ps -o args= -p "$pid" | cut -c1-120)"
              timeout 10 /tmp/tools-site/bin/py-spy dump --pid "$pid" 2>&1 | head -60; } >>"$out/verl-pyspy.log"
          done
        fi
      done
    ) &
    sampler=$!
    # shellcheck disable=SC2086  # VERL_ARGS is a list of flags
    PYTHONPATH=/tmp/rlkube-site timeout "${VERL_TIMEOUT:-560}" python3 "$here/verl_bench.py" run \
      --steps "${VERL_STEPS:-3}" --out "$out/verl.json" ${VERL_ARGS:-$(cat /tmp/issue34/verl-args 2>/dev/null)} 2>&1 |
      grep -E "verl summary|step:|Error|error|Traceback" | cut -c1-2000 | tail -30 || true
    kill "$sampler" "$smi" 2>/dev/null || true
    # A run cut by the timeout leaves verl's Ray cluster up: stop it (frees the GPU).
    PYTHONPATH=/tmp/verl-site:/tmp/rlkube-site python3 -m ray.scripts.scripts stop --force >/dev/null 2>&1 || true
    # A run cut by the timeout leaves no JSON: the per-step lines from verl's own log.
    if [ ! -f "$out/verl.json" ] && [ -f "$out/verl.log" ]; then
      PYTHONPATH=/tmp/verl-site:/tmp/rlkube-site python3 "$here/verl_bench.py" parse "$out/verl.log" \
        >"$out/verl-parsed.txt" 2>&1 || true
    fi
    if [ -f "$out/verl.log" ]; then
      grep -E "step:[0-9]" "$out/verl.log" | cut -c1-6000 >"$out/verl-steps.log" || true
      gzip -f "$out/verl.log"
    fi
    ;;
  *)
    echo "unknown phase $1" >&2
    exit 2
    ;;
esac
