# Plexus: the README's two commands are `make demo` and `make test`.
VENV := .venv
PY := $(VENV)/bin/python3
PYTEST := $(VENV)/bin/pytest

.PHONY: setup demo test test-quick test-py313 test-netns test-runtime test-vm test-cluster bench lint

setup:
	@scripts/setup.sh

# Only what the demo needs (no Go tools, VM kernel or containerd); the time includes setup.
demo:
	@start=$$(date +%s); scripts/setup-base.sh && $(PY) -m tests.demo; rc=$$?; \
	echo "make demo: $$(($$(date +%s) - start)) s, setup included"; exit $$rc

# Every tier, the unit tier on Python 3.13 too; the VM tier runs beside the others.
test: setup lint
	@scripts/test.sh

test-quick: setup
	$(PYTEST) -q -p no:cacheprovider tests/unit

test-py313: setup
	.venv-py313/bin/pytest -q -p no:cacheprovider tests/unit

test-netns: setup
	$(PYTEST) -q -p no:cacheprovider tests/netns

test-runtime: setup
	$(PYTEST) -q -p no:cacheprovider tests/runtime

test-vm: setup
	$(PYTEST) -q -p no:cacheprovider tests/vm

test-cluster: setup
	$(PYTEST) -q -p no:cacheprovider tests/cluster

bench: setup
	$(PY) -m tests.bench.bench_add --runs 30 --extras 1,2,4,8
	$(PY) -m tests.bench.bench_thick --runs 30 --extras 1,2,4,8
	$(PY) -m tests.bench.bench_macvlan --runs 30
	$(PY) -m tests.bench.measure_exec 400
	$(PY) -m tests.bench.bench_instructions --adds 20
	$(PY) -m tests.bench.bench_deviceplugin --runs 30
	$(PY) -m tests.bench.bench_dra --runs 50
	$(PY) -m tests.bench.bench_provision --runs 10
	$(PY) -m tests.bench.bench_whereabouts --runs 30 --burst 100

lint: setup
	$(VENV)/bin/ruff check cni kube meta delegates deviceplugin tests
	$(VENV)/bin/ruff format --check cni kube meta delegates deviceplugin tests
	$(VENV)/bin/mypy
	$(VENV)/bin/mypy --strict tests
