#!/usr/bin/env bash
# Issue 34, session 19 (docs/benchmarks.md, "GPU: issue 34 (session 19)"): the device calls, back
# to back on one machine. The device tool sends main's checkout plus the ignored paths named in
# `carry`: the wheel batches as .gpu-carry/carry/bN, .gpu-carry/carry/verl and .gpu-carry/tools
# (py-spy, liger-kernel).
#
#   bash bench/gpu/issue34_s19.sh stage     # after each carried batch (copies to /tmp)
#   bash bench/gpu/issue34_s19.sh next      # another vLLM's parts (fetch_vllm_next.sh, .gpu-carry/carry-vllm-next); NEXT=1 runs rlkube on it
#   bash bench/gpu/issue34_s19.sh ray       # Ray's parts (.gpu-carry/carry-ray), into rlkube's site once all came
#   bash bench/gpu/issue34_s19.sh install   # rlkube's site (requirements-gpu.txt's vLLM), verl's site (its vLLM 0.24), tools; compileall
#   bash bench/gpu/issue34_s19.sh update    # the actor update's kernel variants (liger_bench.py)
#   bash bench/gpu/issue34_s19.sh grpo      # GRPO 4 steps + PPO 3 steps, plain, then model.use_liger
#   bash bench/gpu/issue34_s19.sh trl       # TRL 1.16 GRPOTrainer, HF generation, bf16
#   bash bench/gpu/issue34_s19.sh verl-start / verl-wait   # verl 0.9.1 with its fused kernels (issue34_s12.sh's)
#   bash bench/gpu/issue34_s19.sh scale     # the 3B shape (scale_bench.py; ARCHS="0.5b 3b" for more sizes)
#   bash bench/gpu/issue34_s19.sh trl-scale # TRL at the same 3B shape (ARCH=7b for the 7B one)
#   bash bench/gpu/issue34_s19.sh report    # grpo_bench.py report over every JSON of this machine's run
# Session 21's phases (the settings that replaced the benchmark's patches, the colocated
# generation's CUDA stream, asynchronous checkpoint saves):
#   bash bench/gpu/issue34_s19.sh stream    # the GPU-only tests (rollout/stream.py, the optimizer offload)
#   bash bench/gpu/issue34_s19.sh grpo2     # GRPO + PPO: the defaults, compiled layers without recompute, + liger
#   bash bench/gpu/issue34_s19.sh async     # async_bench.py: sync, colocate_async (its own stream), one stream
#   bash bench/gpu/issue34_s19.sh save      # save_bench.py: blocking against background saves, 7B state
# Session 22's:
#   bash bench/gpu/issue34_s19.sh ppo       # GRPO then PPO, compiled actor and critic layers, no recompute
#                                           # (session 23: STEPS=4, CRITIC_MICRO=32 by default)
#
# Every phase writes its JSON and log to $OUT (at most 8 files come back a call) and keeps the
# JSON in /tmp/i34/results for the report.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
out="${OUT:-/tmp/i34/out}"
state=/tmp/i34
results=$state/results
mkdir -p "$out" "$results"
export OUT="$out" PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0 TOKENIZERS_PARALLELISM=false
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
export RLKUBE_COMMIT="${RLKUBE_COMMIT:-$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)}"
site=/tmp/rlkube-site
liger=/tmp/liger-site
next=/tmp/vllm-next-site  # fetch_vllm_next.sh's vLLM, in front of the site's where NEXT=1 (session 24: 0.26.0 before it was the pin)
elapsed() { echo "[$(date -u +%T)] $*"; }
keep() { cp "$out/$1" "$results/$1"; }
quiet() { grep -vE "^(INFO|WARNING|\(EngineCore)|Capturing|Loading|Writing|.*it/s\]$" | cut -c1-700; }

# The scripts this calls read bench/gpu/carry (stage.sh, install.sh, install-verl.sh).
if [ -d "$root/.gpu-carry/carry" ]; then rm -rf "${here:?}/carry" && ln -s "$root/.gpu-carry/carry" "$here/carry"; fi

grpo() {  # grpo NAME [--set k=v ...]: GRPO steps then PPO steps at the benchmark shape, nothing else
  local name=$1
  shift
  elapsed "rlkube $name ($*)"
  PYTHONPATH="${NEXT:+$next:}$liger:$site" timeout "${RUN_TIMEOUT:-280}" python3 "$here/grpo_bench.py" rlkube --out "$out/$name.json" \
    --steps 4 --ppo-steps 3 --budget 600 \
    --skip weight_sync,rollout_variants,profile_actor,profile_rollout,actor_update_variants,grpo_kl "$@" \
    >"$state/$name.full.log" 2>&1 || echo "rlkube $name exited with $?"
  quiet <"$state/$name.full.log" | tail -12 | tee "$out/$name.log"
  keep "$name.json" || true
}

