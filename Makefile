# Plexus: the README's two commands are `make demo` and `make test`.
VENV := .venv
PY := $(VENV)/bin/python3
PYTEST := $(VENV)/bin/pytest

.PHONY: setup demo test test-quick test-unit test-netns lint

setup:
	@scripts/setup.sh

demo: setup
	$(VENV)/bin/plexus demo

test: setup lint
	$(PYTEST) -q -p no:cacheprovider tests

test-quick: setup
	$(PYTEST) -q -p no:cacheprovider tests/unit

test-unit: test-quick

test-netns: setup
	$(PYTEST) -q -p no:cacheprovider tests/netns

lint: setup
	$(VENV)/bin/ruff check cni meta delegates deviceplugin tests
	$(VENV)/bin/ruff format --check cni meta delegates deviceplugin tests
	$(VENV)/bin/mypy
