#!/usr/bin/env bash
# The checks that need a CUDA device, in one run of at most 10 minutes (a lent device allows 15
# minutes in all, its start included). Steps run in the order STEPS names them, each under its own time
# limit, and write as they go: a run cut short still leaves the earlier steps' JSON. Default steps, most
# needed first (their limits add up to 600 s):
#   tests  the gpu-marked tests (CUDA graph replay = eager for Qwen's batched frames and Turbo's T3 step, ...)
#   slots  VOXCAST_BATCH_GRAPHS: rows vs slots at 1/2/4/8/16 streams at the model level
#          (bench_batch_frames.py: frames/s and the batching ratio)
#   load   capacity under open-loop Poisson load through the real HTTP server (bench_load.py), 0.6B
#          bfloat16 with batch graphs (LOAD_BATCH_GRAPHS=off: the rows path; LOAD_COMPILE=on: compiled);
#          its JSON has the server's cold start (spawn to ready) too
#   turbo  Chatterbox Turbo's engine benchmark (full-size random checkpoint, bfloat16; T3's static step
#          on unless TURBO_STATIC=0)
#   load17 the load step for 1.7B CustomVoice (the main capacity target; builds the 1.7B random checkpoint first)
# On request: slotserving (bench_serving.py with --batch-graphs on), eager, compiled (bench_serving
# without/with torch.compile: the earlier baselines; compiled warm-up alone took 91 s on an H200), unload
# (idle unload on CUDA), prerender (prompt-library throughput, 1 and 16 in flight), turboprof (Turbo's
# streamed S3Gen + HiFT under torch.profiler), turbobatch (Turbo's flow windows of 4 and 8 streams, one
# by one vs batched), turboload (Turbo under the load benchmark at 12 streams), tts_bench
# (nari-labs' open serving benchmark, unmodified, against voxcast serve as its published reports ran it:
# 1.7B CustomVoice, voice Ryan, English, 30 s warm-up, Poisson arrivals at 1/4/8/10/12/16/20 rps, each
# measured TB_DURATION (30s: ~8 minutes; the reports measured 300s), target vllm-omni over HTTP
# (TB_TARGETS="nari-ws" in another call: the WebSocket, one word every 10 ms); TB_CHECKPOINT names real
# weights, without them random ones with each reply capped at 50 frames (load figures only); its tree and
# wheels come from scripts/gpu_prepare.sh run with TTS_BENCH_DIR; docs/benchmarks.md says more).
# Logs and JSON go to $OUT (default bench-results/gpu): copy them to docs/results/<gpu>/.
# The device machine has no registry and no ../shared: wheels voxcast needs beyond its image travel in
# .whl/ and the Qwen reference configs in .gpu/qwen3-tts-reference: scripts/gpu_prepare.sh puts them there.
# DEVICE, DTYPE, QWEN_SIZE, QWEN_LARGE and TURBO_SIZE (cuda, bfloat16, 0.6b, 1.7b, full) exist for a dry
# run of every step on a CPU before a device session:
#
#     bash scripts/gpu_check.sh            # on a machine with CUDA and voxcast's dependencies
#     STEPS="tests turbo" TURBO_STATIC=0 bash scripts/gpu_check.sh
#     DEVICE=cpu DTYPE=float32 QWEN_SIZE=tiny QWEN_LARGE=tiny TURBO_SIZE=tiny LOAD_DURATION_S=2 \
#         STEPS="slots load load17 turbo turboload" bash scripts/gpu_check.sh   # the dry run
#     DEVICE=cpu DTYPE=float32 QWEN_LARGE=tiny TB_RATES=1 TB_WARMUP=2s TB_DURATION=5s TTS_BENCH_DIR=... \
#         TB_PYTHON=... STEPS=tts_bench bash scripts/gpu_check.sh              # its dry run (Python >= 3.12)
set -u
OUT=${OUT:-bench-results/gpu}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="src:.${PYTHONPATH:+:$PYTHONPATH}" VOXCAST_CALIBRATION_DIR=off
PY=${PY:-python3}
DEVICE=${DEVICE:-cuda}
DTYPE=${DTYPE:-bfloat16}
QWEN_SIZE=${QWEN_SIZE:-0.6b}
QWEN_LARGE=${QWEN_LARGE:-1.7b}
TURBO_SIZE=${TURBO_SIZE:-full}
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
[ -d .gpu/qwen3-tts-reference ] && export VOXCAST_QWEN3_REFERENCE=${VOXCAST_QWEN3_REFERENCE:-$PWD/.gpu/qwen3-tts-reference}
STEPS=${STEPS:-tests slots load turbo load17}
QWEN=(--device "$DEVICE" --dtype "$DTYPE")

