# syntax=docker/dockerfile:1
# The operator image: the kopf operator and nothing heavy (no torch, no vLLM).
# Build from the repository root: `make images` (buildah, a local Debian base, no registry), or
#   docker build -f deploy/images/operator.Dockerfile -t chattts-operator:0.1.0 .
# The chart (deploy/helm/chattts-operator) runs it as a non-root user with a read-only
# root filesystem; nothing here writes outside /tmp, which the chart mounts as an emptyDir.
# PYTHON_IMAGE: any Debian-based image with python3 and its venv module (hack/images/base.sh
# makes localhost/chattts-base:bookworm with mmdebstrap).
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_CERT=/etc/ssl/certs/ca-certificates.crt
WORKDIR /src
# One distribution holds both packages; only the operator's light dependencies are installed
# (the runtime's torch/vLLM stack is an optional extra and is imported lazily).
# Dependencies first, in their own layer, read from pyproject.toml alone: a code or README change
# reinstalls only the package itself.
COPY pyproject.toml ./
RUN python3 -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]))' \
      > requirements.txt \
 && python3 -m venv /opt/venv && /opt/venv/bin/pip install --quiet --requirement requirements.txt
COPY README.md ./
COPY operator/ operator/
COPY runtime/ runtime/
RUN /opt/venv/bin/pip install --quiet --no-deps .

FROM ${PYTHON_IMAGE}
ARG VERSION=0.1.0
ARG REVISION=unknown
LABEL org.opencontainers.image.title="chattts-operator" \
      org.opencontainers.image.description="Kubernetes operator for ChatTTS text-to-speech on shared GPUs" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}"
# HOME=/tmp: anything that writes under $HOME (kube config caches) lands in the /tmp mount.
ENV PATH=/opt/venv/bin:$PATH \
    HOME=/tmp \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
COPY --from=build /opt/venv /opt/venv
# 65532 is the conventional "nonroot" id; the chart's securityContext asserts runAsNonRoot.
USER 65532:65532
WORKDIR /tmp
# 8080: kopf liveness (/healthz); 9090: Prometheus metrics.
EXPOSE 8080 9090
ENTRYPOINT ["chattts-operator"]