case "${1:?phase}" in
  stage)
    bash "$here/stage.sh" || true
    if compgen -G "$here/carry/verl/b*" >/dev/null; then
      mkdir -p /tmp/verl-wheels && cp -u "$here"/carry/verl/b*/* /tmp/verl-wheels/ && echo "verl staged"
    fi
    if compgen -G "$root/.gpu-carry/tools/*.whl" >/dev/null; then
      mkdir -p $state/tools && cp -u "$root"/.gpu-carry/tools/*.whl $state/tools/ && echo "tools staged"
    fi
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader
    ;;
  ray)
    # Ray for verl (session 22's batches leave it out): its parts come in .gpu-carry/carry-ray/bN
    # (wheels.py pack of ray==2.60.0, requirements-gpu.txt's pin), one call each; installed into
    # rlkube's site once all are here.
    mkdir -p $state/ray-stage $state/ray-wheel
    for batch in "$root"/.gpu-carry/carry-ray/b*/; do [ -d "$batch" ] && cp -u "$batch"/* $state/ray-stage/; done
    if python3 "$here/wheels.py" assemble $state/ray-stage $state/ray-wheel; then
      python3 -m pip install -q --no-index --no-deps --no-compile --target $site $state/ray-wheel/ray-*.whl && echo "ray installed"
    fi
    ;;
  next)
    # Another vLLM for rlkube's runs (NEXT=1; verl keeps its own site's 0.24.0): its
    # parts come in .gpu-carry/carry-vllm-next/bN, one call each; installed once all are here.
    if [ -d "$root/.gpu-carry/carry-vllm-next" ]; then
      rm -rf "${here:?}/carry-vllm-next" && ln -s "$root/.gpu-carry/carry-vllm-next" "$here/carry-vllm-next"
    fi
    mkdir -p /tmp/vllm-next-wheels
    for batch in "$here"/carry-vllm-next/b*/; do [ -d "$batch" ] && cp -u "$batch"/* /tmp/vllm-next-wheels/; done
    if [ ! -d $next/vllm ] && python3 "$here/wheels.py" assemble /tmp/vllm-next-wheels /tmp/vllm-next-wheels/wheels; then
      python3 -m pip install -q --no-index --no-deps --no-compile --target $next /tmp/vllm-next-wheels/wheels/vllm-*.whl
      python3 -m compileall -q -j 0 $next >/dev/null 2>&1 || true
      PYTHONPATH="$next:$site" python3 -c "import vllm; print('vllm', vllm.__version__, 'from', vllm.__file__)"
    fi
    ;;
  install)
    if [ ! -d $site/vllm ]; then
      bash "$here/install.sh" 2>&1 | tail -3
      # install.sh makes the site anew: Ray, if its parts came before, goes in again.
      [ -d $state/ray-wheel ] && compgen -G "$state/ray-wheel/ray-*.whl" >/dev/null &&
        python3 -m pip install -q --no-index --no-deps --no-compile --target $site $state/ray-wheel/ray-*.whl
    fi
    if [ -d /tmp/verl-wheels ] && [ ! -d /tmp/verl-site/verl ]; then
      bash "$here/install-verl.sh" 2>&1 | tail -2 || echo "verl install failed"
    fi
    for w in "$state"/tools/*.whl; do
      case "$w" in
        *py_spy*) python3 -m pip install -q --no-index --no-deps --target /tmp/tools-site "$w" ;;
        *liger*) python3 -m pip install -q --no-index --no-deps --no-compile --target $liger "$w" ;;
        # The trainer's driver imports the object store's fsspec filesystem (checkpoint/objectstore.py).
        *obstore*) python3 -m pip install -q --no-index --no-deps --no-compile --target $liger "$w" ;;
        # The GPU-only tests (stream phase).
        *pytest* | *pluggy* | *iniconfig*) python3 -m pip install -q --no-index --no-deps --target /tmp/test-site "$w" ;;
      esac
    done
    # The sites are installed --no-compile: every process of every run would otherwise compile
    # the same sources to bytecode at start (40-62 % of verl's start-up samples in session 12).
    t=$(date +%s)
    python3 -m compileall -q -j 0 $site /tmp/verl-site $liger >/dev/null 2>&1 || true
    elapsed "compileall: $(($(date +%s) - t)) s"
    ;;
  update)
    PYTHONPATH="$liger:$site" timeout "${RUN_TIMEOUT:-400}" python3 "$here/liger_bench.py" --out "$out/update.json" \
      --variants "${VARIANTS:-plain,nohead,compile,compile+nohead,liger,liger+nohead}" >"$state/update.full.log" 2>&1 ||
      echo "liger_bench exited with $?"
    quiet <"$state/update.full.log" | grep -E "^\[|Error|error" | tail -12 | tee "$out/update.log"
    keep update.json || true
    ;;
  grpo)
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader
    grpo rlkube-plain
    grpo rlkube-liger --set model.use_liger=true
    ;;
  trl)
    elapsed "TRL"
    PYTHONPATH="$site" timeout "${RUN_TIMEOUT:-240}" python3 "$here/grpo_bench.py" trl --generation hf --steps 4 \
      --out "$out/trl-hf.json" >"$state/trl.full.log" 2>&1 || echo "TRL exited with $?"
    quiet <"$state/trl.full.log" | tail -8 | tee "$out/trl-hf.log"
    keep trl-hf.json || true
    ;;
  verl-start | verl-run)
    # issue34_s12.sh's verl phases (a process session of its own, the sampled profile), with
    # verl's fused kernels: its FSDP engine's fused linear log-prob/entropy, no [tokens, vocab] logits.
    export VERL_ARGS="${VERL_ARGS:---override actor_rollout_ref.model.use_fused_kernels=True}"
    exec bash "$here/issue34_s12.sh" "$1"
    ;;
  verl-wait)
    bash "$here/issue34_s12.sh" verl-wait
    cp "$out/verl.json" "$results/verl.json" 2>/dev/null || true
    ;;
  scale)
    # ARCHS: the sizes, each in a process of its own (session 25: "0.5b 3b", TRL's peers in trl-scale).
    elapsed "sizes ${ARCHS:-3b}"
    read -r -a archs <<<"${ARCHS:-3b}"
    PYTHONPATH="$site" timeout "${RUN_TIMEOUT:-400}" python3 "$here/scale_bench.py" run --arch "${archs[@]}" --model-dtype bf16 \
      --steps 3 --skip-checkpoint --timeout "${SCALE_TIMEOUT:-360}" --out "$out/scale.json" >"$state/scale.full.log" 2>&1 ||
      echo "scale_bench exited with $?"
    quiet <"$state/scale.full.log" | tail -10 | tee "$out/scale.log"
    keep scale.json || true
    ;;
  trl-scale)
    # TRL at the 3B shape (or ARCH), the peer of `scale`'s row: scale_bench.py trl (session 24).
    elapsed "TRL, ${ARCH:-3b} shape"
    PYTHONPATH="$site" timeout "${RUN_TIMEOUT:-400}" python3 "$here/scale_bench.py" trl --arch "${ARCH:-3b}" --model-dtype bf16 \
      --steps 3 --out "$out/trl-${ARCH:-3b}.json" >"$state/trl-scale.full.log" 2>&1 || echo "scale_bench trl exited with $?"
    quiet <"$state/trl-scale.full.log" | grep -E "TRL (step|summary)" | cut -c1-300 | tee "$out/trl-scale.log"
    keep "trl-${ARCH:-3b}.json" || true
    ;;
  stream)
    elapsed "GPU-only tests"
    PYTHONPATH="/tmp/test-site:$root/trainer:$root/api:$liger:$site" timeout "${RUN_TIMEOUT:-240}" python3 -m pytest \
      -q -p no:cacheprovider --noconftest -o addopts="" --rootdir "$root" "$root/tests/trainer/test_generation_stream_gpu.py" \
      "$root/tests/trainer/test_optimizer_offload_gpu.py" "$root/tests/trainer/test_checkpoint_stager_gpu.py" 2>&1 | tail -15 | tee "$out/stream-tests.log" || true
    ;;
  grpo2)
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader
    grpo rlkube-defaults
    grpo rlkube-compiled --set actor.compile_decoder_layers=true --set critic.compile_decoder_layers=true \
      --set actor.recompute_logits=never
    grpo rlkube-liger-compiled --set model.use_liger=true --set actor.compile_decoder_layers=true \
      --set critic.compile_decoder_layers=true --set actor.recompute_logits=never
    ;;
  ppo)
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader
    # Session 23: 4 steps each (row 2 may still carry the compile), the critic's micro-batch apart.
    grpo rlkube-ppo-compiled --steps "${STEPS:-4}" --ppo-steps "${STEPS:-4}" --set actor.compile_decoder_layers=true \
      --set critic.compile_decoder_layers=true --set actor.recompute_logits=never \
      --set critic.ppo_micro_batch_size_per_gpu="${CRITIC_MICRO:-32}"
    ;;
  async)
    elapsed "async_bench"
    PYTHONPATH="$liger:$site" timeout "${RUN_TIMEOUT:-420}" python3 "$here/async_bench.py" --out "$out/async.json" \
      --runs "${RUNS:-sync,colocate_async,colocate_async_one_stream}" --steps "${STEPS:-4}" >"$state/async.full.log" 2>&1 ||
      echo "async_bench exited with $?"
    PYTHONPATH="$liger:$site" python3 "$here/async_bench.py" report "$out/async.json" | tee "$out/async-report.md" || true
    ;;
  save)
    # SAVE_B: billions of parameters of the state (default Qwen2.5-7B's); where it writes, and
    # whether that is memory (a tmpfs /tmp holds the files in RAM beside the staged copy).
    elapsed "save_bench, ${SAVE_B:-7.616} B parameters"
    df -h /tmp/i34 /dev/shm | tail -2
    timeout "${RUN_TIMEOUT:-400}" python3 "$here/save_bench.py" /tmp/i34/save "${SAVE_B:-7.616}" 2>&1 | tail -6 |
      tee "$out/save-${SAVE_B:-7.616}b.log" || true
    ;;
  report)
    PYTHONPATH="$site" python3 "$here/grpo_bench.py" report "$results"/*.json | tee "$out/report.md"
    ;;
  *)
    echo "unknown phase $1" >&2
    exit 2
    ;;
esac
