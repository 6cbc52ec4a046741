#!/usr/bin/env bash
# The main job on embedded defaults: install voxcast, build a tiny random-weight Qwen3-TTS checkpoint
# (no weights can be downloaded here), and stream one sentence to demo.wav through the same service
# path the servers use (local storage under .cache/, timing printed as JSON).
# Usage: bash scripts/demo.sh ["text to speak"]     (set VOXCAST_MODEL to use a real checkpoint)
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install -q --disable-pip-version-check torch==2.13.0 -e ".[serve]"
export VOXCAST_STORAGE_DIR="${VOXCAST_STORAGE_DIR:-$PWD/.cache/store}"
model="${VOXCAST_MODEL:-}"
if [ -z "$model" ]; then
    model="$PWD/.cache/demo-model-ends"  # a tiny checkpoint whose speech ends by itself (--ends-speech)
    [ -f "$model/config.json" ] || voxcast make-test-model --kind custom_voice --size tiny --ends-speech --out "$model"
fi
voxcast synth "${1:-Hello from voxcast. This is streaming speech.}" --model "$model" --voice ryan \
    --seed 8 --out demo.wav
