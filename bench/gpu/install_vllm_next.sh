#!/usr/bin/env bash
# On the GPU host, once bench/gpu/carry-vllm-next/b* have all arrived (fetch_vllm_next.sh; run.sh's
# vllm-next phase does the same from the staged parts):
# verifies and re-joins the wheel and installs it alone into SITE (default /tmp/vllm-next-site);
# its requirements come from /tmp/rlkube-site (install.sh), which goes after it on PYTHONPATH.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
stage="${STAGE:-/tmp/vllm-next-wheels}"
site="${SITE:-/tmp/vllm-next-site}"
mkdir -p "$stage"
for batch in "$here"/carry-vllm-next/b*/; do cp -u "$batch"/* "$stage"/; done
python3 "$here/wheels.py" assemble "$stage" "$stage/wheels"
rm -rf "$site"
python3 -m pip install --no-index --no-deps --no-compile --no-cache-dir --disable-pip-version-check \
  --quiet --target "$site" "$stage"/wheels/*.whl
PYTHONPATH="$site:${PYTHONPATH:-/tmp/rlkube-site}" python3 -c "import vllm; print('vllm', vllm.__version__, 'from', vllm.__file__)"
