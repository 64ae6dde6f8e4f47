#!/usr/bin/env bash
# The GPU benchmarks, one phase per call: bash bench/gpu/run.sh PHASE
# (docs/benchmarks.md has each scenario's latest numbers and the command that made them).
#
# Setting up (setup.sh; a host without a package index gets its wheels in carried batches):
#   stage, install, vllm-next, ray
#
# Measurements at the benchmark shape (grpo_bench.py: a random-initialised Qwen2.5-0.5B
# architecture, 64 prompts x 8 samples, 256 + 512 tokens, one optimizer step per step):
#   throughput           rlkube GRPO, then PPO with a critic: compiled decoder layers, no LM-head
#                        recompute, critic micro-batch 32 (STEPS, CRITIC_MICRO; NAME: the files)
#   throughput-settings  GRPO + PPO per settings variant: VARIANTS="defaults compiled liger-compiled"
#                        (also: liger)
#   vllm-pair            `throughput` on rlkube's pinned vLLM, then on vllm-next's (PPO_STEPS=0: GRPO only)
#   breakdown            grpo_bench.py rlkube with every section: weight-sync paths, rollout variants,
#                        actor and rollout profiles, GRPO with a KL loss, update variants (BUDGET)
#   update-variants      the actor update alone (liger_bench.py): VARIANTS="plain,nohead,compile,
#                        compile+nohead,liger,liger+nohead"
#   liger-check          model.use_liger takes effect: liger's kernels on the model, logits as without
#   rollout              the rollout options alone (rollout_bench.py), on the pinned vLLM, then on
#                        vllm-next's if installed (VARIANTS, NEXT_VARIANTS, REPEATS)
#   rollout-mp           vLLM's engine core in its own process (grpo_bench.py mp-engine)
#   packing              padded against packed forward+backward (packing_bench.py)
#   async                sync against the asynchronous modes (async_bench.py): RUNS, STEPS, PROFILE=1
#                        (a profiled row per run), EXTRA (more flags)
#   save                 blocking against background checkpoint saves (save_bench.py), SAVE_B
#                        billions of parameters of state (default Qwen2.5-7B's)
# Peers on the same machine, at the same shape:
#   trl                  TRL 1.16 GRPOTrainer (GENERATION=hf or vllm)
#   verl-check           verl's config and model check on CPU (VERL_ARGS)
#   verl-start, verl-wait  verl 0.9.1 in a process session of its own, with a sampled profile (GPU
#                        every 2 s, top, py-spy dumps and records); verl-wait collects it (WAIT_S;
#                        FINAL=1 stops it). VERL_ARGS defaults to verl's fused kernels.
#   verl                 verl-start, then verl-wait with FINAL=1
#   peers                trl, then verl
# Model sizes (scale_bench.py: 32 prompts x 8, micro-batch 4, gradient checkpointing):
#   scale                rlkube at ARCHS (default "3b"), MODEL_DTYPE (bf16), SCALE_ARGS (more flags:
#                        --param-offload, --shape bench, --gpu-util ...)
#   scale-trl            TRL at ARCH (default 3b), grpo_bench's TRL settings
#   lora                 LoRA rank 64 (alpha 128, all-linear) against full fine-tuning, with
#                        nvidia-smi's memory samples: RUNS="7b-lora64 7b-full-bf16" (also 7b-lora64-bf16:
#                        over a bf16 base; 0.5b-lora64, 0.5b-full: at the benchmark shape)
#   lora-sync            the 7B shape's LoRA sync: merged weights, then vLLM adapters (bench/lora_sync.py)
# Several GPUs of one host (the pods of an RLJob as processes, local_pods.py):
#   multi-gpu            MULTI_GPU="learn broadcast placement" (learn-own-gpu instead of learn with
#                        3+ GPUs: the rollout on a GPU of its own)
#   model-parallel       the actor in tensor x pipeline parallel layouts against FSDP alone, one pod
#                        of all the job's GPUs (model_parallel.py): MP_JOBS (default with 8+ GPUs
#                        "mp-32b-tp4pp2 mp-32b-fsdp8", else "mp-7b-tp2pp2 mp-7b-fsdp4 mp-7b-tp2
#                        mp-7b-pp2"), STEPS, MP_TIMEOUT; needs Ray staged (the ray phase)
# Also:
#   gpu-tests            the trainer's GPU-only tests
#   report               grpo_bench.py report over every JSON this machine's phases kept
#   all                  on a host with no transfer limit, every batch copied at once: stage, install,
#                        breakdown, trl (hf and vllm), rollout-mp, verl when carried, report
#
# Every phase writes its JSON and a filtered log to $OUT (the device tool's folder; a call
# brings back a few files) and keeps the JSON under /tmp/rlkube-gpu/results for `report`.
# RUN_TIMEOUT bounds a run, NEXT=1 puts vllm-next's site in front, SET="k=v ..." adds trainer
# settings to rlkube's runs. The results of each scenario go to bench/gpu/results/<scenario>/.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
state=/tmp/rlkube-gpu
results=$state/results
vout=$state/verl-out
out="${OUT:-$state/out}"
mkdir -p "$out" "$results"
export OUT="$out" PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0 TOKENIZERS_PARALLELISM=false
export PYTORCH_CUDA_ALLOC_CONF="${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}"
# The device's copy of the tree may have no git history: a .commit file (or RLKUBE_COMMIT) says.
RLKUBE_COMMIT="${RLKUBE_COMMIT:-$(cat "$root/.commit" 2>/dev/null || git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)}"
export RLKUBE_COMMIT
site=/tmp/rlkube-site
liger=/tmp/liger-site
next=/tmp/vllm-next-site
rlkube_path="${NEXT:+$next:}$liger:$site"
elapsed() { echo "[$(date -u +%T)] $*"; }
keep() { cp "$out/$1" "$results/$1"; }
quiet() { grep -vE "^(INFO|DEBUG|WARNING|\(EngineCore)|Capturing|Loading|Writing|.*it/s\]$" | cut -c1-700; }
gpu() { nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader; }

