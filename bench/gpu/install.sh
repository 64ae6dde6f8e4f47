#!/usr/bin/env bash
# Run on the GPU host once every batch is staged: verifies the manifest, re-joins the split
# wheels, installs them with pip (no index, no dependency resolution) into SITE, and prints
# what was installed and how long each stage took. Then: export PYTHONPATH=$SITE
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
stage="${STAGE:-/tmp/rlkube-wheels}"
site="${SITE:-/tmp/rlkube-site}"
wheels="$stage/wheels"
python="${PYTHON:-python3}"

t0=$(date +%s.%N)
"$python" "$here/wheels.py" assemble "$stage" "$wheels"
t1=$(date +%s.%N)
rm -rf "$site"
"$python" -m pip install --no-index --no-deps --no-compile --no-cache-dir --disable-pip-version-check \
  --quiet --target "$site" "$wheels"/*.whl
t2=$(date +%s.%N)
echo "installed into $site:"
"$python" -m pip list --disable-pip-version-check --path "$site" 2>/dev/null | tail -n +3 | awk '{printf "%s==%s ", $1, $2} END {print ""}'
PYTHONPATH="$site" VLLM_USE_FLASHINFER_SAMPLER=0 "$python" - <<'PY'
import time
t = time.perf_counter()
import torch, transformers, vllm
try:  # TRL is carried for the peer comparison only (LEAVE_OUT in fetch_wheels.sh)
    import trl
    trl_version = trl.__version__
except ImportError:
    trl_version = "not carried"
print(f"import ok: vllm {vllm.__version__} ({time.perf_counter() - t:.1f} s), trl {trl_version}, "
      f"torch {torch.__version__}, transformers {transformers.__version__}, cuda {torch.cuda.is_available()}")
PY
t3=$(date +%s.%N)
awk -v a="$t0" -v b="$t1" -v c="$t2" -v d="$t3" -v s="$(du -sh "$site" | cut -f1)" 'BEGIN {
  printf "install timing: verify+join %.1f s, pip install %.1f s, import check %.1f s; %s installed\n", b-a, c-b, d-c, s }'
