# syntax=docker/dockerfile:1
# The serving image: chattts-runtime with the reference PyTorch engine and vLLM (CUDA).
# Build from the repository root: `make images` (buildah, a local Debian base, no registry), or
#   docker build -f deploy/images/runtime.Dockerfile -t chattts-runtime:0.1.0 .
# The operator sets this image on the serving pods (chart value runtime.image). Pods run it
# non-root with a read-only root filesystem: weights at /models/chattts (read-only mount),
# config at /etc/chattts/runtime.yaml, and every cache under /tmp (an emptyDir the operator mounts).
# The NVIDIA driver comes from the node (container toolkit / device plugin); the CUDA
# user-space libraries come with the torch and vLLM wheels.
#
# Dependencies come from one tested set, deploy/images/runtime.constraints.txt (vLLM, torch,
# torchaudio, transformers... all pinned; hack/images/runtime_lock.py writes and checks it), so
# pip resolves at once instead of backtracking through vLLM releases.
# The CPU image (`make images`, chattts-runtime:<version>-cpu) is this file with
#   EXTRAS=runtime,text-zh,text-en  SYSTEM_PACKAGES=""  TORCH_WHEELS=<a folder with the +cpu torch wheel, mounted>
#
# Both carry the language normalizers (extras text-zh, text-en: WeTextProcessing and
# nemo_text_processing, with pynini), which the runtime uses by default
# (text.language_normalizers: installed): digits, dates and amounts are spoken, not dropped.
# They add about 0.7 GB (pynini's libraries are most of it: 650 MB installed). WeTextProcessing's
# wheel ships its compiled Chinese grammars; nemo's English ones are compiled here, at build time,
# into /opt/venv/share/chattts-runtime/grammars (chattts_runtime.text.language.GRAMMAR_DIR),
# so a pod loads them instead of compiling them at start. That step also checks a date and an
# amount come out spelled out.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# The sources, gathered in a stage of their own so that the build stage takes them as one layer (the
# vfs image store copies the whole rootfs, the installed dependencies included, for every layer).
FROM ${PYTHON_IMAGE} AS src
COPY README.md /src/
COPY operator/ /src/operator/
COPY runtime/ /src/runtime/

FROM ${PYTHON_IMAGE} AS build
# The optional extras to install: runtime,vllm,text-zh,text-en (GPU) or runtime,text-zh,text-en (CPU:
# reference engine only).
ARG EXTRAS=runtime,vllm,text-zh,text-en
# nemo_text_processing's cdifflib is published as source only: its C extension needs a compiler
# and the Python headers here (the base is Debian's python3, whose headers are python3-dev). The
# final stage does not get these.
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev python3-dev \
 && rm -rf /var/lib/apt/lists/*
# A folder holding extra wheels (the CPU image: torch +cpu), bind-mounted into the build; empty: none.
ARG TORCH_WHEELS=
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_CERT=/etc/ssl/certs/ca-certificates.crt
WORKDIR /src
# Dependencies first, in their own layer: a code change does not reinstall torch.
# Only what the dependency list is read from: README.md (the package's long description) changes
# with nearly every commit and would make every build reinstall torch.
COPY deploy/images/runtime.constraints.txt pyproject.toml ./
RUN python3 -c 'import os, tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]; \
print("\n".join(p["dependencies"] + [r for e in os.environ["EXTRAS"].split(",") for r in p["optional-dependencies"][e]]))' \
      > requirements.txt \
 && python3 -m venv /opt/venv \
 && /opt/venv/bin/pip install --quiet --constraint runtime.constraints.txt \
      ${TORCH_WHEELS:+--find-links "$TORCH_WHEELS"} --requirement requirements.txt
COPY --from=src /src/ ./
# The package, then the normalizers' grammars, compiled once here (minutes) and checked on a date
# and an amount. One step: the image store's vfs driver copies the whole rootfs (GBs) for every layer.
RUN /opt/venv/bin/pip install --quiet --no-deps . \
 && case ",$EXTRAS," in *,text-en,*|*,text-zh,*) /opt/venv/bin/python -m chattts_runtime.text.language ;; esac

FROM ${PYTHON_IMAGE}
# Triton (used by vLLM and torch.compile) compiles small C launchers at run time: it needs a C
# compiler. The CPU image runs the reference engine only and leaves it out.
ARG SYSTEM_PACKAGES="gcc libc6-dev"
RUN if [ -n "$SYSTEM_PACKAGES" ]; then \
      apt-get update && apt-get install -y --no-install-recommends $SYSTEM_PACKAGES \
      && rm -rf /var/lib/apt/lists/*; fi
ARG VERSION=0.1.0
ARG REVISION=unknown
LABEL org.opencontainers.image.title="chattts-runtime" \
      org.opencontainers.image.description="ChatTTS text-to-speech server with an OpenAI-compatible /v1/audio/speech" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}"
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    HF_HOME=/tmp/hf \
    HF_HUB_OFFLINE=1 \
    VLLM_CACHE_ROOT=/tmp/vllm \
    TRITON_CACHE_DIR=/tmp/triton \
    TORCHINDUCTOR_CACHE_DIR=/tmp/inductor \
    XDG_CACHE_HOME=/tmp/cache \
    MPLCONFIGDIR=/tmp/matplotlib
USER 65532:65532
WORKDIR /tmp
EXPOSE 8000
ENTRYPOINT ["chattts-runtime"]
# Last: every layer after the venv's would be another full copy of it in the vfs image store.
COPY --from=build /opt/venv /opt/venv
