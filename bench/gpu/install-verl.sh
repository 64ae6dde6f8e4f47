#!/usr/bin/env bash
# Run on the GPU host after install.sh, once every bench/gpu/carry/verl/bN has arrived: verifies and
# installs verl's wheels (requirements-verl.txt) into VERL_SITE (default /tmp/verl-site) and checks
# that verl's trainer, FSDP engine workers, vLLM server and agent loop import with VERL_SITE in
# front of rlkube's site. verl_bench.py puts VERL_SITE in front for verl's run only.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
stage="${VERL_STAGE:-/tmp/verl-wheels}"
site="${VERL_SITE:-/tmp/verl-site}"
rlkube_site="${SITE:-/tmp/rlkube-site}"
python="${PYTHON:-python3}"

t0=$(date +%s.%N)
mkdir -p "$stage"
shopt -s nullglob
for batch in "$here"/carry/verl/b*/; do cp -u "$batch"/* "$stage"/; done
"$python" "$here/wheels.py" assemble "$stage" "$stage/wheels"
rm -rf "$site"
"$python" -m pip install --no-index --no-deps --no-compile --no-cache-dir --disable-pip-version-check \
  --quiet --target "$site" "$stage/wheels"/*.whl
t1=$(date +%s.%N)
PYTHONPATH="$site:$rlkube_site" VLLM_USE_FLASHINFER_SAMPLER=0 "$python" - <<'PY'
import time
t = time.perf_counter()
import torch, transformers, trl, vllm, verl
import transfer_queue
import verl.trainer.main_ppo, verl.trainer.ppo.v1, verl.workers.engine_workers
import verl.workers.engine.fsdp.transformer_impl, verl.workers.rollout.vllm_rollout.vllm_async_server
import verl.experimental.agent_loop.single_turn_agent_loop, verl.experimental.reward_loop
assert transformers.__version__ == "5.9.0", transformers.__file__
print(f"verl import ok ({time.perf_counter() - t:.1f} s): verl {verl.__version__}, transformers {transformers.__version__}, "
      f"trl {trl.__version__}, vllm {vllm.__version__}, torch {torch.__version__}, cuda {torch.cuda.is_available()}")
PY
t2=$(date +%s.%N)
awk -v a="$t0" -v b="$t1" -v c="$t2" -v s="$(du -sh "$site" | cut -f1)" 'BEGIN {
  printf "verl install timing: verify+install %.1f s, import check %.1f s; %s installed\n", b-a, c-b, s }'
