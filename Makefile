SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: venv vllm-venv binaries test test-unit demo demo-down cluster-up cluster-down crds bench

venv:
	hack/setup-venv.sh

vllm-venv:
	hack/setup-vllm-venv.sh

binaries:
	hack/cluster/build.sh >/dev/null

crds: venv
	$(PY) -m chattts_operator.crdgen

test: venv binaries
	$(PY) -m pytest -q

test-unit: venv
	$(PY) -m pytest -q tests/unit