settings() { # settings VARIANT: the trainer settings of a named variant, as --set flags
  local compiled=(--set actor.compile_decoder_layers=true --set critic.compile_decoder_layers=true
    --set actor.recompute_logits=never)
  case $1 in
    defaults) ;;
    compiled) printf '%s\n' "${compiled[@]}" ;;
    liger) printf '%s\n' --set model.use_liger=true ;;
    liger-compiled) printf '%s\n' --set model.use_liger=true "${compiled[@]}" ;;
    throughput) printf '%s\n' "${compiled[@]}" --set "critic.ppo_micro_batch_size_per_gpu=${CRITIC_MICRO:-32}" ;;
    *)
      echo "unknown settings variant $1" >&2
      return 2
      ;;
  esac
}

rlkube() { # rlkube NAME PYTHONPATH VARIANT: GRPO then PPO steps at the benchmark shape, nothing else
  local name=$1 path=$2 flags skip=weight_sync,rollout_variants,profile_actor,profile_rollout,actor_update_variants,grpo_kl
  mapfile -t flags < <(settings "$3")
  for s in ${SET:-}; do flags+=(--set "$s"); done
  if [ "${PPO_STEPS:-${STEPS:-4}}" = 0 ]; then skip="$skip,ppo"; fi
  elapsed "rlkube $name (PYTHONPATH=$path ${flags[*]})"
  PYTHONPATH="$path" timeout "${RUN_TIMEOUT:-560}" python3 "$here/grpo_bench.py" rlkube --out "$out/$name.json" \
    --steps "${STEPS:-4}" --ppo-steps "${PPO_STEPS:-${STEPS:-4}}" --budget 600 --skip "$skip" "${flags[@]}" \
    >"$state/$name.full.log" 2>&1 || echo "rlkube $name exited with $?"
  quiet <"$state/$name.full.log" | tail -12 | tee "$out/$name.log"
  keep "$name.json" || true
}

