#!/usr/bin/env bash
# Run on a machine WITH a package index (not on the GPU host): downloads the wheels of
# requirements-gpu.txt for Python 3.12 / x86-64 Linux, checks each one's requirements against
# what is carried or already on the host, splits wheels over PART_MB into parts and groups
# everything into transfer batches of at most BATCH_MB under bench/gpu/carry/ (git-ignored).
#
#   bench/gpu/fetch_wheels.sh            # full vLLM wheel (any CUDA GPU, MoE models too)
#   VLLM_SLIM=1 bench/gpu/fetch_wheels.sh  # vLLM without FA2/MoE kernels: Hopper+, dense models
#   LEAVE_OUT="trl datasets multiprocess ray" VLLM_SLIM=1 bench/gpu/fetch_wheels.sh
#                                        # the in-process trainer alone (no TRL, no Ray): fewer batches
#
# Then carry bench/gpu/carry/b1, b2, ... to the GPU host (one batch per transfer where transfers
# are limited) and run `bash bench/gpu/run.sh stage` there after each, `run.sh install` at the end.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
carry="${CARRY:-$here/carry}"
cache="${WHEEL_CACHE:-${TMPDIR:-/tmp}/rlkube-gpu-wheels}"
part_mb="${PART_MB:-25}"
batch_mb="${BATCH_MB:-60}"
read -r -a pip <<<"${PIP:-python3 -m pip}"

mkdir -p "$cache"
rm -f "$cache"/*.whl
requirements="$here/requirements-gpu.txt"
if [ -n "${LEAVE_OUT:-}" ]; then
  requirements="$cache/requirements.txt"
  pattern="^($(tr ' ' '|' <<<"$LEAVE_OUT"))=="
  grep -vE "$pattern" "$here/requirements-gpu.txt" >"$requirements"
fi
# --no-deps: the list is complete for the host (see requirements-gpu.txt); pip matches the
# manylinux tags exactly, hence the list of them.
"${pip[@]}" download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_35_x86_64 --platform manylinux_2_34_x86_64 --platform manylinux_2_31_x86_64 \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_26_x86_64 \
  --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux1_x86_64 --platform linux_x86_64 \
  -d "$cache" -r "$requirements"

count=$(find "$cache" -maxdepth 1 -name "*.whl" | wc -l)
expected=$(grep -cE '^[A-Za-z0-9]' "$requirements")
if [ "$count" -ne "$expected" ]; then
  echo "expected $expected wheels, got $count" >&2
  exit 1
fi
if [ "${VLLM_SLIM:-0}" = 1 ]; then
  python3 "$here/wheels.py" slim "$cache"/vllm-*.whl
fi
python3 "$here/wheels.py" check "$cache" "$here/host-packages.txt"
python3 "$here/wheels.py" pack "$cache" "$carry" --part-mb "$part_mb" --batch-mb "$batch_mb"
echo "slim=${VLLM_SLIM:-0} leave_out=${LEAVE_OUT:-}" >"$carry/fetch-info.txt"
for b in "$carry"/b*/; do cp "$carry/fetch-info.txt" "$b"; done
ls -d "$carry"/b*
