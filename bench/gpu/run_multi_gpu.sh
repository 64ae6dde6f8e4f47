#!/usr/bin/env bash
# Issue 9 on a host with 2 GPUs (vLLM installed as in install.sh, PYTHONPATH set to its site):
#   OUT=results PHASES="learn broadcast tput" bench/gpu/run_multi_gpu.sh
#   (learn-own-gpu instead of learn on a host with 3+ GPUs)
# Every phase runs the pods of an RLJob as processes with the operator's env (local_pods.py).
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${OUT:-$here/../../bench-out}"
work="${WORKDIR:-/tmp/rlkube-mg}"
phases="${PHASES:-learn broadcast tput}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0 TOKENIZERS_PARALLELISM=false RAY_DISABLE_USAGE_STATS=1
export VLLM_ENABLE_V1_MULTIPROCESSING=0
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader | tee "$out/gpus.txt"
python3 "$here/multi_gpu.py" prepare --workdir "$work" 2>&1 | tail -n 5

pods() {  # NAME TIMEOUT GPU-FLAGS...
  local name=$1 timeout=$2
  shift 2
  local started=$SECONDS
  timeout "$((timeout + 30))" python3 "$here/local_pods.py" "$work/jobs/$name.yaml" --out "$work/runs/$name" \
    --timeout "$timeout" --ray-stop "$@" >"$out/$name.log" 2>&1
  local code=$?
  echo "$name: exit $code in $((SECONDS - started)) s"
  mkdir -p "$out/$name"
  cp -r "$work/runs/$name/logs" "$out/$name/" 2>/dev/null
  cp "$work/runs/$name/checkpoints/metrics.jsonl" "$out/$name/" 2>/dev/null
  tail -n 3 "$work/runs/$name/logs/"*controller*.log 2>/dev/null
}

for phase in $phases; do
  case $phase in
    learn)
      pods learn-1gpu 200 --gpus actor=0
      pods learn-2gpu 240 --gpus actor=0,1 --gpus rollout=1
      ;;
    learn-own-gpu)  # 3+ GPUs: the rollout on a GPU of its own
      pods learn-1gpu 200 --gpus actor=0
      pods learn-2gpu 240 --gpus actor=0,1 --gpus rollout=2
      ;;
    broadcast)
      timeout 240 python3 "$here/multi_gpu.py" broadcast --workdir "$work" --out "$out/broadcast.json" 2>&1 | tail -n 4
      ;;
    tput)
      pods tput-colocated 300 --gpus actor=0,1
      pods tput-separate 300 --gpus actor=0 --gpus rollout=1
      ;;
    *) echo "unknown phase $phase" >&2 ;;
  esac
done
python3 "$here/multi_gpu.py" report --workdir "$work" --runs "$out"