scale_run() { # scale_run ARCH TAG [scale_bench.py options]: one run, nvidia-smi's memory samples beside it
  local arch=$1 tag=$2 name="$1-$2" smi status=0
  shift 2
  elapsed "$name: scale_bench.py run --arch $arch --tag $tag $*"
  nvidia-smi --query-gpu=timestamp,memory.used,utilization.gpu,power.draw --format=csv,noheader -lms 2000 \
    >"$out/$name-gpu.csv" 2>&1 &
  smi=$!
  PYTHONPATH=$site python3 "$here/scale_bench.py" run --arch "$arch" --tag "$tag" --out "$out/scale-$name.json" \
    --timeout "${RUN_TIMEOUT:-500}" "$@" >"$state/$name.full.log" 2>&1 || status=$?
  kill "$smi" 2>/dev/null || true
  [ "$status" -eq 0 ] || echo "scale_bench.py exited with $status"
  quiet <"$state/$name.full.log" | tail -40 | tee "$out/$name.log" || true
  echo "most GPU memory in use (nvidia-smi, MiB): $(cut -d, -f2 "$out/$name-gpu.csv" | grep -oE '[0-9]+' | sort -n | tail -1 || true)" |
    tee -a "$out/$name.log"
  gzip -c "$state/$name.full.log" >"$out/$name.full.log.gz"
}

pods() { # pods NAME TIMEOUT GPU-FLAGS...: an RLJob's pods as processes (local_pods.py)
  local name=$1 timeout=$2 work=${WORKDIR:-/tmp/rlkube-mg} started=$SECONDS code=0
  shift 2
  timeout "$((timeout + 30))" python3 "$here/local_pods.py" "$work/jobs/$name.yaml" --out "$work/runs/$name" \
    --timeout "$timeout" --ray-stop "$@" >"$out/$name.log" 2>&1 || code=$?
  echo "$name: exit $code in $((SECONDS - started)) s"
  mkdir -p "$out/$name"
  cp -r "$work/runs/$name/logs" "$out/$name/" 2>/dev/null || true
  cp "$work/runs/$name/checkpoints/metrics.jsonl" "$out/$name/" 2>/dev/null || true
  tail -n 3 "$work/runs/$name/logs/"*controller*.log 2>/dev/null || true
}

phase="${1:?phase (the list is at the top of bench/gpu/run.sh)}"
case "$phase" in
  stage | install | vllm-next | ray)
    exec bash "$here/setup.sh" "$phase"
    ;;
  throughput)
    gpu
    rlkube "${NAME:-throughput}" "$rlkube_path" throughput
    ;;
  throughput-settings)
    gpu
    for variant in ${VARIANTS:-defaults compiled liger-compiled}; do rlkube "rlkube-$variant" "$rlkube_path" "$variant"; done
    ;;
  vllm-pair)
    gpu
    rlkube vllm-pinned "$liger:$site" "${VARIANT:-throughput}"
    rlkube vllm-next "$next:$liger:$site" "${VARIANT:-throughput}"
    ;;
  breakdown)
    gpu
    PYTHONPATH="$rlkube_path" timeout "${RUN_TIMEOUT:-590}" python3 "$here/grpo_bench.py" rlkube --out "$out/breakdown.json" \
      --budget "${BUDGET:-470}" >"$state/breakdown.full.log" 2>&1 || echo "breakdown exited with $?"
    quiet <"$state/breakdown.full.log" | tail -40 | tee "$out/breakdown.log"
    keep breakdown.json || true
    ;;
  update-variants)
    PYTHONPATH="$liger:$site" timeout "${RUN_TIMEOUT:-400}" python3 "$here/liger_bench.py" --out "$out/update.json" \
      --variants "${VARIANTS:-plain,nohead,compile,compile+nohead,liger,liger+nohead}" >"$state/update.full.log" 2>&1 ||
      echo "liger_bench exited with $?"
    quiet <"$state/update.full.log" | grep -E "^\[|Error|error" | tail -12 | tee "$out/update.log"
    ;;
  liger-check)
    PYTHONPATH="$liger:$site" python3 - "$root" <<'PY' 2>&1 | grep -vE "^(INFO|WARNING)" | tail -6 | tee "$out/liger-check.log"
