# tt-serve: one entry point for people and CI.
#   make serve   start the server on the embedded default (CPU torch backend, demo model)
#   make serve-replicas N=3   N demo-model replicas on loopback behind sglang-router (Ctrl-C stops)
#   make test    install everything the tests need, then run them
#   make test-fast   the tests not marked slow, from the venv (no lint, nothing else installed)
PYTHON ?= python3.11
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
HOST   ?= 127.0.0.1
PORT   ?= 8000
PYTEST_ARGS ?=

.PHONY: setup serve serve-replicas test test-fast lint fmt nix-tools ttnn-venv clean

setup: $(VENV)/.installed

# torch==2.13.0 goes in first: installed any later, a dependency would pull a multi-GB CUDA build.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[test,dev,bench]'
	touch $@

serve: setup
	$(VENV)/bin/tt-serve serve --host $(HOST) --port $(PORT)

N ?= 3
# The router listens on $(HOST):$(PORT); workers on 127.0.0.1:8100.. (docs/routing.md).
serve-replicas: setup
	$(PY) scripts/serve-replicas --replicas $(N) --host $(HOST) --port $(PORT)

# Nix (Debian's nix-bin) evaluates the NixOS module and invariants offline in tests/nix.
nix-tools:
	@command -v nix-instantiate >/dev/null 2>&1 || { \
	  echo "installing nix-bin (Debian) for tests/nix"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nix-bin >/dev/null; }

# ttnn 0.81.1 ships cp310/cp312 wheels only: tests/tt_host drive it in a separate 3.12 venv.
ttnn-venv:
	bash scripts/setup-ttnn-venv

test: setup nix-tools ttnn-venv
	bash scripts/run-tests $(PYTEST_ARGS)

# The developer loop: every test not marked `slow` (pyproject.toml), nothing installed but the venv.
# tests/nix and tests/tt_host skip when nix-instantiate or .venv-ttnn is missing. pytest's exit
# code 5 (no tests collected) fails, as in scripts/run-tests.
test-fast: setup
	HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false \
	  $(VENV)/bin/python -m pytest -q -m "not slow" -p no:cacheprovider $(PYTEST_ARGS); \
	  rc=$$?; if [ $$rc -eq 5 ]; then \
	    echo "pytest collected no tests: treating as failure" >&2; exit 1; fi; \
	  exit $$rc

lint: setup
	$(VENV)/bin/ruff check tt_serve tests bench scripts
	$(VENV)/bin/ruff format --check tt_serve tests bench scripts
	$(VENV)/bin/mypy tt_serve

fmt: setup
	$(VENV)/bin/ruff format tt_serve tests bench scripts
	$(VENV)/bin/ruff check --fix tt_serve tests bench scripts

clean:
	rm -rf $(VENV) .venv-ttnn .pytest_cache .mypy_cache .ruff_cache
