#!/usr/bin/env bash
# The checks that need a CUDA device, in one run (minutes): the gpu-marked tests, the serving benchmark
# on the full-size 0.6B random checkpoint in bfloat16 (eager, then torch.compile + CUDA graphs), idle
# unload on CUDA, and Chatterbox Turbo's engine benchmark (full-size random checkpoint, bfloat16). Logs and JSON go to $OUT (default bench-results/gpu).
#
#     bash scripts/gpu_check.sh            # on a machine with CUDA and voxcast's dependencies
set -u
OUT=${OUT:-bench-results/gpu}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="src:.${PYTHONPATH:+:$PYTHONPATH}" VOXCAST_CALIBRATION_DIR=off
PY=${PY:-python3}
STEPS=${STEPS:-tests eager unload compiled turbo}  # which of the five to run
has() { [[ " $STEPS " == *" $1 "* ]]; }
nvidia-smi -L
$PY -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name())"
has tests && timeout "${TESTS_S:-200}" $PY -m pytest -q -p no:cacheprovider -m gpu \
    tests/engine/test_engine_cuda.py tests/engine/test_engine_idle_unload.py tests/model/qwen3_tts/accel/test_model_static_decode.py \
    tests/engine/test_engine_turbo_cuda.py \
    2>&1 | tee "$OUT/gpu-tests.log"
has eager && timeout "${EAGER_S:-150}" $PY scripts/bench_serving.py --size 0.6b --device cuda --dtype bfloat16 \
    --streams "${STREAMS:-1,4,16}" --frames 48 --reps 1 --decode-thread both --out "$OUT" 2>&1 | tee "$OUT/serving-eager.log"
has unload && timeout "${UNLOAD_S:-60}" $PY scripts/bench_unload.py --size 0.6b --device cuda --warmup --out "$OUT" \
    2>&1 | tail -40 | tee "$OUT/unload.log"
has compiled && timeout "${COMPILED_S:-200}" $PY scripts/bench_serving.py --size 0.6b --device cuda --dtype bfloat16 --compile on \
    --streams "${STREAMS:-1,4,16}" --frames 48 --reps 1 --decode-thread off --out "$OUT" 2>&1 | tee "$OUT/serving-compiled.log"
has turbo && timeout "${TURBO_S:-300}" $PY scripts/bench_chatterbox_turbo.py --size full --device cuda --dtype bfloat16 \
    --streams "${TURBO_STREAMS:-1,4}" --tokens 250 --out "$OUT/chatterbox-turbo-cuda.json" 2>&1 | tee "$OUT/turbo.log"
