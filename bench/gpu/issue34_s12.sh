#!/usr/bin/env bash
# Issue 34, session 12 (docs/benchmarks.md, "GPU: issue 34 (session 12)"): the device calls, back
# to back on one machine. The device tool sends the session's checkout (main) plus the ignored
# paths named in `carry`; this branch travels as .gpu-carry/src.tgz (git archive) and is unpacked
# over that checkout first, the wheel batches as .gpu-carry/carry/bN, .gpu-carry/carry/verl,
# .gpu-carry/carry-vllm-next/bN and .gpu-carry/tools (py-spy, liger-kernel).
#
#   bash bench/gpu/issue34_s12.sh stage           # after each carried batch (copies to /tmp)
#   bash bench/gpu/issue34_s12.sh install-main    # vLLM 0.24 site (/tmp/rlkube-site)
#   bash bench/gpu/issue34_s12.sh install-rest    # verl site, tools, vLLM 0.26 site (whatever is staged)
#   bash bench/gpu/issue34_s12.sh pair            # GRPO on vLLM 0.24, then on vLLM 0.26
#   bash bench/gpu/issue34_s12.sh verl-start      # verl alone, in the background (setsid), with a sampled profile
#   WAIT_S=560 bash bench/gpu/issue34_s12.sh verl-wait   # wait for it; FINAL=1 stops it; copies what it has to $OUT
#   bash bench/gpu/issue34_s12.sh liger           # model.use_liger: logits check, actor update plain vs liger (liger_bench.py)
#
# Outputs go to $OUT (the device tool's folder; emptied before each call): at most 8 files.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
carry_dir="${CARRY_DIR:-$root/.gpu-carry}"
out="${OUT:-/tmp/i34/out}"
state=/tmp/i34
vout=$state/verl-out
mkdir -p "$out" "$state"
export OUT="$out" PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0 TOKENIZERS_PARALLELISM=false
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
export RLKUBE_COMMIT="${RLKUBE_COMMIT:-$(cat "$root/.commit" 2>/dev/null || echo unknown)}"
site=/tmp/rlkube-site
next_site=/tmp/vllm-next-site
elapsed() { echo "[$(date -u +%T)] $*"; }

# The scripts this calls read bench/gpu/carry and bench/gpu/carry-vllm-next.
for d in carry carry-vllm-next; do
  if [ -d "$carry_dir/$d" ]; then rm -rf "${here:?}/$d" && ln -s "$carry_dir/$d" "$here/$d"; fi
done

grpo() {  # grpo NAME PYTHONPATH [--set k=v ...]: GRPO steps at the benchmark shape, nothing else
  local name=$1 path=$2
  shift 2
  elapsed "GRPO $name (PYTHONPATH=$path $*)"
  PYTHONPATH="$path" timeout "${RUN_TIMEOUT:-260}" python3 "$here/grpo_bench.py" rlkube --out "$out/$name.json" \
    --steps "${STEPS:-4}" --budget 600 \
    --skip weight_sync,rollout_variants,profile_actor,profile_rollout,ppo,actor_update_variants,grpo_kl "$@" \
    >"$state/$name.full.log" 2>&1 || echo "GRPO $name exited with $?"
  grep -vE "^(INFO|WARNING|\(EngineCore)|Capturing|Loading|Writing" "$state/$name.full.log" | cut -c1-600 |
    tail -25 | tee "$out/$name.log"
}

