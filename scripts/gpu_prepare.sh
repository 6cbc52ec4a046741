#!/usr/bin/env bash
# Prepare this checkout for scripts/gpu_check.sh on a device machine that has PyTorch but no package
# registry and no ../shared (the lent H100/H200 machines: Python 3.12, torch 2.11, transformers 5.17):
# downloads the wheels voxcast imports beyond that image into .whl/ (~5 MB) and copies the Qwen
# reference configs (random full-size checkpoints need them) into .gpu/; both are git-ignored
# through .git/info/exclude, so they travel only when the device call carries them:
#
#     bash scripts/gpu_prepare.sh          # here, once (TTS_BENCH_DIR=<benchmark checkout> for its step)
#     (device) bash scripts/gpu_check.sh   # carrying .whl and .gpu
set -euo pipefail
cd "$(dirname "$0")/.."
exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
for p in /.whl/ /.gpu/; do grep -qxF "$p" "$exclude" 2>/dev/null || echo "$p" >>"$exclude"; done
# Versions as pinned by a working install here (pip list); no dependencies resolved: each one is named.
python3 -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
    fastapi==0.165.0 starlette==1.10.0 pydantic==2.13.4 pydantic_core==2.46.4 annotated-types==0.7.0 \
    typing-inspection==0.4.2 typing_extensions==4.16.0 opentelemetry-api==1.45.2 uvicorn==0.54.0 \
    python-multipart==0.0.34 soundfile==0.14.0 cffi==2.0.0 pycparser==3.0 soxr==1.1.0 pyloudnorm==0.2.0 \
    lameenc==1.9.0
ref=${VOXCAST_QWEN3_REFERENCE:-../shared/qwen3-tts-reference}
mkdir -p .gpu && rm -rf .gpu/qwen3-tts-reference && cp -r "$ref" .gpu/qwen3-tts-reference
# With TTS_BENCH_DIR (a checkout of nari-labs/benchmarks): a clean clone of it for gpu_check.sh's
# tts_bench step (its run.json records the clone's revision) and the wheels it needs beyond the image,
# at its uv.lock's versions (~25 MB, numpy included: gpu_check.sh puts them on the harness's path only)
if [ -n "${TTS_BENCH_DIR:-}" ]; then
    rm -rf .gpu/nari-benchmarks && git clone -q "$TTS_BENCH_DIR" .gpu/nari-benchmarks
    pins=$(python3 - "$TTS_BENCH_DIR/tts_bench/uv.lock" <<'EOF'
import sys, tomllib
need = {"aiohttp", "aiohappyeyeballs", "aiosignal", "attrs", "frozenlist", "multidict", "propcache", "yarl",
        "idna", "click", "jiwer", "rapidfuzz", "numpy", "whisper-normalizer", "regex", "more-itertools",
        "indic-numtowords"}
packages = tomllib.load(open(sys.argv[1], "rb"))["package"]
print(" ".join(f"{p['name']}=={p['version']}" for p in packages if p["name"] in need))
EOF
)
    rm -rf .whl/tts_bench
    # shellcheck disable=SC2086  # one argument per pin
    python3 -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl/tts_bench $pins
fi
du -sh .whl .gpu
