# syntax=docker/dockerfile:1.7
#
# NegT2IBench generation image: `negt2i generate` (diffusers pipelines on one GPU) and its
# gRPC client, for the Indexed Job in k8s/jobs/generate. Build from the repository root:
# `make image-generate`.
#
# Same base as the stage images (torch 2.14.1's CUDA 13.0 wheels carry the CUDA runtime; the
# CUDA base image contributes the container-toolkit settings). No weights in the image: the
# Job reads a Hugging Face cache from the weights volume (HF_HOME) with HF_HUB_OFFLINE=1.

FROM ghcr.io/astral-sh/uv:0.11.12 AS uv

FROM nvidia/cuda:13.0.1-base-ubuntu22.04 AS generate

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    UV_PYTHON_INSTALL_DIR=/opt/python \
    UV_PYTHON_PREFERENCE=only-managed \
    UV_LINK_MODE=copy \
    UV_COMPILE_BYTECODE=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

RUN --mount=from=uv,source=/uv,target=/usr/local/bin/uv \
    uv python install 3.11.14 \
    && uv venv --python 3.11.14 /opt/venv \
    && groupadd --gid 10001 negt2i \
    && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /tmp --shell /usr/sbin/nologin negt2i

WORKDIR /app

# Dependency layers: torch first (pinned), then the generate extra (diffusers, accelerate,
# transformers) and the gRPC client (the serving extra without BentoML), from pyproject.toml
# and the tested constraints only. bitsandbytes (4-bit presets) is a CUDA-only wheel.
COPY pyproject.toml docker/requirements.py docker/constraints.txt /build/
RUN --mount=from=uv,source=/uv,target=/usr/local/bin/uv \
    --mount=type=cache,target=/root/.cache/uv \
    python /build/requirements.py --pyproject /build/pyproject.toml --only torch,torchvision models > /build/torch.txt \
    && python /build/requirements.py --pyproject /build/pyproject.toml --without bentoml generate serving > /build/requirements.txt \
    && uv pip install -c /build/constraints.txt -r /build/torch.txt \
    && uv pip install -c /build/constraints.txt -r /build/requirements.txt "bitsandbytes>=0.45"

COPY README.md pyproject.toml /src/
COPY negt2i /src/negt2i
RUN --mount=from=uv,source=/uv,target=/usr/local/bin/uv \
    uv pip install --no-deps /src \
    && rm -rf /src /build
COPY data/negt2ibench.jsonl data/negt2ibench.meta.json /app/data/

ENV HOME=/tmp \
    XDG_CACHE_HOME=/tmp/.cache \
    HF_HUB_OFFLINE=1

USER 10001:10001

ARG VERSION=0.1.0
ARG REVISION=unknown
LABEL org.opencontainers.image.title="negt2i-generate" \
      org.opencontainers.image.description="NegT2IBench generation runner: negt2i generate on one GPU, scoring through the orchestrator" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.source="https://github.com/Fatairy/NegT2IBench" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.vendor="NegT2IBench"
ENV NEGT2I_VERSION=${VERSION}
CMD ["negt2i", "generate", "--list-models"]
