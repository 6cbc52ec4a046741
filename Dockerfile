# syntax=docker/dockerfile:1
# voxcast RunPod serverless worker: Python 3.11 slim, CUDA build of torch, the model's weights baked in.
#
#   docker build -t voxcast-runpod \
#     --build-arg MODEL_ID=Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice .
#
# Build args:
#   MODEL_ID        Hugging Face repo of the checkpoint, baked into /models/model: a Qwen3-TTS repo (with its
#                   speech_tokenizer/) or ResembleAI/chatterbox-turbo (t3_turbo_v1.safetensors, no config.json)
#   MODEL_REVISION  branch, tag or commit of MODEL_ID (pin a commit for reproducible images)
#   TORCH_CUDA      PyTorch wheel index flavour (cu126, cu128, ...); the host driver must support it
#   BAKE_INT8       1: quantize the checkpoint to int8 at build time (for CPU workers, VOXCAST_QUANT=int8)
# A gated or private MODEL_ID needs a token at build time only:
#   docker build --secret id=hf_token,env=HF_TOKEN ...
# At run time the container is offline for the hub (HF_HUB_OFFLINE=1) and loads /models/model.
#
# No CUDA base image: the torch wheel from the PyTorch CUDA index brings its CUDA runtime, cuBLAS,
# cuDNN, NCCL... as nvidia-* wheels, and the NVIDIA container toolkit mounts the host's driver
# (NVIDIA_VISIBLE_DEVICES / NVIDIA_DRIVER_CAPABILITIES below), so an nvidia/cuda base only held a
# second copy of those libraries. Stage order: the weights stage does not start from the source, so a
# source change rebuilds the venv but never downloads the weights again.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# ---------------------------------------------------------------- weights: snapshot of MODEL_ID
# Only huggingface_hub: this stage's cache key is the base image and the build args, never the source.
FROM ${PYTHON_IMAGE} AS weights
ARG HF_HUB_VERSION=0.36.2
ARG MODEL_ID=Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice
ARG MODEL_REVISION=main
RUN pip install --no-cache-dir "huggingface_hub==${HF_HUB_VERSION}"
# The layout voxcast's registry accepts: Chatterbox Turbo's files (it ships no config.json), else a
# Qwen3-TTS checkpoint with its speech tokenizer.
RUN --mount=type=secret,id=hf_token,required=false \
    HF_TOKEN="$(cat /run/secrets/hf_token 2>/dev/null || true)" \
    python -c "import os, sys; from huggingface_hub import snapshot_download; snapshot_download(repo_id=sys.argv[1], revision=sys.argv[2], local_dir='/models/model', token=os.environ.get('HF_TOKEN') or None)" \
        "${MODEL_ID}" "${MODEL_REVISION}" \
    && rm -rf /models/model/.cache \
    && if [ -f /models/model/t3_turbo_v1.safetensors ]; then \
           test -f /models/model/s3gen_meanflow.safetensors && test -f /models/model/ve.safetensors; \
       else \
           test -f /models/model/config.json && test -f /models/model/speech_tokenizer/config.json; \
       fi

# ---------------------------------------------------------------- build: venv with CUDA torch + voxcast
FROM ${PYTHON_IMAGE} AS build
ARG TORCH_VERSION=2.13.0
ARG TORCH_CUDA=cu128
ENV PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# g++ for voxcast's C++ CPU kernels (below); the runtime stage needs no compiler.
# Distro packages follow the pinned base image tag (their versions are not pinned one by one).
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends g++ \
    && rm -rf /var/lib/apt/lists/*
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
# torch first, from the PyTorch CUDA index only (2.13.0+cuXXX satisfies voxcast's torch==2.13.0 pin);
# its nvidia-* dependencies are the CUDA libraries the image needs
RUN pip install --index-url "https://download.pytorch.org/whl/${TORCH_CUDA}" "torch==${TORCH_VERSION}"
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src
# voxcast's own dependencies are pinned/bounded in pyproject.toml
# hadolint ignore=DL3013
RUN pip install ".[serve,watermark]" \
    && python -c "import torch, voxcast, runpod; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
# The kernels, compiled here once (~30 s) instead of at every cold start. They pick AVX-512 VNNI or
# AVX2 at run time, so the build machine's CPU does not matter.
RUN VOXCAST_KERNEL_DIR=/opt/voxcast-kernels voxcast build-kernels

# ---------------------------------------------------------------- caches: what start-up would compute
# Baked only where the result holds on any machine: the int8 weights (keyed by the checkpoint, torch's
# version and the store's format; BAKE_INT8=1). Not baked: the decode-thread calibration (keyed by the
# CPU model and count, which the build machine does not share with a worker) and torch.compile /
# CUDA graph caches (keyed by the GPU, absent here). Those are written at run time into
# /var/cache/voxcast, which the runtime user owns: point it at a network volume to share them.
FROM build AS caches
ARG BAKE_INT8=0
COPY --from=weights /models/model /models/model
RUN mkdir -p /opt/voxcast-cache/int8 /opt/voxcast-cache/calibration /opt/voxcast-cache/inductor \
    && if [ "${BAKE_INT8}" = "1" ]; then \
           HF_HUB_OFFLINE=1 VOXCAST_MODEL=/models/model VOXCAST_DEVICE=cpu VOXCAST_QUANT=int8 VOXCAST_WARMUP=0 \
           VOXCAST_INT8_CACHE_DIR=/opt/voxcast-cache/int8 VOXCAST_KERNEL_DIR=/opt/voxcast-kernels \
           python -c "import os, voxcast; voxcast.Engine.load(voxcast.EngineConfig.from_env(os.environ)).close()"; \
       fi

# ---------------------------------------------------------------- runtime
FROM ${PYTHON_IMAGE} AS runtime
ARG MODEL_ID=Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice
LABEL org.opencontainers.image.title="voxcast-runpod" \
      org.opencontainers.image.description="Streaming text-to-speech on RunPod serverless" \
      org.opencontainers.image.licenses="Apache-2.0" \
      ai.voxcast.model-id="${MODEL_ID}"
# The runtime user gets a home of its own; /app (the code) stays root-owned and read-only to it.
RUN groupadd --system --gid 10001 voxcast \
    && useradd --system --uid 10001 --gid voxcast --create-home --home-dir /home/voxcast \
        --shell /usr/sbin/nologin voxcast
COPY --from=build /opt/venv /opt/venv
COPY --from=build /opt/voxcast-kernels /opt/voxcast-kernels
COPY --from=weights --chown=root:root /models/model /models/model
COPY --from=caches --chown=voxcast:voxcast /opt/voxcast-cache /var/cache/voxcast
WORKDIR /app
COPY --chown=root:root handler.py ./
RUN mkdir -p /data/store && chown voxcast:voxcast /data/store
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    HOME=/home/voxcast \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 \
    HF_HOME=/tmp/hf \
    VOXCAST_MODEL=/models/model \
    VOXCAST_DEVICE=auto \
    VOXCAST_STORAGE_DIR=/data/store \
    VOXCAST_KERNEL_DIR=/opt/voxcast-kernels \
    VOXCAST_CALIBRATION_DIR=/var/cache/voxcast/calibration \
    VOXCAST_INT8_CACHE_DIR=/var/cache/voxcast/int8 \
    TORCHINDUCTOR_CACHE_DIR=/var/cache/voxcast/inductor \
    VOXCAST_LOG_LEVEL=INFO \
    RUNPOD_LOG_LEVEL=INFO
USER 10001:10001
# handler.py loads and warms the engine before taking jobs; a failed load exits non-zero
CMD ["python", "-u", "handler.py"]
