#!/usr/bin/env bash
# The checks that need a CUDA device, in one run (at most 10 minutes: the steps' time limits add up to 600 s): the gpu-marked tests, the serving benchmark
# on the full-size 0.6B random checkpoint in bfloat16 (eager, then torch.compile + CUDA graphs), idle
# unload on CUDA, Chatterbox Turbo's engine benchmark (full-size random checkpoint, bfloat16), and
# capacity under Poisson load (bench_load.py), and prompt-library throughput with 1 and 16 prompts in flight
# (target: 16 in flight >= 8x sequential). Logs and JSON go to $OUT (default bench-results/gpu).
# Step "slots" (not in the default seven; its own run) measures VOXCAST_BATCH_GRAPHS (issue 45 item 2):
# rows vs slots at 1/2/4/8/16 streams at the model level (bench_batch_frames.py), then the engine with
# --batch-graphs on (bench_serving.py).
#
#     bash scripts/gpu_check.sh            # on a machine with CUDA and voxcast's dependencies
#     STEPS="tests slots" TESTS_S=200 bash scripts/gpu_check.sh   # the batch_graphs checks (<= 600 s)
set -u
OUT=${OUT:-bench-results/gpu}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="src:.${PYTHONPATH:+:$PYTHONPATH}" VOXCAST_CALIBRATION_DIR=off
PY=${PY:-python3}
# The device machine has no registry and no ../shared: wheels voxcast needs beyond its image travel
# in .whl/ and the Qwen reference configs (random full-size checkpoints) in .gpu/ (see docs/benchmarks.md).
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
[ -d .gpu/qwen3-tts-reference ] && export VOXCAST_QWEN3_REFERENCE=${VOXCAST_QWEN3_REFERENCE:-$PWD/.gpu/qwen3-tts-reference}
STEPS=${STEPS:-tests eager unload compiled turbo load prerender}  # which to run (slots, turboprof: on request)
has() { [[ " $STEPS " == *" $1 "* ]]; }
nvidia-smi -L
$PY -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name())"
has tests && timeout "${TESTS_S:-100}" $PY -m pytest -q -p no:cacheprovider -m gpu \
    tests/engine/test_engine_cuda.py tests/engine/test_engine_idle_unload.py tests/model/qwen3_tts/accel/test_model_static_decode.py \
    tests/engine/test_engine_turbo_cuda.py tests/model/chatterbox_turbo/test_chatterbox_t3_static.py \
    tests/model/qwen3_tts/accel/test_model_batch_frames.py tests/engine/test_engine_batch_graphs.py \
    2>&1 | tee "$OUT/gpu-tests.log"
has eager && timeout "${EAGER_S:-80}" $PY scripts/bench_serving.py --size 0.6b --device cuda --dtype bfloat16 \
    --streams "${STREAMS:-1,4,16}" --frames 48 --reps 1 --decode-thread both --out "$OUT" 2>&1 | tee "$OUT/serving-eager.log"
has unload && timeout "${UNLOAD_S:-40}" $PY scripts/bench_unload.py --size 0.6b --device cuda --warmup --out "$OUT" \
    2>&1 | tail -40 | tee "$OUT/unload.log"
has compiled && timeout "${COMPILED_S:-120}" $PY scripts/bench_serving.py --size 0.6b --device cuda --dtype bfloat16 --compile on \
    --streams "${STREAMS:-1,4,16}" --frames 48 --reps 1 --decode-thread off --out "$OUT" 2>&1 | tee "$OUT/serving-compiled.log"
has turbo && timeout "${TURBO_S:-100}" $PY scripts/bench_chatterbox_turbo.py --size full --device cuda --dtype bfloat16 \
    --streams "${TURBO_STREAMS:-1,4}" --tokens 250 --static-decode "${TURBO_STATIC:-1}" \
    --out "$OUT/chatterbox-turbo-cuda-static${TURBO_STATIC:-1}.json" 2>&1 | tee "$OUT/turbo.log"
# Not in the default STEPS (their limits already add up to 600 s): Turbo's streamed S3Gen + HiFT under torch.profiler.
has turboprof && timeout "${TURBOPROF_S:-90}" $PY scripts/profile_turbo_stream.py --device cuda --dtype bfloat16 \
    --out "$OUT" 2>&1 | tail -25 | tee "$OUT/turbo-profile.log"
# Capacity (issue 45): open-loop Poisson load through the real HTTP server, 0.6B bfloat16 (LOAD_COMPILE=on: compiled).
has load && VOXCAST_COMPILE=${LOAD_COMPILE:-off} timeout "${LOAD_S:-100}" $PY scripts/bench_load.py --size 0.6b --device cuda --dtype bfloat16 \
    --rates "${LOAD_RATES:-5,10,20}" --duration "${LOAD_DURATION_S:-8}" --max-active "${LOAD_MAX_ACTIVE:-32}" --out "$OUT" 2>&1 | tee "$OUT/load.log"
has prerender && timeout "${PRERENDER_S:-60}" $PY scripts/bench_prerender_fanout.py --size 0.6b --device cuda \
    --dtype bfloat16 --workers 0 --in-flight 1,16 --prompts "${LIB_PROMPTS:-32}" --frames 36 --out "$OUT" \
    2>&1 | tee "$OUT/prerender-fanout.log"
has slots && timeout "${SLOTS_S:-150}" $PY scripts/bench_batch_frames.py --size 0.6b --device cuda --dtype bfloat16 \
    --streams "${SLOTS_STREAMS:-1,2,4,8,16}" --frames 48 --reps 2 --out "$OUT" 2>&1 | tee "$OUT/batch-frames.log"
has slots && timeout "${SLOTS_SERVING_S:-150}" $PY scripts/bench_serving.py --size 0.6b --device cuda --dtype bfloat16 \
    --batch-graphs on --streams "${STREAMS:-1,4,16}" --frames 48 --reps 1 --decode-thread off --out "$OUT" \
    2>&1 | tee "$OUT/serving-batch-graphs.log"
