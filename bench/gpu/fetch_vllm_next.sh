#!/usr/bin/env bash
# Issue 15's "a newer vLLM built for the host's torch": vLLM 0.26.0 is the newest release that
# still pins torch 2.11.0 (0.27+ need 2.13). Its requirements differ from 0.24's only in
# packages the benchmark never imports (flashinfer, video codecs, nvtx) or already carries in a
# newer version (apache-tvm-ffi), so the vLLM wheel alone travels, slimmed like 0.24's, into
# bench/gpu/carry-vllm-next/b1, b2, ... Run on a machine with a package index; on the GPU host:
#   bash bench/gpu/install_vllm_next.sh     (after every batch has been carried there)
# then put /tmp/vllm-next-site before /tmp/rlkube-site on PYTHONPATH (rollout_bench.py --site).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
version="${VLLM_NEXT:-0.26.0}"
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
