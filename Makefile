# specdistill: the two commands a new user needs are `make quickstart` and `make test`.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.specdistill-installed
export HF_HUB_OFFLINE ?= 1
export HF_DATASETS_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false
export DS_ACCELERATOR ?= cpu

.PHONY: install test test-fast quickstart bench clean

install: $(STAMP)

# torch first (the CPU wheel on disk; nothing may pull a second, CUDA torch), then deepspeed without build
# isolation (its build would otherwise fetch its own torch), then the project with its dev extra.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip setuptools wheel
	$(BIN)/pip install -q torch==2.13.0
	DS_BUILD_OPS=0 $(BIN)/pip install -q --no-build-isolation "deepspeed>=0.16"
	$(BIN)/pip install -q -e ".[dev]"
	$(BIN)/python -c "import torch; assert torch.__version__.startswith('2.13.0'), torch.__version__"
	touch $(STAMP)

test: install
	$(BIN)/python -m pytest -q tests

test-fast: install
	$(BIN)/python -m pytest -q tests -m "not integration"

quickstart: install
	$(BIN)/python scripts/quickstart.py

bench: install
	$(BIN)/python scripts/bench_decode.py

clean:
	rm -rf $(VENV) .pytest_cache
