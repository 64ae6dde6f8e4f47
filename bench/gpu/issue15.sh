#!/usr/bin/env bash
# Issue 15's benchmarks on one GPU host whose transfers are limited, one phase per call, all
# back to back on the same machine (state between calls lives under /tmp/issue15):
#
#   bash bench/gpu/issue15.sh stage      # after each carried batch (bench/gpu/carry/b*, carry-vllm-next/b*)
#   bash bench/gpu/issue15.sh install    # once every batch is there: vLLM 0.24 site, vLLM 0.26 site
#   bash bench/gpu/issue15.sh rollout    # rollout options (rollout_bench.py), 0.24 then 0.26
#   bash bench/gpu/issue15.sh rlkube     # GRPO and PPO steps with the rollout options that paid
#   bash bench/gpu/issue15.sh rlkube-next  # GRPO steps on vLLM 0.26 (its site first on the path)
#   bash bench/gpu/issue15.sh trl        # TRL 1.16 GRPOTrainer, its default precision, HF generation
#   bash bench/gpu/issue15.sh verl-install  # with bench/gpu/carry/verl carried (fetch_verl_wheels.sh)
#   bash bench/gpu/issue15.sh verl       # verl 0.9.1 main_ppo, GRPO, FSDP + vLLM, same shape
#   bash bench/gpu/issue15.sh packing    # padded vs packed forward+backward (packing_bench.py)
#
# Every phase writes its JSON and log to $OUT (the device tool's folder) and /tmp/issue15.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
state=/tmp/issue15
out="${OUT:-$state/out}"
mkdir -p "$state" "$out"
export PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0 TOKENIZERS_PARALLELISM=false
export RLKUBE_COMMIT="${RLKUBE_COMMIT:-$(cat "$here/../../.commit" 2>/dev/null || echo unknown)}"
site=/tmp/rlkube-site
next_site=/tmp/vllm-next-site

keep() {  # keep() NAME: copy $out/NAME to the state folder, for later phases
  cp "$out/$1" "$state/$1"
}

case "${1:?phase}" in
  stage)
    bash "$here/stage.sh" || true
    if compgen -G "$here/carry-vllm-next/b*" >/dev/null; then
      mkdir -p /tmp/vllm-next-wheels
      for batch in "$here"/carry-vllm-next/b*/; do cp -u "$batch"/* /tmp/vllm-next-wheels/; done
      echo "vllm-next staged: $(find /tmp/vllm-next-wheels -maxdepth 1 -type f | wc -l) files"
    fi
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    ;;
  install)
    bash "$here/install.sh"
    STAGE=/tmp/vllm-next-wheels SITE="$next_site" PYTHONPATH="$site" bash "$here/install_vllm_next.sh"
    ;;
  rollout)
    export PYTHONPATH="$site"
    python3 "$here/rollout_bench.py" run --repeats "${REPEATS:-1}" --out "$out/rollout.json" 2>&1 |
      grep -E "rollout_bench|Error|error" | tee "$out/rollout.log"
    keep rollout.json
    python3 "$here/rollout_bench.py" run --repeats "${REPEATS:-1}" --variants "${NEXT_VARIANTS:-base,no_prefix}" \
      --site "$next_site" --out "$out/rollout-next.json" 2>&1 | grep -E "rollout_bench|Error|error" |
      tee "$out/rollout-next.log" || true
    ;;
  rlkube)
    export PYTHONPATH="$site"
    # The rollout options that paid in the rollout phase (single engine; see rollout_bench.py).
    mapfile -t settings < <(python3 - "$state/rollout.json" <<'PY'
import json, sys
from pathlib import Path
path = Path(sys.argv[1])
res = json.loads(path.read_text()) if path.exists() else {}
def rate(name):
    return res.get(name, {}).get("best_tokens_per_s", 0.0)
prefix_off = rate("no_prefix") > rate("base")
print(f"rollout.enable_prefix_caching={'false' if prefix_off else 'true'}")
if rate("no_prefix_big_batches") > max(rate("no_prefix"), rate("base")):
    print("rollout.max_num_batched_tokens=65536")
    print("rollout.max_num_seqs=1024")
PY
    )
    args=()
    for s in "${settings[@]}" ${EXTRA_SET:-}; do args+=(--set "$s"); done
    echo "settings: ${args[*]}"
    python3 "$here/grpo_bench.py" rlkube --out "$out/rlkube.json" --steps 4 --ppo-steps 3 --budget "${BUDGET:-330}" \
      --skip weight_sync,rollout_variants,profile_actor,profile_rollout,actor_update_variants,grpo_kl \
      "${args[@]}" 2>&1 | grep -vE "^(INFO|WARNING|\(EngineCore)" | tail -40 | tee "$out/rlkube.log"
    keep rlkube.json
    ;;
  rlkube-next)
    export PYTHONPATH="$next_site:$site"
    python3 -c "import vllm; print('vllm', vllm.__version__)"
    python3 "$here/grpo_bench.py" rlkube --out "$out/rlkube-vllm-next.json" --steps 4 --budget "${BUDGET:-330}" \
      --skip weight_sync,rollout_variants,profile_actor,profile_rollout,ppo,actor_update_variants,grpo_kl \
      2>&1 | grep -vE "^(INFO|WARNING|\(EngineCore)" | tail -40 | tee "$out/rlkube-vllm-next.log"
    ;;
  trl)
    export PYTHONPATH="$site"
    python3 "$here/grpo_bench.py" trl --generation hf --steps 4 --out "$out/trl-hf.json" 2>&1 |
      grep -vE "^(INFO|WARNING)" | tail -20 | tee "$out/trl-hf.log"
    keep trl-hf.json
    ;;
  verl-install)
    bash "$here/install-verl.sh"
    PYTHONPATH="$site" python3 "$here/verl_bench.py" check 2>&1 | tail -5
    ;;
  verl)
    PYTHONPATH="$site" python3 "$here/verl_bench.py" run --steps "${VERL_STEPS:-3}" --out "$out/verl.json" 2>&1 |
      grep -E "verl summary|Error|error" | tail -20 || true
    keep verl.json
    ;;
  packing)
    python3 "$here/packing_bench.py" --out "$out/packing.json" 2>&1 | tail -20 | tee "$out/packing.log"
    ;;
  *)
    echo "unknown phase $1" >&2
    exit 2
    ;;
esac