import sys
sys.path[:0] = [f"{sys.argv[1]}/trainer", f"{sys.argv[1]}/api"]
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM
from rlkube_trainer.model.loading import apply_liger
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
    ;;
  rollout)
    PYTHONPATH=$site python3 "$here/rollout_bench.py" run --repeats "${REPEATS:-1}" ${VARIANTS:+--variants "$VARIANTS"} \
      --out "$out/rollout.json" 2>&1 | grep -E "rollout_bench|Error|error" | tee "$out/rollout.log" || true
    if [ -d $next/vllm ]; then
      PYTHONPATH=$site python3 "$here/rollout_bench.py" run --repeats "${REPEATS:-1}" --variants "${NEXT_VARIANTS:-base,no_prefix}" \
        --site $next --out "$out/rollout-vllm-next.json" 2>&1 | grep -E "rollout_bench|Error|error" |
        tee "$out/rollout-vllm-next.log" || true
    fi
    ;;
  rollout-mp)
    PYTHONPATH=$site timeout "${RUN_TIMEOUT:-400}" python3 "$here/grpo_bench.py" mp-engine --out "$out/mp.json" 2>&1 |
      quiet | tail -8 | tee "$out/mp.log" || true
    ;;
  packing)
    PYTHONPATH=$site python3 "$here/packing_bench.py" --repeats "${REPEATS:-2}" --out "$out/packing.json" 2>&1 |
      tail -20 | tee "$out/packing.log"
    ;;
  async)
    args=(--out "$out/async.json" --runs "${RUNS:-sync,colocate_async,colocate_async_one_stream}" --steps "${STEPS:-4}")
    if [ -n "${PROFILE:-}" ]; then args+=(--profile); fi
    for s in ${SET:-}; do args+=(--set "$s"); done
    elapsed "async_bench ${args[*]}"
    # shellcheck disable=SC2086  # EXTRA: a list of flags
    PYTHONPATH="$rlkube_path" timeout "${RUN_TIMEOUT:-560}" python3 "$here/async_bench.py" "${args[@]}" ${EXTRA:-} \
      >"$state/async.full.log" 2>&1 || echo "async_bench exited with $?"
    grep -E "^\[ *[0-9.]+s\]|Error|error|Traceback|^  File" "$state/async.full.log" | cut -c1-400 | tail -30 || true
    PYTHONPATH="$rlkube_path" python3 "$here/async_bench.py" report "$out/async.json" | tee "$out/async-report.md" || true
    gzip -c "$state/async.full.log" >"$out/async-full.log.gz"
    ;;
  save)
    elapsed "save_bench, ${SAVE_B:-7.616} B parameters"
    df -h /tmp /dev/shm | tail -2
    timeout "${RUN_TIMEOUT:-400}" python3 "$here/save_bench.py" $state/save "${SAVE_B:-7.616}" 2>&1 | tail -6 |
      tee "$out/save-${SAVE_B:-7.616}b.log" || true
    ;;
  trl)
    for generation in ${GENERATION:-hf}; do
      elapsed "TRL, $generation generation"
      PYTHONPATH=$site timeout "${RUN_TIMEOUT:-280}" python3 "$here/grpo_bench.py" trl --generation "$generation" --steps 4 \
        --out "$out/trl-$generation.json" >"$state/trl-$generation.full.log" 2>&1 || echo "TRL exited with $?"
      quiet <"$state/trl-$generation.full.log" | tail -8 | tee "$out/trl-$generation.log"
      keep "trl-$generation.json" || true
    done
    ;;
  verl-check)
    # shellcheck disable=SC2086  # VERL_ARGS is a list of flags
    PYTHONPATH=/tmp/verl-site:$site python3 "$here/verl_bench.py" check ${VERL_ARGS:-} 2>&1 | tail -4 | tee "$out/verl-check.log"
    ;;
  verl-start)
    # verl alone on the GPU, in a process session of its own so that it outlives this call.
    rm -rf "$vout" && mkdir -p "$vout"
    setsid nohup bash "$0" verl-run >"$vout/verl-run.log" 2>&1 </dev/null &
    echo $! >"$state/verl-session"
    sleep 2
    elapsed "verl started in the background: session $(cat "$state/verl-session")"
    ;;
  verl-run)
    # What verl-start runs: verl_bench.py with a sampled profile beside it (GPU every 2 s, top every
    # 10 s, py-spy dumps of the three busiest Python processes every 30 s, a 20 s py-spy record of
    # the busiest one every 60 s).
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
    # verl's fused kernels by default: its FSDP engine's chunked linear log-prob and entropy, with
    # no [tokens, vocab] logits (without them, and without flash-attn, verl's log-prob is a Python
    # loop over tokens). VERL_ARGS="" runs verl_bench.py's defaults.
    # shellcheck disable=SC2086  # VERL_ARGS is a list of flags
    PYTHONPATH=$site timeout "${VERL_TIMEOUT:-1000}" python3 "$here/verl_bench.py" run --steps "${VERL_STEPS:-4}" \
      --out "$vout/verl.json" ${VERL_ARGS---override actor_rollout_ref.model.use_fused_kernels=True} >"$vout/verl-console.log" 2>&1
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
      pkill -s "$(cat "$state/verl-session")" || true
      PYTHONPATH=/tmp/verl-site:$site python3 -m ray.scripts.scripts stop --force >/dev/null 2>&1 || true
      sleep 3
    fi
    elapsed "verl done: $([ -f "$vout/done" ] && echo yes || echo no); waited $waited s"
    tail -3 "$vout/verl-run.log" || true
    log=$vout/verl.log
    [ -f "$log" ] || log=$vout/verl-console.log
    grep -E "step:[0-9]" "$log" | cut -c1-8000 >"$out/verl-steps.log" || true
    if [ -f "$vout/verl.json" ]; then cp "$vout/verl.json" "$out/"; else
      PYTHONPATH=/tmp/verl-site:$site python3 "$here/verl_bench.py" parse "$log" --out "$out/verl.json" 2>&1 | tail -2 || true
    fi
    grep -E "Traceback|Error" "$vout/verl-console.log" | head -5 || true
    tar czf "$out/verl-profile.tgz" -C "$vout" --exclude=done . 2>/dev/null || true
    keep verl.json || true
    ;;
  verl)
    bash "$0" verl-start
    FINAL=1 bash "$0" verl-wait
    ;;
  peers)
    bash "$0" trl
    bash "$0" verl
    ;;
  scale)
    read -r -a archs <<<"${ARCHS:-3b}"
    elapsed "sizes ${archs[*]}"
    # shellcheck disable=SC2086  # SCALE_ARGS: a list of flags
    PYTHONPATH=$site timeout "${RUN_TIMEOUT:-400}" python3 "$here/scale_bench.py" run --arch "${archs[@]}" \
      --model-dtype "${MODEL_DTYPE:-bf16}" --steps "${STEPS:-3}" --skip-checkpoint --timeout "${SCALE_TIMEOUT:-360}" \
      ${SCALE_ARGS:-} --out "$out/scale.json" >"$state/scale.full.log" 2>&1 || echo "scale_bench exited with $?"
    quiet <"$state/scale.full.log" | tail -10 | tee "$out/scale.log"
    keep scale.json || true
    ;;
  scale-trl)
    elapsed "TRL, ${ARCH:-3b} shape"
    PYTHONPATH=$site timeout "${RUN_TIMEOUT:-400}" python3 "$here/scale_bench.py" trl --arch "${ARCH:-3b}" --model-dtype bf16 \
      --steps "${STEPS:-3}" --out "$out/trl-${ARCH:-3b}.json" >"$state/trl-scale.full.log" 2>&1 || echo "scale_bench trl exited with $?"
    quiet <"$state/trl-scale.full.log" | grep -E "TRL (step|summary)" | cut -c1-300 | tee "$out/trl-scale.log"
    keep "trl-${ARCH:-3b}.json" || true
    ;;
  lora)
    lora=(--lora-rank 64 --lora-alpha 128 --target-modules all-linear)
    for run in ${RUNS:-7b-lora64 7b-full-bf16}; do
      case $run in
        7b-lora64) scale_run 7b lora64 --steps "${STEPS:-3}" --gpu-util "${GPU_UTIL:-0.3}" --model-dtype fp32 "${lora[@]}" ;;
        # Full fine-tuning's final checkpoint (weights and AdamW moments, about 45 GB) would not
        # fit beside the model on the host's disk: the ranks' parts are skipped.
        7b-full-bf16) scale_run 7b full-bf16 --steps "${STEPS:-3}" --gpu-util "${GPU_UTIL:-0.3}" --model-dtype bf16 --skip-checkpoint ;;
        7b-lora64-bf16)
          scale_run 7b lora64-bf16 --steps "${STEPS:-3}" --gpu-util "${GPU_UTIL:-0.3}" --model-dtype bf16 --skip-checkpoint "${lora[@]}"
          ;;
        0.5b-lora64)
          scale_run 0.5b lora64 --shape bench --steps "${STEPS:-4}" --gpu-util "${GPU_UTIL:-0.25}" --skip-checkpoint "${lora[@]}"
          ;;
        0.5b-full) scale_run 0.5b full --shape bench --steps "${STEPS:-4}" --gpu-util "${GPU_UTIL:-0.25}" --skip-checkpoint ;;
        *) echo "unknown lora run $run" >&2 ;;
      esac
    done
    ;;
  lora-sync)
    # The 7B model of the lora runs, built once (bf16 safetensors, 15 GB), then one process per
    # mode: vLLM wants one engine per process. Adapters go to /dev/shm, as verl's use_shm.
    if [ ! -d /tmp/rlkube-scale/model-7b ]; then
      PYTHONPATH=$site python3 - "$here" <<'PY'