step_tests() {
    timeout "${TESTS_S:-150}" $PY -m pytest -q -p no:cacheprovider -m gpu \
        tests/engine/test_engine_cuda.py tests/engine/test_engine_idle_unload.py \
        tests/model/qwen3_tts/accel/test_model_static_decode.py tests/engine/test_engine_turbo_cuda.py \
        tests/model/chatterbox_turbo/test_chatterbox_t3_static.py tests/model/qwen3_tts/accel/test_model_batch_frames.py \
        tests/engine/test_engine_batch_graphs.py 2>&1 | tee "$OUT/gpu-tests.log"
}
step_slots() {
    timeout "${SLOTS_S:-120}" $PY scripts/bench_batch_frames.py --size "$QWEN_SIZE" "${QWEN[@]}" \
        --streams "${SLOTS_STREAMS:-1,2,4,8,16}" --frames 48 --reps 2 --out "$OUT" 2>&1 | tee "$OUT/batch-frames.log"
}
step_slotserving() {
    timeout "${SLOTS_SERVING_S:-100}" $PY scripts/bench_serving.py --size "$QWEN_SIZE" "${QWEN[@]}" \
        --batch-graphs on --streams "${STREAMS:-1,4,16}" --frames 48 --reps 1 --decode-thread off --out "$OUT" \
        2>&1 | tee "$OUT/serving-batch-graphs.log"
}
load_of() {  # size, rates, time limit, log name: capacity through the real HTTP server
    VOXCAST_COMPILE=${LOAD_COMPILE:-off} VOXCAST_BATCH_GRAPHS=${LOAD_BATCH_GRAPHS:-on} timeout "$3" \
        $PY scripts/bench_load.py --size "$1" --kind custom_voice "${QWEN[@]}" --rates "$2" \
        --duration "${LOAD_DURATION_S:-8}" --max-active "${LOAD_MAX_ACTIVE:-32}" --out "$OUT" 2>&1 | tee "$OUT/$4.log"
}
step_load() { load_of "$QWEN_SIZE" "${LOAD_RATES:-5,15,30}" "${LOAD_S:-100}" load; }
step_load17() { load_of "$QWEN_LARGE" "${LOAD17_RATES:-10,20}" "${LOAD17_S:-130}" load-large; }
step_turbo() {
    timeout "${TURBO_S:-100}" $PY scripts/bench_chatterbox_turbo.py --size "$TURBO_SIZE" --device "$DEVICE" \
        --dtype "$DTYPE" --streams "${TURBO_STREAMS:-1,4}" --tokens 250 --static-decode "${TURBO_STATIC:-1}" \
        --out "$OUT/chatterbox-turbo-$DEVICE-static${TURBO_STATIC:-1}.json" 2>&1 | tee "$OUT/turbo.log"
}
step_turboload() {
    timeout "${TURBOLOAD_S:-120}" $PY scripts/bench_load.py --family chatterbox_turbo --size "$TURBO_SIZE" \
        "${QWEN[@]}" --rates "${TURBOLOAD_RATES:-1,2}" --duration "${LOAD_DURATION_S:-8}" \
        --max-active "${LOAD_MAX_ACTIVE:-32}" --ttfa-ms 300 --out "$OUT" 2>&1 | tee "$OUT/turbo-load.log"
}
step_turboprof() {
    timeout "${TURBOPROF_S:-90}" $PY scripts/profile_turbo_stream.py --size "$TURBO_SIZE" --device "$DEVICE" \
        --dtype "$DTYPE" --out "$OUT" 2>&1 | tail -25 | tee "$OUT/turbo-profile.log"
}
step_turbobatch() {
    for n in ${TURBOBATCH_STREAMS:-4 8}; do
        timeout "${TURBOBATCH_S:-60}" $PY scripts/bench_turbo_batch_windows.py --size "$TURBO_SIZE" \
            --device "$DEVICE" --dtype "$DTYPE" --streams "$n" --out "$OUT/turbo-batch-windows-$n.json" 2>&1 \
            | tail -5 | tee -a "$OUT/turbo-batch-windows.log"
    done
}
step_tts_bench() {
    local dir=${TTS_BENCH_DIR:-.gpu/nari-benchmarks} model=${TB_CHECKPOINT:-} params=${TB_PARAMS-}
    if [ ! -d "$dir/tts_bench/src" ]; then
        echo "tts_bench: skipped: no benchmark tree (TTS_BENCH_DIR, or .gpu/nari-benchmarks from gpu_prepare.sh)"
        return 0
    fi
    if [ -d .whl/tts_bench ] && ls .whl/tts_bench/*.whl >/dev/null 2>&1; then
        $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/tb-site \
            .whl/tts_bench/*.whl && local site=/tmp/tb-site  # the harness's path only (its numpy)
    fi
    if [ -z "$model" ]; then  # no real weights here: random ones, each reply capped at 50 frames (4 s)
        model=.cache/bench-models/$QWEN_LARGE-custom_voice  # the checkpoint the load17 step builds
        [ -f "$model/config.json" ] || $PY -m voxcast.serving.cli.main make-test-model --kind custom_voice \
            --size "$QWEN_LARGE" --out "$model"
        params=${TB_PARAMS-max_frames=50}
    fi
    local dataset=${TB_DATASET:-}
    [ -z "$dataset" ] && [ -f "$dir/tts_bench/datasets/seed-tts-eval.jsonl" ] && dataset=$dir/tts_bench/datasets/seed-tts-eval.jsonl
    TB_PYTHONPATH=${site:-} TTS_BENCH_DIR=$dir TB_PYTHON=${TB_PYTHON:-$PY} VOXCAST_CMD="$PY -m voxcast.serving.cli.main" \
        VOXCAST_MODEL=$model VOXCAST_DEVICE=$DEVICE VOXCAST_DTYPE=$DTYPE \
        TB_MODEL_NAME=${TB_MODEL_NAME:-Qwen/Qwen3-TTS-12Hz-1.7B-CustomVoice} TB_PARAMS=$params TB_DATASET=$dataset \
        TB_TARGETS=${TB_TARGETS:-vllm-omni} TB_RATES=${TB_RATES:-1 4 8 10 12 16 20} \
        TB_WARMUP=${TB_WARMUP:-30s} TB_DURATION=${TB_DURATION:-30s} TB_OUT=$OUT/tts_bench TB_RESULTS=$OUT/tts_bench-results \
        timeout "${TTS_BENCH_S:-580}" bash scripts/run_tts_bench.sh 2>&1 | tee "$OUT/tts_bench.log"
}
step_eager() {
    timeout "${EAGER_S:-80}" $PY scripts/bench_serving.py --size "$QWEN_SIZE" "${QWEN[@]}" \
        --streams "${STREAMS:-1,4,16}" --frames 48 --reps 1 --decode-thread both --out "$OUT" 2>&1 \
        | tee "$OUT/serving-eager.log"
}
step_compiled() {
    timeout "${COMPILED_S:-120}" $PY scripts/bench_serving.py --size "$QWEN_SIZE" "${QWEN[@]}" --compile on \
        --streams "${STREAMS:-1,4,16}" --frames 48 --reps 1 --decode-thread off --out "$OUT" 2>&1 \
        | tee "$OUT/serving-compiled.log"
}
step_unload() {
    timeout "${UNLOAD_S:-40}" $PY scripts/bench_unload.py --size "$QWEN_SIZE" --device "$DEVICE" --warmup \
        --out "$OUT" 2>&1 | tail -40 | tee "$OUT/unload.log"
}
step_prerender() {
    timeout "${PRERENDER_S:-60}" $PY scripts/bench_prerender_fanout.py --size "$QWEN_SIZE" "${QWEN[@]}" \
        --workers 0 --in-flight 1,16 --prompts "${LIB_PROMPTS:-32}" --frames 36 --out "$OUT" 2>&1 \
        | tee "$OUT/prerender-fanout.log"
}

for s in $STEPS; do
    if ! declare -F "step_$s" >/dev/null; then
        echo "gpu_check: no step '$s' (see the header)" >&2
        exit 2
    fi
done
if [ "$DEVICE" = cuda ]; then nvidia-smi -L; fi
$PY -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__,
      torch.cuda.get_device_name() if torch.cuda.is_available() else 'no CUDA device')"
for s in $STEPS; do
    echo "== gpu_check: $s ($(date +%T))"
    "step_$s"
done
echo "== gpu_check: done ($(date +%T))"
