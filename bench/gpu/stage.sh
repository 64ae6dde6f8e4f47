#!/usr/bin/env bash
# Run on the GPU host after each transfer: copies the batches that arrived under
# bench/gpu/carry/ to STAGE (default /tmp/rlkube-wheels, outside the repository, so it survives
# while the host stays up), and says which batches are still missing.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
stage="${STAGE:-/tmp/rlkube-wheels}"
mkdir -p "$stage"
shopt -s nullglob
for batch in "$here"/carry/b*/; do
  cp -u "$batch"/* "$stage"/
  count=$(find "$batch" -maxdepth 1 -type f ! -name 'manifest-*' ! -name fetch-info.txt | wc -l)
  echo "staged $(basename "$batch"): $count files"
done
if [ ! -f "$stage/manifest-batches.txt" ]; then
  echo "nothing staged yet" >&2
  exit 1
fi
missing=$(while read -r batch _ name; do [ -f "$stage/$name" ] || echo "$batch"; done <"$stage/manifest-batches.txt" | sort -u | tr '\n' ' ')
echo "stage $stage: $(du -sh "$stage" | cut -f1); batches still missing: ${missing:-none}"