import sys
sys.path.insert(0, sys.argv[1])
from pathlib import Path
from grpo_bench import ensure_model
from scale_bench import _COMMON, ARCHS
ensure_model(Path("/tmp/rlkube-scale/model-7b"), {**_COMMON, **ARCHS["7b"]})
PY
    fi
    mkdir -p /dev/shm/rlkube-adapters
    for mode in merged adapter; do
      elapsed "lora_sync.py --mode $mode"
      PYTHONPATH=$site timeout "${RUN_TIMEOUT:-280}" python3 "$root/bench/lora_sync.py" --mode "$mode" \
        --model /tmp/rlkube-scale/model-7b --device cuda --dtype bfloat16 --rank 64 --prompts 32 --samples 8 \
        --prompt-len 256 --tokens 512 --gpu-util "${GPU_UTIL:-0.3}" --repeats 3 \
        --adapter-dir /dev/shm/rlkube-adapters --out "$out/sync-$mode.json" >"$state/sync-$mode.full.log" 2>&1 ||
        echo "lora_sync.py --mode $mode exited with $?"
      quiet <"$state/sync-$mode.full.log" | tail -25 | tee "$out/sync-$mode.log" || true
      gzip -c "$state/sync-$mode.full.log" >"$out/sync-$mode.full.log.gz"
      rm -rf /dev/shm/rlkube-adapters/*
    done
    ;;
  multi-gpu)
    export RAY_DISABLE_USAGE_STATS=1 VLLM_ENABLE_V1_MULTIPROCESSING=0
    export PYTHONPATH="$site:$root/api:$root/operator:$root/trainer" PATH="$site/bin:$PATH"
    work=${WORKDIR:-/tmp/rlkube-mg}
    nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader | tee "$out/gpus.txt"
    python3 "$here/multi_gpu.py" prepare --workdir "$work" 2>&1 | tail -n 5
    for part in ${MULTI_GPU:-learn broadcast placement}; do
      case $part in
        learn) # the tiny task on 1 GPU, then the actor on 2 with the rollout beside actor rank 1
          pods learn-1gpu 200 --gpus actor=0
          pods learn-2gpu 240 --gpus actor=0,1 --gpus rollout=1
          ;;
        learn-own-gpu) # 3+ GPUs: the rollout on a GPU of its own
          pods learn-1gpu 200 --gpus actor=0
          pods learn-2gpu 240 --gpus actor=0,1 --gpus rollout=2
          ;;
        broadcast)
          timeout 240 python3 "$here/multi_gpu.py" broadcast --workdir "$work" --out "$out/broadcast.json" 2>&1 | tail -n 4 || true
          ;;
        placement) # colocated against separate rollout on two GPUs, at the benchmark shape
          pods tput-colocated 300 --gpus actor=0,1
          pods tput-separate 300 --gpus actor=0 --gpus rollout=1
          ;;
        *) echo "unknown multi-gpu part $part" >&2 ;;
      esac
    done
    python3 "$here/multi_gpu.py" report --workdir "$work" --runs "$out" | tee "$out/report.txt" || true
    ;;
  model-parallel)
    export RAY_DISABLE_USAGE_STATS=1 VLLM_ENABLE_V1_MULTIPROCESSING=0
    export PYTHONPATH="$site:$root/api:$root/operator:$root/trainer" PATH="$site/bin:$PATH"
    export WORKDIR=${WORKDIR:-/tmp/rlkube-mp}
    nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader | tee "$out/gpus.txt"
    if [ "$(wc -l <"$out/gpus.txt")" -ge 8 ]; then mp_jobs="mp-32b-tp4pp2 mp-32b-fsdp8"; else
      mp_jobs="mp-7b-tp2pp2 mp-7b-fsdp4 mp-7b-tp2 mp-7b-pp2"
    fi
    read -r -a mp_jobs <<<"${MP_JOBS:-$mp_jobs}"
    elapsed "model-parallel jobs ${mp_jobs[*]}"
    python3 "$here/model_parallel.py" prepare --workdir "$WORKDIR" --jobs "$(IFS=,; echo "${mp_jobs[*]}")" \
      --steps "${STEPS:-4}" 2>&1 | tail -n 8
    for name in "${mp_jobs[@]}"; do
      pods "$name" "${MP_TIMEOUT:-900}" --gpus "actor=$(python3 "$here/model_parallel.py" gpus "$name")"
    done
    python3 "$here/model_parallel.py" report --workdir "$WORKDIR" --runs "$out" || true
    ;;
  gpu-tests)
    elapsed "GPU-only tests"
    PYTHONPATH="/tmp/test-site:$root/trainer:$root/api:$liger:$site" timeout "${RUN_TIMEOUT:-240}" python3 -m pytest \
      -q -p no:cacheprovider --noconftest -o addopts="" --rootdir "$root" "$root/tests/trainer/test_generation_stream_gpu.py" \
      "$root/tests/trainer/test_optimizer_offload_gpu.py" "$root/tests/trainer/test_checkpoint_stager_gpu.py" 2>&1 |
      tail -15 | tee "$out/gpu-tests.log" || true
    ;;
  report)
    PYTHONPATH=$site python3 "$here/grpo_bench.py" report "$results"/*.json | tee "$out/report.md"
    ;;
  all)
    bash "$0" stage
    bash "$0" install
    bash "$0" breakdown
    GENERATION="hf vllm" bash "$0" trl
    bash "$0" rollout-mp
    if [ -d /tmp/verl-site/verl ]; then bash "$0" verl; fi
    bash "$0" report
    ;;
  *)
    echo "unknown phase $phase (the list is at the top of bench/gpu/run.sh)" >&2
    exit 2
    ;;
esac
