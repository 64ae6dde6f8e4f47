#!/usr/bin/env bash
# Another vLLM release than requirements-gpu.txt's, for a comparison in the trainer (0.26.0 was
# compared with 0.24.0 this way before it became the pin): VLLM_NEXT names it. Only
# the vLLM wheel travels, slimmed, into bench/gpu/carry-vllm-next/b1, b2, ..., so the release's
# requirements must be met by requirements-gpu.txt's wheels and the host's (check its METADATA).
# Run on a machine with a package index; on the GPU host, after each batch has been carried:
#   bash bench/gpu/run.sh vllm-next     (installs it into /tmp/vllm-next-site once all came)
# then `NEXT=1 bash bench/gpu/run.sh throughput` (or `vllm-pair`, `rollout`) runs on it.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
version="${VLLM_NEXT:?set VLLM_NEXT to the vLLM release to compare, e.g. VLLM_NEXT=0.24.0}"
carry="$here/carry-vllm-next"
cache="${WHEEL_CACHE:-${TMPDIR:-/tmp}/rlkube-gpu-wheels-next}"
read -r -a pip <<<"${PIP:-python3 -m pip}"
rm -rf "$cache" "$carry"
mkdir -p "$cache"
"${pip[@]}" download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 -d "$cache" "vllm==$version"
python3 "$here/wheels.py" slim "$cache"/vllm-*.whl
python3 "$here/wheels.py" pack "$cache" "$carry" --part-mb "${PART_MB:-25}" --batch-mb "${BATCH_MB:-60}"
ls -d "$carry"/b*