case "${1:?phase}" in
  stage)
    bash "$here/issue15.sh" stage
    if compgen -G "$here/carry/verl/b*" >/dev/null; then
      mkdir -p /tmp/verl-wheels && cp -u "$here"/carry/verl/b*/* /tmp/verl-wheels/ && echo "verl staged"
    fi
    if compgen -G "$carry_dir/tools/*.whl" >/dev/null; then
      mkdir -p $state/tools && cp -u "$carry_dir"/tools/*.whl $state/tools/ && echo "tools staged"
    fi
    ;;
  install-main)
    [ -d $site/vllm ] || bash "$here/install.sh" 2>&1 | tail -3
    ;;
  install-rest)
    if [ -d /tmp/verl-wheels ] && [ ! -d /tmp/verl-site/verl ]; then
      bash "$here/install-verl.sh" 2>&1 | tail -3 || echo "verl install failed"
    fi
    if compgen -G "$state/tools/*.whl" >/dev/null; then
      for w in "$state"/tools/*.whl; do
        case "$w" in
          *py_spy*) python3 -m pip install -q --no-index --no-deps --target /tmp/tools-site "$w" ;;
          *liger*) python3 -m pip install -q --no-index --no-deps --target /tmp/liger-site "$w" ;;
        esac
      done
      find /tmp/tools-site/bin /tmp/liger-site -maxdepth 1 2>&1 | tr '\n' ' '
      echo
    fi
    if [ -f /tmp/vllm-next-wheels/manifest-batches.txt ] && [ ! -d $next_site/vllm ]; then
      # install_vllm_next.sh copies from carry-vllm-next/b* first: point it at the staged copy.
      rm -rf "$here/carry-vllm-next" && mkdir -p "$here/carry-vllm-next/b0"
      cp /tmp/vllm-next-wheels/manifest-batches.txt "$here/carry-vllm-next/b0/"
      STAGE=/tmp/vllm-next-wheels SITE=$next_site PYTHONPATH=$site bash "$here/install_vllm_next.sh" 2>&1 | tail -2 ||
        echo "vLLM 0.26 install failed"
    fi
    ;;
  pair)
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader
    grpo grpo-vllm024 $site
    grpo grpo-vllm026 $next_site:$site
    ;;
  verl-start)
    # verl alone (nothing else on the GPU), verl_bench.py's defaults (issue 15's configuration:
    # SDPA, padded, dynamic batch size), in a process session of its own so that it outlives
    # this call; verl-wait collects it. A sampled profile beside it: GPU every 2 s, top every
    # 10 s, py-spy dumps of the three busiest Python processes every 30 s and a 20 s py-spy
    # record of the busiest one every 60 s.
    rm -rf "$vout" && mkdir -p "$vout"
    setsid nohup bash "$0" verl-run >"$vout/verl-run.log" 2>&1 </dev/null &
    echo $! >"$state/verl-session"
    sleep 2
    elapsed "verl started in the background: session $(cat "$state/verl-session")"
    ;;
  verl-run)
    set +e +o pipefail
    nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used,power.draw,clocks.sm --format=csv,noheader \
      -lms 2000 >"$vout/verl-gpu.csv" 2>&1 &
    smi=$!
    (
      set +e +o pipefail
      i=0
      while sleep 10; do
        { echo "=== $(date -u +%T)"; top -b -n1 -w 200 -c | sed -n '1,5p;7,20p'; } >>"$vout/verl-top.log" 2>&1
        i=$((i + 1))
        [ -x /tmp/tools-site/bin/py-spy ] || continue
        if [ $((i % 3)) -eq 0 ]; then
          for pid in $(ps -eo pid,pcpu,args --sort=-pcpu | awk '/python|ray::/ && !/awk|py-spy|nvidia-smi/ {print $1}' | head -3); do
            { echo "=== $(date -u +%T) pid $pid $(ps -o pcpu=,args= -p "$pid" | cut -c1-140)"
              timeout 10 /tmp/tools-site/bin/py-spy dump --nonblocking --pid "$pid" 2>&1 | head -45; } >>"$vout/verl-pyspy.log" 2>&1
          done
        fi
        if [ $((i % 6)) -eq 0 ]; then
          pid=$(ps -eo pid,pcpu,args --sort=-pcpu | awk '/python|ray::/ && !/awk|py-spy|nvidia-smi/ {print $1}' | head -1)
          [ -n "$pid" ] && timeout 30 /tmp/tools-site/bin/py-spy record --nonblocking -d 20 -r 50 -f raw \
            -o "$vout/record-$(date -u +%H%M%S)-$pid.txt" --pid "$pid" >/dev/null 2>&1 &
        fi
      done
    ) &
    sampler=$!
    # VERL_ARGS is several words on purpose.
    # shellcheck disable=SC2086
    PYTHONPATH=$site timeout "${VERL_TIMEOUT:-1000}" python3 "$here/verl_bench.py" run --steps "${VERL_STEPS:-6}" \
      --out "$vout/verl.json" ${VERL_ARGS:-} >"$vout/verl-console.log" 2>&1
    echo "verl_bench exited with $?" >>"$vout/verl-run.log"
    kill "$sampler" "$smi" 2>/dev/null
    touch "$vout/done"
    ;;
  verl-wait)
    waited=0
    while [ ! -f "$vout/done" ] && [ "$waited" -lt "${WAIT_S:-560}" ]; do
      sleep 5
      waited=$((waited + 5))
    done
    if [ ! -f "$vout/done" ] && [ -n "${FINAL:-}" ]; then
      elapsed "stopping verl"
      # Its process session (verl-start's setsid), then what Ray started on its own.
      sid=$(cat "$state/verl-session")
      pkill -s "$sid" || true
      PYTHONPATH=/tmp/verl-site:$site python3 -m ray.scripts.scripts stop --force >/dev/null 2>&1 || true
      sleep 3
    fi
    elapsed "verl done: $([ -f "$vout/done" ] && echo yes || echo no); waited $waited s"
    tail -3 "$vout/verl-run.log" || true
    log=$vout/verl.log
    [ -f "$log" ] || log=$vout/verl-console.log
    grep -E "step:[0-9]" "$log" | cut -c1-8000 >"$out/verl-steps.log" || true
    grep -oE "step:[0-9]+ .*timing_s/step:[0-9.]+" "$log" | grep -oE "^step:[0-9]+|timing_s/(gen|old_log_prob|update_actor|step):[0-9.]+" | tr '\n' ' ' || true
    echo
    if [ -f "$vout/verl.json" ]; then cp "$vout/verl.json" "$out/"; else
      PYTHONPATH=/tmp/verl-site:$site python3 "$here/verl_bench.py" parse "$log" --out "$out/verl.json" 2>&1 | tail -2 || true
    fi
    grep -E "Traceback|Error" "$vout/verl-console.log" | head -5 || true
    tar czf "$out/verl-profile.tgz" -C "$vout" --exclude=done . 2>/dev/null || true
    ls -la "$out"
    ;;
  liger)
    # Does the flag take effect: the kernels on the model, and the same logits as without them.
    PYTHONPATH=/tmp/liger-site:$site python3 - <<'PY' 2>&1 | grep -vE "^(INFO|WARNING)" | tail -6 | tee "$out/liger-check.log"
import sys, torch
sys.path[:0] = ["trainer", "api"]
from transformers import Qwen2Config, Qwen2ForCausalLM
from rlkube_trainer.model.models import apply_liger
torch.manual_seed(0)
cfg = Qwen2Config(hidden_size=896, intermediate_size=4864, num_hidden_layers=4, num_attention_heads=14,
                  num_key_value_heads=2, vocab_size=4096)
model = Qwen2ForCausalLM(cfg).cuda().to(torch.bfloat16)
ids = torch.randint(0, 4096, (2, 256), device="cuda")
with torch.no_grad():
    plain = model(input_ids=ids).logits.float()
    apply_liger(model)
    liger = model(input_ids=ids).logits.float()
layer = model.model.layers[0]
print("norm forward:", layer.input_layernorm.forward.__qualname__, "| mlp forward:", layer.mlp.forward.__qualname__,
      "| rotary:", sys.modules[type(model).__module__].apply_rotary_pos_emb.__name__)
print(f"liger logits vs plain: max abs diff {(liger - plain).abs().max().item():.3e}, plain max {plain.abs().max().item():.2f}")
PY
    # The actor update alone, plain then liger, the trainer's Actor on a synthetic GRPO batch.
    PYTHONPATH=/tmp/liger-site:$site timeout "${LIGER_TIMEOUT:-200}" python3 "$here/liger_bench.py" \
      --out "$out/liger.json" 2>&1 | grep -E "^\[|Error|error" | grep -v Loading | cut -c1-600 | tail -8 || true
    if [ -n "${GRPO_LIGER:-}" ]; then grpo grpo-liger /tmp/liger-site:$site --set model.use_liger=true; fi
    ;;
  *)
    echo "unknown phase $1" >&2
    exit 2
    ;;
esac
