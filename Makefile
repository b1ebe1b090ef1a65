SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
VLLM_PY := .venv-vllm/bin/python

.PHONY: venv vllm-venv binaries lint test test-unit demo demo-down cluster-up cluster-down crds bench

venv:
	hack/setup-venv.sh

vllm-venv:
	hack/setup-vllm-venv.sh

binaries:
	hack/cluster/build.sh >/dev/null

crds: venv
	$(PY) -m chattts_operator.crdgen
	deploy/helm/chattts-operator/hack/sync-crds.sh

# ruff (pyproject [tool.ruff]) and the import contracts (pyproject [tool.importlinter]).
# Needs only .venv: never builds the control plane.
lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports

# The README's test command: lint, then every tier (unit, cluster, helm, runtime in .venv;
# vllm_engine in .venv-vllm).
test: venv lint vllm-venv binaries
	@status=0; \
	$(PY) -m pytest -q --ignore=tests/vllm_engine || status=1; \
	$(VLLM_PY) -m pytest -q tests/vllm_engine || status=1; \
	exit $$status

test-unit: venv
	$(PY) -m pytest -q tests/unit

cluster-up: venv binaries
	$(PY) hack/cluster/localcluster.py up

cluster-down:
	$(PY) hack/cluster/localcluster.py down

# The main job on an embedded default: local cluster + chart + operator + sample ChatTTSDeployments.
demo: venv
	hack/demo.sh

demo-down:
	hack/demo-down.sh

bench: venv binaries
	$(PY) -m bench.runtime
	$(PY) -m bench.autoscaler
	$(PY) -m bench.operator_scale
