#!/usr/bin/env bash
# Run on a machine WITH a package index (not on the GPU host): downloads the wheels of
# requirements-verl.txt for Python 3.12 / x86-64 Linux (building the two sdist-only ones, pure
# Python), slims the vLLM 0.24 wheel as fetch_wheels.sh's VLLM_SLIM does (VLLM_SLIM=0 keeps it whole),
# checks their requirements against requirements-gpu.txt + the host's packages, and packs them into
# bench/gpu/carry/verl/b1, b2, ... (git-ignored; 151 MiB slim, three 60 MiB transfers).
#
#   bench/gpu/fetch_verl_wheels.sh
#
# Then carry each of bench/gpu/carry/verl/bN to the GPU host, `bash bench/gpu/run.sh stage` after each,
# and `run.sh install` (install-verl.sh after install.sh: verl runs on rlkube's site,
# /tmp/rlkube-site, with /tmp/verl-site in front).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
carry="${CARRY:-$here/carry/verl}"
cache="${WHEEL_CACHE:-${TMPDIR:-/tmp}/rlkube-verl-wheels}"
read -r -a pip <<<"${PIP:-python3 -m pip}"
sdist_only='^(antlr4-python3-runtime|pylatexenc)=='

mkdir -p "$cache"
rm -rf "${cache:?}"/*.whl "$cache/sdist"
grep -E '^[A-Za-z0-9]' "$here/requirements-verl.txt" | grep -vE "$sdist_only" >"$cache/binary.txt"
grep -E "$sdist_only" "$here/requirements-verl.txt" >"$cache/sdist.txt"
"${pip[@]}" download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform linux_x86_64 \
  -d "$cache" -r "$cache/binary.txt"
"${pip[@]}" download --no-deps --no-binary=:all: -d "$cache/sdist" -r "$cache/sdist.txt"
"${pip[@]}" wheel --no-deps -w "$cache" "$cache"/sdist/*.tar.gz

count=$(find "$cache" -maxdepth 1 -name "*.whl" | wc -l)
expected=$(grep -cE '^[A-Za-z0-9]' "$here/requirements-verl.txt")
if [ "$count" -ne "$expected" ]; then
  echo "expected $expected wheels, got $count" >&2
  exit 1
fi
if [ "${VLLM_SLIM:-1}" = 1 ]; then
  python3 "$here/wheels.py" slim "$cache"/vllm-*.whl
fi
# What verl's site may rely on: the host's packages and everything rlkube's site carries.
present="$cache/present.txt"
{ cat "$here/host-packages.txt"; grep -E '^[A-Za-z0-9]' "$here/requirements-gpu.txt" | sed 's/[=<>!;[ ].*//'; } >"$present"
python3 "$here/wheels.py" check "$cache" "$present"
python3 "$here/wheels.py" pack "$cache" "$carry" --part-mb "${PART_MB:-25}" --batch-mb "${BATCH_MB:-60}"
ls -d "$carry"/b*
