#!/usr/bin/env bash
# Staging and installing on a GPU host that has no package index. The wheels are fetched on a
# machine with one (fetch_wheels.sh, fetch_verl_wheels.sh, fetch_vllm_next.sh, `wheels.py pack`
# for Ray) and travel in batches, one device call each, under bench/gpu/ or under
# .gpu-carry/ (a folder of the checkout that ignores itself, linked here):
#
#   carry/bN            rlkube's site: vLLM (requirements-gpu.txt's pin), TRL, ...  (fetch_wheels.sh)
#   carry/verl/bN       verl 0.9.1's site with its own vLLM                       (fetch_verl_wheels.sh)
#   tools/*.whl         py-spy, liger-kernel, obstore, pytest (+ pluggy, iniconfig)  (pip download)
#   carry-vllm-next/bN  another vLLM release to compare with the pin             (fetch_vllm_next.sh)
#   carry-ray/bN        Ray, when carry/ left it out                             (wheels.py pack)
#
#   bash bench/gpu/setup.sh stage      # after each carried batch: copies it to /tmp, where it stays
#                                      # while the host does; says which of rlkube's batches are missing
#   bash bench/gpu/setup.sh install    # once rlkube's batches are staged: its site (install.sh), then
#                                      # whatever else is staged: Ray, verl's site, the tools; compileall
#   bash bench/gpu/setup.sh vllm-next  # another vLLM's parts, installed alone once all came (NEXT=1
#                                      # in run.sh puts it in front of rlkube's site)
#   bash bench/gpu/setup.sh ray        # Ray's parts, into rlkube's site once all came
#
# bench/gpu/run.sh passes these four phases here.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
state=/tmp/rlkube-gpu
site=/tmp/rlkube-site
liger=/tmp/liger-site
next=/tmp/vllm-next-site
mkdir -p "$state"
elapsed() { echo "[$(date -u +%T)] $*"; }

# The helper scripts read bench/gpu/carry and bench/gpu/carry-vllm-next.
for d in carry carry-vllm-next; do
  if [ -d "$root/.gpu-carry/$d" ]; then rm -rf "${here:?}/$d" && ln -s "$root/.gpu-carry/$d" "$here/$d"; fi
done
tools_dir="$here/tools"
if [ -d "$root/.gpu-carry/tools" ]; then tools_dir="$root/.gpu-carry/tools"; fi

case "${1:?phase: stage, install, vllm-next or ray}" in
  stage)
    bash "$here/stage.sh" || true
    if compgen -G "$here/carry/verl/b*" >/dev/null; then
      mkdir -p /tmp/verl-wheels && cp -u "$here"/carry/verl/b*/* /tmp/verl-wheels/ && echo "verl staged"
    fi
    if compgen -G "$tools_dir/*.whl" >/dev/null; then
      mkdir -p $state/tools && cp -u "$tools_dir"/*.whl $state/tools/ && echo "tools staged"
    fi
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader
    ;;
  ray)
    mkdir -p $state/ray-stage $state/ray-wheel
    for batch in "$root"/.gpu-carry/carry-ray/b*/ "$here"/carry-ray/b*/; do [ -d "$batch" ] && cp -u "$batch"/* $state/ray-stage/; done
    if python3 "$here/wheels.py" assemble $state/ray-stage $state/ray-wheel; then
      python3 -m pip install -q --no-index --no-deps --no-compile --target $site $state/ray-wheel/ray-*.whl && echo "ray installed"
    fi
    ;;
  vllm-next)
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
      if [ -d $state/ray-wheel ] && compgen -G "$state/ray-wheel/ray-*.whl" >/dev/null; then
        python3 -m pip install -q --no-index --no-deps --no-compile --target $site $state/ray-wheel/ray-*.whl
      fi
    fi
    if [ -d /tmp/verl-wheels ] && [ ! -d /tmp/verl-site/verl ]; then
      bash "$here/install-verl.sh" 2>&1 | tail -2 || echo "verl install failed"
    fi
    for w in "$state"/tools/*.whl; do
      [ -f "$w" ] || continue
      case "$w" in
        *py_spy*) python3 -m pip install -q --no-index --no-deps --target /tmp/tools-site "$w" ;;
        # liger-kernel for model.use_liger; obstore because the driver imports the object
        # store's fsspec filesystem (checkpoint/objectstore.py).
        *liger* | *obstore*) python3 -m pip install -q --no-index --no-deps --no-compile --target $liger "$w" ;;
        # The GPU-only tests (run.sh gpu-tests).
        *pytest* | *pluggy* | *iniconfig*) python3 -m pip install -q --no-index --no-deps --target /tmp/test-site "$w" ;;
      esac
    done
    # The sites are installed --no-compile: every process of every run would otherwise compile
    # the same sources to bytecode at start (40-62 % of verl's start-up samples).
    t=$(date +%s)
    python3 -m compileall -q -j 0 $site /tmp/verl-site $liger >/dev/null 2>&1 || true
    elapsed "compileall: $(($(date +%s) - t)) s"
    # peft comes from the carried site (the trainer's lock's version), not the image's own.
    PYTHONPATH=$site python3 -c "import peft, transformers; print(f'peft {peft.__version__} ({peft.__file__}), transformers {transformers.__version__}')" ||
      true
    ;;
  *)
    echo "unknown phase $1 (stage, install, vllm-next, ray)" >&2
    exit 2
    ;;
esac
