#!/usr/bin/env bash
# The checks that need a CUDA device, in one run of at most 10 minutes (the default steps' time limits add up
# to 600 s; a lent device gives a session 15 minutes in all, its start included). Default steps, most
# needed first:
#   tests  the gpu-marked tests (CUDA graph replay = eager for Qwen's batched frames and Turbo's T3 step, ...)
#   slots  VOXCAST_BATCH_GRAPHS (issue 45 item 2): rows vs slots at 1/2/4/8/16 streams at the model level
#          (bench_batch_frames.py), then the engine with --batch-graphs on (bench_serving.py)
#   turbo  Chatterbox Turbo's engine benchmark (full-size random checkpoint, bfloat16; T3's static step
#          on unless TURBO_STATIC=0)
#   load   capacity under open-loop Poisson load through the real HTTP server (bench_load.py), 0.6B
#          bfloat16 with batch graphs (LOAD_BATCH_GRAPHS=off: the rows path; LOAD_COMPILE=on: compiled)
# On request (STEPS="..."): eager, compiled (bench_serving without/with torch.compile: the earlier
# baselines; compiled warm-up alone took 91 s on an H200), unload (idle unload on CUDA), prerender
# (prompt-library throughput, 1 and 16 in flight), turboprof (Turbo's streamed S3Gen + HiFT under
# torch.profiler), turbobatch (Turbo's flow windows of 4 and 8 streams,
# one by one vs batched). Logs and JSON go to $OUT (default bench-results/gpu): copy them to docs/results/<gpu>/.
# The device machine has no registry and no ../shared: wheels voxcast needs beyond its image travel in
# .whl/ and the Qwen reference configs in .gpu/qwen3-tts-reference: scripts/gpu_prepare.sh puts them there.
#
#     bash scripts/gpu_check.sh            # on a machine with CUDA and voxcast's dependencies
#     STEPS="tests turbo" TURBO_STATIC=0 bash scripts/gpu_check.sh
set -u
OUT=${OUT:-bench-results/gpu}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="src:.${PYTHONPATH:+:$PYTHONPATH}" VOXCAST_CALIBRATION_DIR=off
PY=${PY:-python3}
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
[ -d .gpu/qwen3-tts-reference ] && export VOXCAST_QWEN3_REFERENCE=${VOXCAST_QWEN3_REFERENCE:-$PWD/.gpu/qwen3-tts-reference}
STEPS=${STEPS:-tests slots turbo load}  # eager compiled unload prerender turboprof: on request
has() { [[ " $STEPS " == *" $1 "* ]]; }
nvidia-smi -L
$PY -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name())"
has tests && timeout "${TESTS_S:-150}" $PY -m pytest -q -p no:cacheprovider -m gpu \
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
has turbobatch && for n in ${TURBOBATCH_STREAMS:-4 8}; do timeout "${TURBOBATCH_S:-60}" $PY scripts/bench_turbo_batch_windows.py \
    --size full --device cuda --dtype bfloat16 --streams "$n" --out "$OUT/turbo-batch-windows-$n.json" 2>&1 | tail -5 \
    | tee -a "$OUT/turbo-batch-windows.log"; done
# Capacity (issue 45): open-loop Poisson load through the real HTTP server, 0.6B bfloat16 (LOAD_COMPILE=on: compiled).
has load && VOXCAST_COMPILE=${LOAD_COMPILE:-off} VOXCAST_BATCH_GRAPHS=${LOAD_BATCH_GRAPHS:-on} timeout "${LOAD_S:-100}" $PY scripts/bench_load.py --size 0.6b --device cuda --dtype bfloat16 \
    --rates "${LOAD_RATES:-5,10,20}" --duration "${LOAD_DURATION_S:-8}" --max-active "${LOAD_MAX_ACTIVE:-32}" --out "$OUT" 2>&1 | tee "$OUT/load.log"
has prerender && timeout "${PRERENDER_S:-60}" $PY scripts/bench_prerender_fanout.py --size 0.6b --device cuda \
    --dtype bfloat16 --workers 0 --in-flight 1,16 --prompts "${LIB_PROMPTS:-32}" --frames 36 --out "$OUT" \
    2>&1 | tee "$OUT/prerender-fanout.log"
has slots && timeout "${SLOTS_S:-150}" $PY scripts/bench_batch_frames.py --size 0.6b --device cuda --dtype bfloat16 \
    --streams "${SLOTS_STREAMS:-1,2,4,8,16}" --frames 48 --reps 2 --out "$OUT" 2>&1 | tee "$OUT/batch-frames.log"
has slots && timeout "${SLOTS_SERVING_S:-100}" $PY scripts/bench_serving.py --size 0.6b --device cuda --dtype bfloat16 \
    --batch-graphs on --streams "${STREAMS:-1,4,16}" --frames 48 --reps 1 --decode-thread off --out "$OUT" \
    2>&1 | tee "$OUT/serving-batch-graphs.log"
