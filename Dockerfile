# syntax=docker/dockerfile:1
# voxcast RunPod serverless worker: CUDA runtime, CUDA build of torch, Qwen3-TTS weights baked in.
#
#   docker build -t voxcast-runpod \
#     --build-arg MODEL_ID=Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice .
#
# Build args (keep CUDA_VERSION and TORCH_CUDA in step: the torch wheel index must match the base image's
# CUDA major.minor or be older, and the host driver must support it):
#   MODEL_ID        Hugging Face repo of the checkpoint (with its speech_tokenizer/), baked into /models/model
#   MODEL_REVISION  branch, tag or commit of MODEL_ID (pin a commit for reproducible images)
#   CUDA_VERSION    nvidia/cuda runtime image tag prefix
#   TORCH_CUDA      PyTorch wheel index flavour (cu126, cu128, ...)
# A gated or private MODEL_ID needs a token at build time only:
#   docker build --secret id=hf_token,env=HF_TOKEN ...
# At run time the container is offline for the hub (HF_HUB_OFFLINE=1) and loads /models/model.

ARG CUDA_VERSION=12.8.1
ARG UBUNTU_VERSION=22.04

# ---------------------------------------------------------------- base: CUDA runtime + Python 3.11
FROM nvidia/cuda:${CUDA_VERSION}-cudnn-runtime-ubuntu${UBUNTU_VERSION} AS base
ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# libsndfile comes inside the soundfile wheel; ca-certificates for S3/HTTPS at run time.
# Distro packages follow the pinned base image tag (their versions are not pinned one by one).
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3.11 python3.11-venv ca-certificates \
    && rm -rf /var/lib/apt/lists/*

# ---------------------------------------------------------------- build: venv with CUDA torch + voxcast
FROM base AS build
ARG TORCH_VERSION=2.13.0
ARG TORCH_CUDA=cu128
RUN python3.11 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
# torch first, from the PyTorch CUDA index only (2.13.0+cuXXX satisfies voxcast's torch==2.13.0 pin)
RUN pip install --index-url "https://download.pytorch.org/whl/${TORCH_CUDA}" "torch==${TORCH_VERSION}"
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src
# voxcast's own dependencies are pinned/bounded in pyproject.toml
# hadolint ignore=DL3013
RUN pip install ".[serve,watermark]" \
    && python -c "import torch, voxcast, runpod; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
# voxcast's C++ CPU kernels, compiled here once (~30 s) instead of at every cold start; the runtime
# stage loads the built library and needs no compiler. The kernels pick AVX-512 VNNI or AVX2 at run
# time, so the build machine's CPU does not matter.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends g++ python3.11-dev \
    && rm -rf /var/lib/apt/lists/* \
    && VOXCAST_KERNEL_DIR=/opt/voxcast-kernels voxcast build-kernels

# ---------------------------------------------------------------- weights: snapshot of MODEL_ID
FROM build AS weights
ARG MODEL_ID=Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice
ARG MODEL_REVISION=main
RUN --mount=type=secret,id=hf_token,required=false \
    HF_TOKEN="$(cat /run/secrets/hf_token 2>/dev/null || true)" \
    python -c "import os, sys; from huggingface_hub import snapshot_download; snapshot_download(repo_id=sys.argv[1], revision=sys.argv[2], local_dir='/models/model', token=os.environ.get('HF_TOKEN') or None)" \
        "${MODEL_ID}" "${MODEL_REVISION}" \
    && rm -rf /models/model/.cache \
    && test -f /models/model/config.json \
    && test -f /models/model/speech_tokenizer/config.json

# ---------------------------------------------------------------- runtime
FROM base AS runtime
ARG MODEL_ID=Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice
LABEL org.opencontainers.image.title="voxcast-runpod" \
      org.opencontainers.image.description="Streaming Qwen3-TTS on RunPod serverless" \
      org.opencontainers.image.licenses="Apache-2.0" \
      ai.voxcast.model-id="${MODEL_ID}"
RUN groupadd --system --gid 10001 voxcast \
    && useradd --system --uid 10001 --gid voxcast --home-dir /app --shell /usr/sbin/nologin voxcast
COPY --from=build /opt/venv /opt/venv
COPY --from=build /opt/voxcast-kernels /opt/voxcast-kernels
COPY --from=weights --chown=root:root /models/model /models/model
WORKDIR /app
COPY --chown=root:root handler.py ./
RUN mkdir -p /data/store && chown voxcast:voxcast /data/store
ENV PATH=/opt/venv/bin:$PATH \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 \
    HF_HOME=/tmp/hf \
    VOXCAST_MODEL=/models/model \
    VOXCAST_DEVICE=auto \
    VOXCAST_STORAGE_DIR=/data/store \
    VOXCAST_KERNEL_DIR=/opt/voxcast-kernels \
    VOXCAST_LOG_LEVEL=INFO \
    RUNPOD_LOG_LEVEL=INFO
USER 10001:10001
# handler.py loads and warms the engine before taking jobs; a failed load exits non-zero
CMD ["python", "-u", "handler.py"]
