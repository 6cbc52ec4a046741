#!/usr/bin/env bash
# Set up everything the tests need on a fresh machine, then run the whole suite.
# Usage: bash scripts/test.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v redis-server >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ]; then
        apt-get update -qq && apt-get install -y -qq redis-server >/dev/null
    else
        sudo apt-get update -qq && sudo apt-get install -y -qq redis-server >/dev/null
    fi
fi

# The livekit extra brings livekit-agents (pinned there) for the LiveKit TTS's tests.
python -m pip install -q --disable-pip-version-check torch==2.13.0 -e ".[serve,test,parity,pipecat,livekit,watermark]"
# The official packages, for the parity tests only (see the parity extra in pyproject.toml), and
# pipecat-ai for the Pipecat service's tests (see the pipecat extra).
python -m pip install -q --disable-pip-version-check --no-deps qwen-tts==0.1.1 chatterbox-tts==0.1.7 pipecat-ai==1.14.0 s3tokenizer==0.3.0 torchaudio==2.6.0 diffusers==0.29.0 conformer==0.3.2

# Two pytest processes (pytest-xdist): most tests wait on processes, sockets and model loads, so on
# 2 cores two at a time take ~0.57x the time of one at a time. Each uses one OpenMP thread (two
# teams of two on 2 cores spin against each other). VOXCAST_TEST_WORKERS=0 runs them in this process.
workers="${VOXCAST_TEST_WORKERS:-2}"
if [ "$workers" = 0 ]; then
    export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}"
    parallel=()
else
    export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
    parallel=(-n "$workers")
fi
ruff check src tests scripts handler.py worker.py server.py
ruff format --check src tests scripts handler.py worker.py server.py
python -m mypy
bash scripts/check_client_install.sh   # the client-only install, from a fresh venv (docs/queue.md)
python -m pytest "${parallel[@]}" "$@"
