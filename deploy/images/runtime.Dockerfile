# syntax=docker/dockerfile:1
# The serving image: chattts-runtime with the reference PyTorch engine and vLLM (CUDA).
# Build from the repository root:
#   docker build -f deploy/images/runtime.Dockerfile -t chattts-runtime:0.1.0 .
# The operator sets this image on the serving pods (chart value runtime.image). Pods run it
# non-root with a read-only root filesystem: weights at /models/chattts (read-only mount),
# config at /etc/chattts/runtime.yaml, and every cache under /tmp (an emptyDir the operator mounts).
# The NVIDIA driver comes from the node (container toolkit / device plugin); the CUDA
# user-space libraries come with the torch and vLLM wheels.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator/ operator/
COPY runtime/ runtime/
RUN python -m venv /opt/venv && /opt/venv/bin/pip install ".[runtime,vllm]"

FROM ${PYTHON_IMAGE}
# Triton (used by vLLM and torch.compile) compiles small C launchers at run time: it needs a C compiler.
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/*
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    HF_HOME=/tmp/hf \
    HF_HUB_OFFLINE=1 \
    VLLM_CACHE_ROOT=/tmp/vllm \
    TRITON_CACHE_DIR=/tmp/triton \
    TORCHINDUCTOR_CACHE_DIR=/tmp/inductor \
    XDG_CACHE_HOME=/tmp/cache
COPY --from=build /opt/venv /opt/venv
USER 65532:65532
EXPOSE 8000
ENTRYPOINT ["chattts-runtime"]
