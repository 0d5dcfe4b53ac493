# syntax=docker/dockerfile:1.7
#
# NegT2IBench generation image: `negt2i generate` (diffusers pipelines on one GPU) and its
# gRPC client, for the Indexed Job in k8s/jobs/generate. Build from the repository root:
# `make image-generate`.
#
# Its `python`, `requirements` and `torch` stages are byte-identical to services/Dockerfile's
# (tests/k8s/test_dockerfiles.py checks it), so the generate image shares the Python and torch
# layers with the stage images (torch 2.14.1's CUDA 13.0 wheels carry the CUDA runtime; the CUDA
# base image contributes the container-toolkit settings). Base images, Python and package mirrors: the same build
# arguments as services/Dockerfile (docs/deployment.md). No weights in the image: the Job
# reads a Hugging Face cache from the weights volume (HF_HOME) with HF_HUB_OFFLINE=1.

ARG UV_IMAGE=ghcr.io/astral-sh/uv:0.11.33
ARG CUDA_IMAGE=nvidia/cuda:13.0.1-base-ubuntu22.04

FROM ${UV_IMAGE} AS uv

# torch 2.14.1's PyPI wheels are the CUDA 13.0 build and carry the CUDA runtime and cuDNN
# (nvidia-*-cu13 wheels); the CUDA base image of the same CUDA release contributes the
# container-toolkit settings (NVIDIA_VISIBLE_DEVICES, and the NVIDIA_REQUIRE_CUDA check that
# refuses a driver older than CUDA 13.0 needs, R580) without a second copy of the libraries.
# ---- torch: identical in docker/generate.Dockerfile (shared layers) ----
FROM ${CUDA_IMAGE} AS python

ARG PYTHON_VERSION=3.11.14
ARG UV_PYTHON_INSTALL_MIRROR=""

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    UV_PYTHON_INSTALL_DIR=/opt/python \
    UV_PYTHON_PREFERENCE=only-managed \
    UV_LINK_MODE=copy \
    UV_COMPILE_BYTECODE=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# A pinned CPython (python-build-standalone: Ubuntu 22.04 ships 3.10) and the non-root user.
RUN --mount=from=uv,source=/uv,target=/usr/local/bin/uv \
    if [ -z "$UV_PYTHON_INSTALL_MIRROR" ]; then unset UV_PYTHON_INSTALL_MIRROR; fi \
    && uv python install "$PYTHON_VERSION" \
    && uv venv --python "$PYTHON_VERSION" /opt/venv \
    && groupadd --gid 10001 negt2i \
    && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /tmp --shell /usr/sbin/nologin negt2i \
    && rm -rf /tmp/* /root/.cache

WORKDIR /app

# What each image installs, derived from pyproject.toml in a stage of its own: only these lists
# reach the install layers, so an edit to pyproject.toml that changes none of them (a tool's
# settings, the version) rebuilds no dependency layer, the torch layer least of all.
FROM python AS requirements
COPY pyproject.toml docker/requirements.py /build/
RUN python /build/requirements.py --pyproject /build/pyproject.toml --only torch,torchvision models > /build/torch.txt \
    && python /build/requirements.py --pyproject /build/pyproject.toml models serving > /build/requirements.txt \
    && python /build/requirements.py --pyproject /build/pyproject.toml --without bentoml generate judges serving > /build/generate.txt

FROM python AS torch

ARG UV_DEFAULT_INDEX=""

# torch alone (pinned by pyproject.toml and requirements.lock): the largest layer.
COPY requirements.lock /build/
COPY --from=requirements /build/torch.txt /build/
RUN --mount=from=uv,source=/uv,target=/usr/local/bin/uv \
    --mount=type=cache,target=/root/.cache/uv \
    if [ -z "$UV_DEFAULT_INDEX" ]; then unset UV_DEFAULT_INDEX; fi \
    && uv pip install -c /build/requirements.lock -r /build/torch.txt \
    && rm -rf /tmp/*
# ---- end of the torch stage ----

FROM torch AS generate

ARG UV_DEFAULT_INDEX=""

# The generate extra (diffusers, accelerate, transformers), the judges extra (open_clip; the
# judges Job, k8s/jobs/judges, runs this image), the gRPC client (the serving
# extra without BentoML) and bitsandbytes (4-bit presets; a CUDA-only wheel), all pinned
# in requirements.lock (checked here).
COPY docker/requirements.py /build/
COPY --from=requirements /build/generate.txt /build/requirements.txt
RUN --mount=from=uv,source=/uv,target=/usr/local/bin/uv \
    --mount=type=cache,target=/root/.cache/uv \
    if [ -z "$UV_DEFAULT_INDEX" ]; then unset UV_DEFAULT_INDEX; fi \
    && uv pip install -c /build/requirements.lock -r /build/requirements.txt bitsandbytes \
    && python /build/requirements.py --check-pinned /build/requirements.lock \
    && rm -rf /tmp/*

COPY README.md pyproject.toml /src/
COPY negt2i /src/negt2i
RUN --mount=from=uv,source=/uv,target=/usr/local/bin/uv \
    uv pip install --no-deps --build-constraint /build/requirements.lock /src \
    && rm -rf /src /build /tmp/*
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
